// qkv::cuda against fake drivers (tests/unit/runtime/fake_cuda/fake_cuda.c, one library per
// behaviour) and, where present, the toolkit's stub libcuda and the machine's real driver.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <qkv/runtime/cuda.hpp>

#include "fake_cuda/fake_cuda.h"

namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
namespace cuda = qkv::cuda;

/// The NoGpu message of loading `path` (fails the test if it loads).
std::string no_gpu_message(const std::string& path) {
  try {
    (void)cuda::Driver::load(path);
  } catch (const cuda::NoGpu& e) {
    EXPECT_THAT(e.what(), StartsWith("no CUDA driver/GPU found: "));
    EXPECT_EQ(std::string(e.what()), std::string(cuda::no_gpu_prefix) + e.reason());
    return e.what();
  }
  ADD_FAILURE() << path << " loaded";
  return {};
}

/// The working fake's counters (the same library instance the driver loaded).
fake_cuda_state& fake() {
  void* lib = dlopen(QKV_FAKE_CUDA_WORKING, RTLD_NOW | RTLD_LOCAL);
  if (!lib) throw std::runtime_error(dlerror());
  return *static_cast<fake_cuda_state*>(dlsym(lib, "fake_cuda_state"));
}

std::shared_ptr<const cuda::Driver> working() { return cuda::Driver::load(QKV_FAKE_CUDA_WORKING); }

TEST(CudaDriver, MissingLibraryIsNoGpuWithTheDlopenError) {
  const std::string m = no_gpu_message("/nonexistent/dir/libcuda.so.1");
  EXPECT_THAT(m, HasSubstr("/nonexistent/dir/libcuda.so.1"));
  EXPECT_THAT(m, HasSubstr("cannot open shared object file"));  // dlerror's text
  EXPECT_THAT(m, HasSubstr("QKV_LIBCUDA"));
}

TEST(CudaDriver, StubLibraryIsNoGpu) {
  const std::string m = no_gpu_message(QKV_FAKE_CUDA_STUB);
  EXPECT_THAT(m, HasSubstr("the CUDA stub library was loaded (libcuda.so.1 from the toolkit, not a real driver)"));
  EXPECT_THAT(m, HasSubstr(QKV_FAKE_CUDA_STUB));
}

TEST(CudaDriver, TheToolkitsStubLibraryIsNoGpu) {
  const std::string stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (!std::filesystem::exists(stub)) GTEST_SKIP() << "no CUDA toolkit stub at " << stub;
  EXPECT_THAT(no_gpu_message(stub), HasSubstr("the CUDA stub library was loaded"));
}

TEST(CudaDriver, CuInitErrorIsNoGpuWithTheDriversNames) {
  EXPECT_THAT(no_gpu_message(QKV_FAKE_CUDA_NO_DEVICE),
              HasSubstr("cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected"));
  // A code the driver cannot name.
  EXPECT_THAT(no_gpu_message(QKV_FAKE_CUDA_UNKNOWN_ERROR), HasSubstr("cuInit: CUDA error 999"));
}

TEST(CudaDriver, ZeroDevicesIsNoGpu) {
  EXPECT_THAT(no_gpu_message(QKV_FAKE_CUDA_ZERO_DEVICES), HasSubstr("reports no GPU"));
}

TEST(CudaDriver, MissingEntryPointIsNoGpuNamingIt) {
  EXPECT_THAT(no_gpu_message(QKV_FAKE_CUDA_NO_LAUNCH), HasSubstr("lacks the entry point cuLaunchKernel"));
}

TEST(CudaDriver, DefaultPathIsTheEnvironmentVariableOrLibcuda) {
  const char* old = std::getenv("QKV_LIBCUDA");
  const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
  setenv("QKV_LIBCUDA", "/opt/x/libcuda.so.1", 1);
  EXPECT_EQ(cuda::Driver::default_path(), "/opt/x/libcuda.so.1");
  setenv("QKV_LIBCUDA", "", 1);
  EXPECT_EQ(cuda::Driver::default_path(), "libcuda.so.1");
  unsetenv("QKV_LIBCUDA");
  EXPECT_EQ(cuda::Driver::default_path(), "libcuda.so.1");
  if (saved) setenv("QKV_LIBCUDA", saved->c_str(), 1);
}

// The process's driver is loaded once, so these run in a fresh process (threadsafe death tests
// re-execute the test binary).
TEST(CudaDriverDeathTest, ProcessDriverComesFromQkvLibcuda) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("QKV_LIBCUDA", QKV_FAKE_CUDA_WORKING, 1);
        const bool ok = cuda::why_no_gpu().empty() && cuda::Device::open().name() == "qkv fake GPU" &&
                        cuda::Driver::process()->path() == QKV_FAKE_CUDA_WORKING;
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        setenv("QKV_LIBCUDA", QKV_FAKE_CUDA_STUB, 1);
        const std::string why = cuda::why_no_gpu();
        bool threw = false;
        try {
          (void)cuda::Device::open();
        } catch (const cuda::NoGpu& e) {
          threw = e.what() == why;
        }
        std::_Exit(threw && why.starts_with("no CUDA driver/GPU found: the CUDA stub library") ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// On a machine without a GPU the default driver gives a reason; on one with a GPU it opens.
TEST(CudaDriver, DefaultDriverEitherOpensOrSaysWhyNot) {
  const std::string why = cuda::why_no_gpu();
  if (why.empty()) {
    const cuda::Device gpu = cuda::Device::open();
    EXPECT_FALSE(gpu.name().empty());
    EXPECT_GT(gpu.sm_count(), 0);
    EXPECT_GT(gpu.total_memory(), 0u);
  } else {
    EXPECT_THAT(why, StartsWith("no CUDA driver/GPU found: "));
    try {
      (void)cuda::Driver::process();
      ADD_FAILURE() << "Driver::process() did not throw, but why_no_gpu() says: " << why;
    } catch (const cuda::NoGpu& e) {
      EXPECT_EQ(e.what(), why);
    }
  }
}

TEST(CudaDriver, WorkingFakeOpensADeviceAndReleasesItsContext) {
  const auto driver = working();
  EXPECT_EQ(driver->device_count(), 1);
  EXPECT_EQ(driver->version(), 12040);
  EXPECT_EQ(driver->path(), QKV_FAKE_CUDA_WORKING);
  const int refs = fake().ctx_refs;
  {
    const cuda::Device gpu = cuda::Device::open(driver);
    EXPECT_EQ(fake().ctx_refs, refs + 1);
    EXPECT_EQ(gpu.ordinal(), 0);
    EXPECT_EQ(gpu.name(), "qkv fake GPU");
    EXPECT_EQ(gpu.cc_major(), 9);
    EXPECT_EQ(gpu.cc_minor(), 0);
    EXPECT_EQ(gpu.arch(), "sm_90");
    EXPECT_EQ(gpu.sm_count(), 132);
    EXPECT_EQ(gpu.total_memory(), std::size_t{80} << 30);
    EXPECT_EQ(gpu.max_shared_per_block_optin(), 232448);
    gpu.synchronize();
  }
  EXPECT_EQ(fake().ctx_refs, refs);
}

TEST(CudaDriver, OrdinalBeyondTheDeviceCountIsRejected) {
  try {
    (void)cuda::Device::open(working(), 1);
    ADD_FAILURE() << "opened device 1 of 1";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("no GPU 1, the driver"));
    EXPECT_THAT(e.what(), HasSubstr("counts 1"));
  }
  EXPECT_THROW((void)cuda::Device::open(working(), -1), std::invalid_argument);
}

TEST(CudaDriver, BufferRoundTripZeroAndMove) {
  const int allocs = fake().live_allocs, refs = fake().ctx_refs;
  {
    std::optional<cuda::Device> gpu = cuda::Device::open(working());
    cuda::Buffer b = gpu->alloc(4 * sizeof(float));
    EXPECT_EQ(b.bytes(), 16u);
    EXPECT_NE(b.ptr(), 0u);
    EXPECT_EQ(fake().live_allocs, allocs + 1);
    const std::vector<float> in{1.5f, -2.f, 3.25f, 4.f};
    b.upload(std::span<const float>(in));
    std::vector<float> out(4);
    b.download(std::span<float>(out));
    EXPECT_EQ(out, in);
    std::vector<float> too_big(5);
    EXPECT_THROW(b.upload(std::span<const float>(too_big)), std::invalid_argument);
    EXPECT_THROW(b.download(std::span<float>(too_big)), std::invalid_argument);
    b.zero();
    b.download(std::span<float>(out));
    EXPECT_EQ(out, std::vector<float>(4, 0.f));

    cuda::Buffer moved = std::move(b);
    EXPECT_EQ(b.ptr(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty
    EXPECT_EQ(moved.bytes(), 16u);
    EXPECT_EQ(fake().live_allocs, allocs + 1);
    moved = gpu->alloc(8);  // the old allocation is freed
    EXPECT_EQ(fake().live_allocs, allocs + 1);
    EXPECT_EQ(gpu->alloc(0).ptr(), 0u);  // no driver call for an empty buffer
    EXPECT_EQ(fake().live_allocs, allocs + 1);

    gpu.reset();  // the buffer keeps the context retained
    EXPECT_EQ(fake().ctx_refs, refs + 1);
  }
  EXPECT_EQ(fake().live_allocs, allocs);
  EXPECT_EQ(fake().ctx_refs, refs);
}

TEST(CudaDriver, FailedCallIsCudaErrorWithNameAndDescription) {
  const cuda::Device gpu = cuda::Device::open(working());
  try {
    (void)gpu.alloc(std::size_t{1} << 40);
    ADD_FAILURE() << "allocated 1 TiB";
  } catch (const cuda::CudaError& e) {
    EXPECT_STREQ(e.what(), "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY: out of memory");
    EXPECT_EQ(e.call(), "cuMemAlloc_v2");
    EXPECT_EQ(e.code(), 2);
  }
}

TEST(CudaDriver, BadPtxIsCudaErrorWithTheJitLog) {
  const cuda::Device gpu = cuda::Device::open(working());
  try {
    (void)gpu.load_ptx(".version 8.0\n.target sm_90\ninvalid;\n");
    ADD_FAILURE() << "loaded bad PTX";
  } catch (const cuda::CudaError& e) {
    EXPECT_STREQ(e.what(),
                 "cuModuleLoadDataEx: CUDA_ERROR_INVALID_PTX: a PTX JIT compilation failed\n"
                 "ptxas application ptx input, line 3; error   : Unknown symbol 'invalid'");
    EXPECT_EQ(e.call(), "cuModuleLoadDataEx");
    EXPECT_EQ(e.code(), 218);
  }
  EXPECT_EQ(fake().live_modules, 0);
}

TEST(CudaDriver, LaunchPassesGridBlockSharedAndParameters) {
  const int modules = fake().live_modules, launches = fake().launches;
  const cuda::Device gpu = cuda::Device::open(working());
  std::optional<cuda::Module> m = gpu.load_ptx(".version 8.0\n.target sm_90\n");
  EXPECT_EQ(fake().live_modules, modules + 1);
  try {
    (void)m->function("missing");
    ADD_FAILURE() << "found a kernel that is not there";
  } catch (const cuda::CudaError& e) {
    EXPECT_THAT(e.what(), StartsWith("cuModuleGetFunction: CUDA_ERROR_NOT_FOUND"));
  }
  const cuda::Function f = m->function("kernel");
  EXPECT_EQ(f.name(), "kernel");
  m.reset();  // the function keeps the module loaded
  EXPECT_EQ(fake().live_modules, modules + 1);

  int n = 42;
  f.launch({.x = 2, .y = 3, .z = 4}, {.x = 128}, 1024, {&n});
  fake_cuda_state& s = fake();
  EXPECT_EQ(s.launches, launches + 1);
  EXPECT_EQ(std::vector<unsigned>(s.grid, s.grid + 3), (std::vector<unsigned>{2, 3, 4}));
  EXPECT_EQ(std::vector<unsigned>(s.block, s.block + 3), (std::vector<unsigned>{128, 1, 1}));
  EXPECT_EQ(s.shared_bytes, 1024u);
  EXPECT_EQ(s.first_param, 42);

  // Above 48 KiB the kernel must opt in first (the fake, like the driver, rejects it otherwise).
  n = 7;
  f.launch({.x = 1}, {.x = 32}, 100 * 1024, {&n});
  EXPECT_EQ(s.launches, launches + 2);
  EXPECT_EQ(s.max_dynamic_shared, 100 * 1024);
  EXPECT_EQ(s.first_param, 7);
  // Beyond the device's opt-in limit: a clear error, no launch.
  try {
    f.launch({.x = 1}, {.x = 32}, 300 * 1024, {&n});
    ADD_FAILURE() << "launched with 300 KiB of shared memory";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("307200 bytes of shared memory, but qkv fake GPU allows at most 232448"));
  }
  EXPECT_EQ(s.launches, launches + 2);
}

TEST(CudaDriver, FunctionOutlivingItsModuleUnloadsItLast) {
  const int modules = fake().live_modules;
  {
    std::optional<cuda::Function> f;
    {
      const cuda::Device gpu = cuda::Device::open(working());
      f = gpu.load_ptx("// empty").function("kernel");
    }
    EXPECT_EQ(fake().live_modules, modules + 1);
  }
  EXPECT_EQ(fake().live_modules, modules);
}

TEST(CudaDriver, EventsTimeAndAreDestroyed) {
  const int events = fake().live_events;
  {
    const cuda::Device gpu = cuda::Device::open(working());
    cuda::Event start = gpu.event(), stop = gpu.event();
    EXPECT_EQ(fake().live_events, events + 2);
    start.record();
    stop.record();
    EXPECT_FLOAT_EQ(cuda::Event::elapsed_ms(start, stop), 1.5f);
    cuda::Event moved = std::move(start);
    EXPECT_EQ(fake().live_events, events + 2);
  }
  EXPECT_EQ(fake().live_events, events);
}

}  // namespace
