// qkv/runtime/cuda.hpp — the CUDA driver API, loaded with dlopen at run time.
//
//   if (std::string why = qkv::cuda::why_no_gpu(); !why.empty()) { std::cerr << why; return; }
//   qkv::cuda::Device gpu = qkv::cuda::Device::open();         // device 0, primary context
//   qkv::cuda::Buffer x = gpu.alloc(n * sizeof(float));
//   x.upload(std::span<const float>(host));
//   qkv::cuda::Module m = gpu.load_ptx(ptx_text);              // JIT-compiled by the driver
//   qkv::cuda::CUdeviceptr p = x.ptr();
//   m.function("scale").launch({.x = blocks}, {.x = 256}, /*shared_bytes=*/0, {&p, &n});
//   gpu.synchronize();
//   x.download(std::span<float>(host));
//
// qkv neither includes cuda.h nor links libcuda: the few driver types it needs are declared here
// with the driver's ABI, and libcuda.so.1 (or the file named by the environment variable
// QKV_LIBCUDA) is opened with dlopen the first time a GPU is asked for, so everything builds and
// runs on machines without CUDA. The process-wide driver is loaded once (thread-safe); the entry
// points used are resolved up front, so a driver that lacks one is reported at load time, not at
// the first launch. The library is never unloaded (the driver's threads outlive it).
//
// Device, Buffer, Module, Function and Event are RAII handles: each keeps what it needs alive
// (a Buffer keeps its device's primary context retained, a Function its module loaded), and each
// call makes the device's context current on the calling thread first, so they may be used from
// any thread. Kernels run on the legacy default stream.
//
// Errors:
//   * NoGpu — there is no usable GPU: libcuda cannot be loaded (the dlerror text), it lacks an
//     entry point qkv needs, it is the toolkit's stub library (cuInit returns
//     CUDA_ERROR_STUB_LIBRARY), cuInit fails otherwise (e.g. CUDA_ERROR_NO_DEVICE), or the driver
//     counts no device. what() always starts with "no CUDA driver/GPU found: ".
//   * CudaError — any other driver call fails: "<call>: <error name>: <error string>", and for a
//     module load the driver's JIT error log on the lines after it (ptxas' message for bad PTX).
//   * std::invalid_argument — a caller's mistake found before calling the driver (an ordinal the
//     driver does not have, a copy larger than the buffer, more shared memory than the device
//     allows per block).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace qkv::cuda {

/// The driver's device pointer type (CUdeviceptr_v2 on 64-bit hosts).
using CUdeviceptr = unsigned long long;

/// The start of every NoGpu message.
inline constexpr std::string_view no_gpu_prefix = "no CUDA driver/GPU found: ";

/// There is no usable GPU; what() is no_gpu_prefix + reason().
class NoGpu : public std::runtime_error {
 public:
  explicit NoGpu(const std::string& reason);
  [[nodiscard]] const std::string& reason() const noexcept { return reason_; }

 private:
  std::string reason_;
};

/// A driver call failed: what() is "<call>: <name>: <description>" (+ "\n<JIT log>" for modules).
class CudaError : public std::runtime_error {
 public:
  CudaError(const std::string& message, std::string call, int code);
  [[nodiscard]] const std::string& call() const noexcept { return call_; }  // e.g. "cuMemAlloc_v2"
  [[nodiscard]] int code() const noexcept { return code_; }                 // the CUresult

 private:
  std::string call_;
  int code_;
};

/// One loaded driver library with every entry point qkv uses resolved, cuInit done and at least
/// one device counted.
class Driver {
 public:
  struct Api;  // the resolved entry points (defined in cuda.cpp)

  /// Opens the driver at `path` (a dlopen name or file). Each call opens it again (dlopen shares
  /// the handle); tests use it to load fake drivers. Throws NoGpu.
  [[nodiscard]] static std::shared_ptr<const Driver> load(const std::string& path);
  /// The process's driver: default_path(), loaded on first use, once. Throws NoGpu (every call,
  /// with the same reason) when that failed.
  [[nodiscard]] static std::shared_ptr<const Driver> process();
  /// $QKV_LIBCUDA when set and not empty, else "libcuda.so.1".
  [[nodiscard]] static std::string default_path();

  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;
  ~Driver();

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] int device_count() const noexcept { return device_count_; }
  /// cuDriverGetVersion: 1000 * major + 10 * minor (12040 for CUDA 12.4).
  [[nodiscard]] int version() const noexcept { return version_; }
  [[nodiscard]] const Api& api() const noexcept { return *api_; }

 private:
  Driver(std::string path, std::unique_ptr<Api> api, int device_count, int version);
  std::string path_;
  std::unique_ptr<Api> api_;
  int device_count_;
  int version_;
};

/// Empty when the process's driver loads and counts a GPU; otherwise why not (NoGpu's message).
/// Never throws.
[[nodiscard]] std::string why_no_gpu() noexcept;

namespace detail {
struct DeviceState;
struct ModuleState;
}  // namespace detail

class Buffer;
class Module;
class Event;

/// One GPU with its primary context retained (released when the last handle that uses it goes).
class Device {
 public:
  /// Device `ordinal` of the process's driver. Throws NoGpu, CudaError, std::invalid_argument.
  [[nodiscard]] static Device open(int ordinal = 0);
  /// Device `ordinal` of `driver`.
  [[nodiscard]] static Device open(std::shared_ptr<const Driver> driver, int ordinal = 0);

  [[nodiscard]] int ordinal() const noexcept;
  [[nodiscard]] const std::string& name() const noexcept;  // e.g. "NVIDIA H100 80GB HBM3"
  [[nodiscard]] int cc_major() const noexcept;             // compute capability 9.0 -> 9
  [[nodiscard]] int cc_minor() const noexcept;             //                       -> 0
  [[nodiscard]] std::string arch() const;                  // "sm_90"
  [[nodiscard]] int sm_count() const noexcept;
  [[nodiscard]] std::size_t total_memory() const noexcept;  // bytes
  /// Shared memory one block may use when its kernel opts in (Function::launch does).
  [[nodiscard]] int max_shared_per_block_optin() const noexcept;
  [[nodiscard]] const Driver& driver() const noexcept;

  /// `bytes` of device memory (uninitialised).
  [[nodiscard]] Buffer alloc(std::size_t bytes) const;
  /// Loads PTX text (cuModuleLoadDataEx, JIT-compiled for this device).
  [[nodiscard]] Module load_ptx(std::string_view ptx) const;
  [[nodiscard]] Event event() const;
  /// Waits for all work on the device (cuCtxSynchronize).
  void synchronize() const;

 private:
  explicit Device(std::shared_ptr<const detail::DeviceState> s) : s_(std::move(s)) {}
  std::shared_ptr<const detail::DeviceState> s_;
};

/// Device memory (cuMemAlloc_v2 / cuMemFree_v2). Copies are synchronous.
class Buffer {
 public:
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  ~Buffer();

  [[nodiscard]] CUdeviceptr ptr() const noexcept { return ptr_; }  // 0 for an empty buffer
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

  /// Copies `n` bytes from the host to the start of the buffer (n <= bytes()).
  void upload(const void* src, std::size_t n);
  /// Copies `n` bytes from the start of the buffer to the host (n <= bytes()).
  void download(void* dst, std::size_t n) const;
  /// Sets every byte to 0 (cuMemsetD8_v2).
  void zero();

  template <class T>
  void upload(std::span<const T> src) {
    upload(src.data(), src.size_bytes());
  }
  template <class T>
  void download(std::span<T> dst) const {
    download(dst.data(), dst.size_bytes());
  }

 private:
  friend class Device;
  Buffer(std::shared_ptr<const detail::DeviceState> s, CUdeviceptr ptr, std::size_t bytes)
      : s_(std::move(s)), ptr_(ptr), bytes_(bytes) {}
  void release() noexcept;
  std::shared_ptr<const detail::DeviceState> s_;
  CUdeviceptr ptr_ = 0;
  std::size_t bytes_ = 0;
};

/// Grid or block extents.
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

/// A kernel of a loaded module; keeps the module loaded.
class Function {
 public:
  /// cuLaunchKernel on the default stream; returns without waiting. `params` holds one pointer
  /// per kernel parameter, to the parameter's value. Above 48 KiB of dynamic shared memory the
  /// kernel is opted in first (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES); more than the
  /// device's max_shared_per_block_optin() throws std::invalid_argument.
  void launch(Dim3 grid, Dim3 block, unsigned shared_bytes, const std::vector<void*>& params) const;
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

 private:
  friend class Module;
  Function(std::shared_ptr<const detail::ModuleState> m, void* f, std::string name)
      : m_(std::move(m)), f_(f), name_(std::move(name)) {}
  std::shared_ptr<const detail::ModuleState> m_;
  void* f_;  // CUfunction
  std::string name_;
};

/// A loaded module (unloaded when it and every Function from it are gone).
class Module {
 public:
  /// The kernel `name` (cuModuleGetFunction). Throws CudaError (CUDA_ERROR_NOT_FOUND) if absent.
  [[nodiscard]] Function function(const std::string& name) const;

 private:
  friend class Device;
  explicit Module(std::shared_ptr<const detail::ModuleState> m) : m_(std::move(m)) {}
  std::shared_ptr<const detail::ModuleState> m_;
};

/// A CUDA event for timing work on the default stream.
///
///   auto start = gpu.event(), stop = gpu.event();
///   start.record(); f.launch(...); stop.record();
///   float ms = qkv::cuda::Event::elapsed_ms(start, stop);   // waits for `stop`
class Event {
 public:
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  ~Event();

  void record();             // cuEventRecord on the default stream
  void synchronize() const;  // cuEventSynchronize
  /// Milliseconds between two recorded events; waits for `stop` first.
  [[nodiscard]] static float elapsed_ms(const Event& start, const Event& stop);

 private:
  friend class Device;
  Event(std::shared_ptr<const detail::DeviceState> s, void* e) : s_(std::move(s)), e_(e) {}
  void release() noexcept;
  std::shared_ptr<const detail::DeviceState> s_;
  void* e_ = nullptr;  // CUevent
};

}  // namespace qkv::cuda
