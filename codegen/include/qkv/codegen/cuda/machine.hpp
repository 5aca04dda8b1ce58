// qkv/codegen/cuda/machine.hpp — where a plan runs: GPU 0 through the driver, or (in tests) a
// host emulation of the kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <qkv/codegen/cuda/plan.hpp>

namespace qkv::codegen::cuda {

/// A launch parameter's value: a device address (buffers and null), an i64 or an f32.
struct ParamValue {
  Arg::Kind kind = Arg::Kind::null;
  std::uint64_t address = 0;
  std::int64_t i64 = 0;
  float f32 = 0.0f;
};

/// Where a plan runs: GPU 0 (execute / run), or — for tests on machines without a GPU — an
/// emulation of the kernels on the host. Addresses are opaque to the executor; 0 is "no memory"
/// (and what alloc returns for 0 bytes).
class Machine {
 public:
  virtual ~Machine() = default;
  virtual std::uint64_t alloc(std::size_t bytes) = 0;
  virtual void free(std::uint64_t address) = 0;
  /// Whole-buffer copies: `address` is what alloc returned, n <= its bytes.
  virtual void upload(std::uint64_t address, const void* src, std::size_t n) = 0;
  virtual void download(void* dst, std::uint64_t address, std::size_t n) = 0;
  /// Launches l.request with l.grid; `params` are l.args resolved, in the kernel's order.
  virtual void launch(const Launch& l, const std::vector<ParamValue>& params) = 0;
  /// Dynamic shared memory per block the machine allows (PlanOptions::max_shared_bytes).
  [[nodiscard]] virtual int max_shared_bytes() const = 0;
};

}  // namespace qkv::codegen::cuda
