// The CUDA driver API through dlopen: see qkv/runtime/cuda.hpp.
#include <qkv/runtime/cuda.hpp>

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace qkv::cuda {

namespace {

// The driver ABI, as cuda.h declares it (CUDA 11 and later): results and enums are int, handles
// are opaque pointers, CUdevice is int.
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
using CUevent = void*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr int CU_JIT_ERROR_LOG_BUFFER = 5;
constexpr int CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6;
constexpr unsigned CU_EVENT_DEFAULT = 0;
constexpr unsigned default_shared_limit = 48 * 1024;  // without the opt-in attribute

}  // namespace

// X(name, symbol, return, parameters): every entry point qkv resolves, by its exported symbol
// (the _v2 ones where cuda.h maps the plain name to _v2; cuEventElapsedTime stays the original,
// as _v2 exists only from CUDA 12.8 on).
#define QKV_CUDA_ENTRY_POINTS(X)                                                                                       \
  X(init, "cuInit", unsigned)                                                                                          \
  X(driver_get_version, "cuDriverGetVersion", int*)                                                                    \
  X(get_error_name, "cuGetErrorName", CUresult, const char**)                                                          \
  X(get_error_string, "cuGetErrorString", CUresult, const char**)                                                      \
  X(device_get_count, "cuDeviceGetCount", int*)                                                                        \
  X(device_get, "cuDeviceGet", CUdevice*, int)                                                                         \
  X(device_get_name, "cuDeviceGetName", char*, int, CUdevice)                                                          \
  X(device_get_attribute, "cuDeviceGetAttribute", int*, int, CUdevice)                                                 \
  X(device_total_mem, "cuDeviceTotalMem_v2", std::size_t*, CUdevice)                                                   \
  X(primary_ctx_retain, "cuDevicePrimaryCtxRetain", CUcontext*, CUdevice)                                              \
  X(primary_ctx_release, "cuDevicePrimaryCtxRelease_v2", CUdevice)                                                     \
  X(ctx_set_current, "cuCtxSetCurrent", CUcontext)                                                                     \
  X(ctx_synchronize, "cuCtxSynchronize")                                                                               \
  X(mem_alloc, "cuMemAlloc_v2", CUdeviceptr*, std::size_t)                                                             \
  X(mem_free, "cuMemFree_v2", CUdeviceptr)                                                                             \
  X(memcpy_htod, "cuMemcpyHtoD_v2", CUdeviceptr, const void*, std::size_t)                                             \
  X(memcpy_dtoh, "cuMemcpyDtoH_v2", void*, CUdeviceptr, std::size_t)                                                   \
  X(memset_d8, "cuMemsetD8_v2", CUdeviceptr, unsigned char, std::size_t)                                               \
  X(module_load_data_ex, "cuModuleLoadDataEx", CUmodule*, const void*, unsigned, int*, void**)                         \
  X(module_get_function, "cuModuleGetFunction", CUfunction*, CUmodule, const char*)                                    \
  X(module_unload, "cuModuleUnload", CUmodule)                                                                         \
  X(func_set_attribute, "cuFuncSetAttribute", CUfunction, int, int)                                                    \
  X(launch_kernel, "cuLaunchKernel", CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, \
    CUstream, void**, void**)                                                                                          \
  X(event_create, "cuEventCreate", CUevent*, unsigned)                                                                 \
  X(event_record, "cuEventRecord", CUevent, CUstream)                                                                  \
  X(event_synchronize, "cuEventSynchronize", CUevent)                                                                  \
  X(event_elapsed_time, "cuEventElapsedTime", float*, CUevent, CUevent)                                                \
  X(event_destroy, "cuEventDestroy_v2", CUevent)

struct Driver::Api {
#define QKV_CUDA_MEMBER(name, symbol, ...) CUresult (*name)(__VA_ARGS__) = nullptr;
  QKV_CUDA_ENTRY_POINTS(QKV_CUDA_MEMBER)
#undef QKV_CUDA_MEMBER
};

namespace {

/// "CUDA_ERROR_INVALID_PTX: a PTX JIT compilation failed", or "CUDA error <n>" for a code the
/// driver cannot name.
std::string describe(const Driver::Api& api, CUresult rc) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.get_error_name(rc, &name) != CUDA_SUCCESS || !name) return "CUDA error " + std::to_string(rc);
  std::string s = name;
  if (api.get_error_string(rc, &text) == CUDA_SUCCESS && text) s += std::string(": ") + text;
  return s;
}

void check(const Driver::Api& api, CUresult rc, const char* call) {
  if (rc != CUDA_SUCCESS) throw CudaError(std::string(call) + ": " + describe(api, rc), call, rc);
}

}  // namespace

NoGpu::NoGpu(const std::string& reason) : std::runtime_error(std::string(no_gpu_prefix) + reason), reason_(reason) {}

CudaError::CudaError(const std::string& message, std::string call, int code)
    : std::runtime_error(message), call_(std::move(call)), code_(code) {}

// ---------------------------------------------------------------------------------------------
// Driver

Driver::Driver(std::string path, std::unique_ptr<Api> api, int device_count, int version)
    : path_(std::move(path)), api_(std::move(api)), device_count_(device_count), version_(version) {}

Driver::~Driver() = default;  // the library stays loaded: the driver's threads may still run

std::string Driver::default_path() {
  const char* env = std::getenv("QKV_LIBCUDA");
  return env && *env ? std::string(env) : std::string("libcuda.so.1");
}

std::shared_ptr<const Driver> Driver::load(const std::string& path) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    throw NoGpu("cannot load " + path + " (dlopen: " + (err ? err : "unknown error") +
                "); set QKV_LIBCUDA to the driver library's path if it is elsewhere");
  }
  auto api = std::make_unique<Api>();
  auto resolve = [&](const char* symbol) {
    void* f = dlsym(lib, symbol);
    if (!f) {
      dlclose(lib);  // cuInit has not run yet
      throw NoGpu(path + " lacks the entry point " + symbol + " (not a CUDA driver, or one older than CUDA 11)");
    }
    return f;
  };
#define QKV_CUDA_RESOLVE(name, symbol, ...) api->name = reinterpret_cast<decltype(api->name)>(resolve(symbol));
  QKV_CUDA_ENTRY_POINTS(QKV_CUDA_RESOLVE)
#undef QKV_CUDA_RESOLVE

  if (CUresult rc = api->init(0); rc != CUDA_SUCCESS) {
    if (rc == CUDA_ERROR_STUB_LIBRARY)
      throw NoGpu("the CUDA stub library was loaded (libcuda.so.1 from the toolkit, not a real driver): " + path);
    throw NoGpu("cuInit: " + describe(*api, rc) + " (driver " + path + ")");
  }
  int count = 0;
  if (CUresult rc = api->device_get_count(&count); rc != CUDA_SUCCESS)
    throw NoGpu("cuDeviceGetCount: " + describe(*api, rc) + " (driver " + path + ")");
  if (count <= 0) throw NoGpu("the CUDA driver " + path + " reports no GPU");
  int version = 0;
  check(*api, api->driver_get_version(&version), "cuDriverGetVersion");
  return std::shared_ptr<const Driver>(new Driver(path, std::move(api), count, version));
}

namespace {

struct ProcessDriver {
  std::shared_ptr<const Driver> driver;
  std::string why_not;  // NoGpu::reason() when driver is null
};

const ProcessDriver& process_driver() {
  static const ProcessDriver d = [] {
    try {
      return ProcessDriver{Driver::load(Driver::default_path()), {}};
    } catch (const NoGpu& e) {
      return ProcessDriver{nullptr, e.reason()};
    } catch (const CudaError& e) {
      return ProcessDriver{nullptr, e.what()};
    }
  }();
  return d;
}

}  // namespace

std::shared_ptr<const Driver> Driver::process() {
  const ProcessDriver& d = process_driver();
  if (!d.driver) throw NoGpu(d.why_not);
  return d.driver;
}

std::string why_no_gpu() noexcept {
  try {
    const ProcessDriver& d = process_driver();
    return d.driver ? std::string() : std::string(no_gpu_prefix) + d.why_not;
  } catch (const std::exception& e) {  // std::bad_alloc
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

// ---------------------------------------------------------------------------------------------
// Device

namespace detail {

struct DeviceState {
  std::shared_ptr<const Driver> driver;
  const Driver::Api& api;
  CUdevice device = 0;
  CUcontext ctx = nullptr;
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0, sm_count = 0, max_shared_optin = 0;
  std::size_t total_memory = 0;

  DeviceState(std::shared_ptr<const Driver> d, int ord) : driver(std::move(d)), api(driver->api()), ordinal(ord) {}
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;
  ~DeviceState() {
    if (ctx) api.primary_ctx_release(device);
  }

  /// Makes the primary context current on the calling thread (cheap; the driver keeps it per thread).
  void bind() const { check(api, api.ctx_set_current(ctx), "cuCtxSetCurrent"); }
};

struct ModuleState {
  std::shared_ptr<const DeviceState> dev;
  CUmodule module = nullptr;
  ModuleState(std::shared_ptr<const DeviceState> d, CUmodule m) : dev(std::move(d)), module(m) {}
  ModuleState(const ModuleState&) = delete;
  ModuleState& operator=(const ModuleState&) = delete;
  ~ModuleState() {
    if (dev->api.ctx_set_current(dev->ctx) == CUDA_SUCCESS) dev->api.module_unload(module);
  }
};

}  // namespace detail

Device Device::open(int ordinal) { return open(Driver::process(), ordinal); }

Device Device::open(std::shared_ptr<const Driver> driver, int ordinal) {
  if (!driver) throw std::invalid_argument("qkv::cuda::Device::open: no driver");
  if (ordinal < 0 || ordinal >= driver->device_count())
    throw std::invalid_argument("qkv::cuda::Device::open: no GPU " + std::to_string(ordinal) + ", the driver " +
                                driver->path() + " counts " + std::to_string(driver->device_count()));
  auto s = std::make_shared<detail::DeviceState>(std::move(driver), ordinal);
  const Driver::Api& api = s->api;
  check(api, api.device_get(&s->device, ordinal), "cuDeviceGet");
  char name[256] = {};
  check(api, api.device_get_name(name, static_cast<int>(sizeof name) - 1, s->device), "cuDeviceGetName");
  s->name = name;
  auto attribute = [&](int attr) {
    int v = 0;
    check(api, api.device_get_attribute(&v, attr, s->device), "cuDeviceGetAttribute");
    return v;
  };
  s->cc_major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  s->cc_minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  s->sm_count = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  s->max_shared_optin = attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  check(api, api.device_total_mem(&s->total_memory, s->device), "cuDeviceTotalMem_v2");
  CUcontext ctx = nullptr;
  check(api, api.primary_ctx_retain(&ctx, s->device), "cuDevicePrimaryCtxRetain");
  s->ctx = ctx;  // released by ~DeviceState from here on
  s->bind();
  return Device(std::move(s));
}

int Device::ordinal() const noexcept { return s_->ordinal; }
const std::string& Device::name() const noexcept { return s_->name; }
int Device::cc_major() const noexcept { return s_->cc_major; }
int Device::cc_minor() const noexcept { return s_->cc_minor; }
std::string Device::arch() const { return "sm_" + std::to_string(s_->cc_major) + std::to_string(s_->cc_minor); }
int Device::sm_count() const noexcept { return s_->sm_count; }
std::size_t Device::total_memory() const noexcept { return s_->total_memory; }
int Device::max_shared_per_block_optin() const noexcept { return s_->max_shared_optin; }
const Driver& Device::driver() const noexcept { return *s_->driver; }

void Device::synchronize() const {
  s_->bind();
  check(s_->api, s_->api.ctx_synchronize(), "cuCtxSynchronize");
}

Buffer Device::alloc(std::size_t bytes) const {
  if (bytes == 0) return Buffer(s_, 0, 0);  // cuMemAlloc rejects 0 bytes
  s_->bind();
  CUdeviceptr p = 0;
  check(s_->api, s_->api.mem_alloc(&p, bytes), "cuMemAlloc_v2");
  return Buffer(s_, p, bytes);
}

Module Device::load_ptx(std::string_view ptx) const {
  s_->bind();
  const std::string text(ptx);  // the driver reads a NUL-terminated image
  std::vector<char> log(16 * 1024, '\0');
  int options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {log.data(), reinterpret_cast<void*>(static_cast<std::uintptr_t>(log.size() - 1))};
  CUmodule m = nullptr;
  if (CUresult rc = s_->api.module_load_data_ex(&m, text.c_str(), 2, options, values); rc != CUDA_SUCCESS) {
    std::string message = "cuModuleLoadDataEx: " + describe(s_->api, rc);
    std::string jit_log(log.data(), strnlen(log.data(), log.size()));
    while (!jit_log.empty() && (jit_log.back() == '\n' || jit_log.back() == ' ')) jit_log.pop_back();
    if (!jit_log.empty()) message += "\n" + jit_log;
    throw CudaError(message, "cuModuleLoadDataEx", rc);
  }
  return Module(std::make_shared<const detail::ModuleState>(s_, m));
}

Event Device::event() const {
  s_->bind();
  CUevent e = nullptr;
  check(s_->api, s_->api.event_create(&e, CU_EVENT_DEFAULT), "cuEventCreate");
  return Event(s_, e);
}

// ---------------------------------------------------------------------------------------------
// Buffer

Buffer::Buffer(Buffer&& o) noexcept
    : s_(std::move(o.s_)), ptr_(std::exchange(o.ptr_, 0)), bytes_(std::exchange(o.bytes_, 0)) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    s_ = std::move(o.s_);
    ptr_ = std::exchange(o.ptr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::release() noexcept {
  if (ptr_ && s_ && s_->api.ctx_set_current(s_->ctx) == CUDA_SUCCESS) s_->api.mem_free(ptr_);
  ptr_ = 0;
  bytes_ = 0;
}

namespace {
void check_copy(const char* what, std::size_t n, std::size_t bytes) {
  if (n > bytes)
    throw std::invalid_argument(std::string("qkv::cuda::Buffer::") + what + ": " + std::to_string(n) +
                                " bytes, but the buffer holds " + std::to_string(bytes));
}
}  // namespace

void Buffer::upload(const void* src, std::size_t n) {
  check_copy("upload", n, bytes_);
  if (n == 0) return;
  s_->bind();
  check(s_->api, s_->api.memcpy_htod(ptr_, src, n), "cuMemcpyHtoD_v2");
}

void Buffer::download(void* dst, std::size_t n) const {
  check_copy("download", n, bytes_);
  if (n == 0) return;
  s_->bind();
  check(s_->api, s_->api.memcpy_dtoh(dst, ptr_, n), "cuMemcpyDtoH_v2");
}

void Buffer::zero() {
  if (bytes_ == 0) return;
  s_->bind();
  check(s_->api, s_->api.memset_d8(ptr_, 0, bytes_), "cuMemsetD8_v2");
}

// ---------------------------------------------------------------------------------------------
// Module, Function

Function Module::function(const std::string& name) const {
  const detail::DeviceState& dev = *m_->dev;
  dev.bind();
  CUfunction f = nullptr;
  check(dev.api, dev.api.module_get_function(&f, m_->module, name.c_str()), "cuModuleGetFunction");
  return Function(m_, f, name);
}

void Function::launch(Dim3 grid, Dim3 block, unsigned shared_bytes, const std::vector<void*>& params) const {
  const detail::DeviceState& dev = *m_->dev;
  if (shared_bytes > default_shared_limit && shared_bytes > static_cast<unsigned>(dev.max_shared_optin))
    throw std::invalid_argument("qkv::cuda::Function::launch(" + name_ + "): " + std::to_string(shared_bytes) +
                                " bytes of shared memory, but " + dev.name + " allows at most " +
                                std::to_string(dev.max_shared_optin) + " per block");
  dev.bind();
  if (shared_bytes > default_shared_limit)
    check(
        dev.api,
        dev.api.func_set_attribute(f_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(shared_bytes)),
        "cuFuncSetAttribute");
  // The driver only reads the parameter array.
  void** args = params.empty() ? nullptr : const_cast<void**>(params.data());
  check(dev.api,
        dev.api.launch_kernel(f_, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes, nullptr, args,
                              nullptr),
        "cuLaunchKernel");
}

// ---------------------------------------------------------------------------------------------
// Event

Event::Event(Event&& o) noexcept : s_(std::move(o.s_)), e_(std::exchange(o.e_, nullptr)) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    release();
    s_ = std::move(o.s_);
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}

Event::~Event() { release(); }

void Event::release() noexcept {
  if (e_ && s_ && s_->api.ctx_set_current(s_->ctx) == CUDA_SUCCESS) s_->api.event_destroy(e_);
  e_ = nullptr;
}

void Event::record() {
  s_->bind();
  check(s_->api, s_->api.event_record(e_, nullptr), "cuEventRecord");
}

void Event::synchronize() const {
  s_->bind();
  check(s_->api, s_->api.event_synchronize(e_), "cuEventSynchronize");
}

float Event::elapsed_ms(const Event& start, const Event& stop) {
  stop.synchronize();
  float ms = 0;
  check(stop.s_->api, stop.s_->api.event_elapsed_time(&ms, start.e_, stop.e_), "cuEventElapsedTime");
  return ms;
}

}  // namespace qkv::cuda
