// GPU tests skip, with the reason, where no CUDA driver or GPU is present. The driver is loaded
// with dlopen, as the runtime does, so this builds and runs on machines without CUDA.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <string>

namespace {

/// Empty when a GPU is usable; otherwise why not.
std::string why_no_gpu() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return std::string("no CUDA driver (dlopen libcuda.so.1: ") + dlerror() + ")";
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
  if (!init || !count) return "libcuda.so.1 lacks cuInit/cuDeviceGetCount";
  if (int rc = init(0); rc != 0)
    return rc == 34 ? "CUDA stub library (CUDA_ERROR_STUB_LIBRARY), no real driver"
                    : "cuInit failed with CUresult " + std::to_string(rc);
  int n = 0;
  if (count(&n) != 0 || n == 0) return "CUDA driver present but no GPU";
  return {};
}

TEST(Gpu, DriverAndDeviceAreUsable) {
  const std::string reason = why_no_gpu();
  if (!reason.empty()) GTEST_SKIP() << reason;
  SUCCEED() << "a CUDA GPU is available";
}

}  // namespace
