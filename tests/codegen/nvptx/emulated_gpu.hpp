// tests/codegen/nvptx/emulated_gpu.hpp — the GPU the host-emulation tests run kernels on.
//
// Each generator's host-emulation variant (the same IR, with thread ids, __syncthreads,
// __syncwarp, warp shuffles, ex2 and lg2 turned into calls to host hooks and shared memory a host
// buffer) is JIT-compiled for the host and run with one host thread per GPU thread, block after
// block. Shared memory is filled with NaN before every block, so a read of a shared word the
// kernel did not write first shows up as NaN in the results; a barrier reached by only part of a
// block deadlocks and aborts the test after a minute.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include <qkv/codegen/jit.hpp>
#include <qkv/codegen/nvptx.hpp>

namespace qkv::emulation {

/// A kernel's emulation, compiled for the host, plus its shared memory.
struct Emulated {
  std::unique_ptr<codegen::Jit> jit;
  std::vector<float> shared;
  void* entry = nullptr;
  int threads = 0;

  template <class Fn>
  Fn* fn() const {
    return reinterpret_cast<Fn*>(entry);
  }

  /// Runs `call` (which calls the kernel) as every thread of every block of `grid`.
  void launch(codegen::nvptx::Dim3 grid, const std::function<void()>& call);
};

/// The emulation of `request` (its PTX is emitted too: the launch geometry, and proof the request
/// is valid).
Emulated emulate(const codegen::nvptx::KernelRequest& request);

std::vector<float> random_vec(std::size_t n, std::mt19937& gen, float lo = -1.0f, float hi = 1.0f);

/// The flags' masks of the tensor-core tests for `spec` (empty where its flag is off): bias [L, S]
/// in ±2 with row 3 all −inf (a row with no visible key), and key_keep [B, S] with a quarter of
/// the keys padded and, when B > 1, every key of batch 1.
struct FlagMasks {
  std::vector<float> bias;
  std::vector<std::uint8_t> keep;
};
FlagMasks flag_masks(const codegen::cpu::AttentionSpec& spec, std::int64_t B, std::int64_t L, std::int64_t S,
                     std::mt19937& gen);
/// The key_keep [B, S] of flag_masks: a quarter of the keys padded and, when B > 1, every key of batch 1.
std::vector<std::uint8_t> key_padding(std::int64_t B, std::int64_t S, std::mt19937& gen);

/// bf16 bits of x (nearest even), and back.
std::vector<std::uint16_t> to_bf16(const std::vector<float>& x);
std::vector<float> from_bf16(const std::vector<std::uint16_t>& x);

/// max |a − b| (NaN anywhere: NaN) and mean |a − b| over equal-sized vectors.
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);
double mean_abs_diff(const std::vector<float>& a, const std::vector<float>& b);

/// |got − want| <= tol · (1 + |want|) everywhere (equal infinities pass); the first 5 misses reported.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what);

}  // namespace qkv::emulation
