// qkv/codegen/cpu/gemm.hpp — a JIT-compiled fp32 GEMM for PyTorch's linear-layer layout.
//
//   // y[M, N] = x[M, K] · W[N, K]ᵀ + b[N]   (W as nn.Linear stores it: [out, in])
//   qkv::codegen::cpu::run_linear(x, w, b_or_null, y, m, n, k);   // all hardware threads
//
// Everything is row-major and dense; M, N and K are run-time values (any size, 0 included).
// Each call packs Bᵀ into panels of `cols` columns (zero-padded, 64-byte aligned); the kernel
// packs a block of `rows` rows of A per K block into its stack and runs a register-blocked
// micro-kernel: rows × cols accumulators (cols = col_vectors host-width vectors), one scalar
// broadcast of A and col_vectors loads of packed B per FMA row. Tails in M and N are handled by
// zero padding on the way in and masked stores on the way out. Work is split into (row block,
// column block) tasks on the persistent thread pool the attention kernel uses.
//
// The first call generates the kernel's LLVM IR and JIT-compiles it for the host (tens of
// milliseconds); the kernel is cached per (spec, target), so later calls only pack and run.
#pragma once

#include <cstdint>
#include <string>

namespace qkv::codegen::cpu {

/// The blocking of the GEMM kernel; 0 means "chosen for the host" (AVX-512: 16 lanes, 12 rows ×
/// 2 vectors; AVX2: 8 lanes, 6 × 2; otherwise 4 lanes, 6 × 2; K blocks of 256).
struct GemmSpec {
  int vector_floats = 0;  // f32 lanes per vector
  int rows = 0;           // MR: rows of A per micro-tile
  int col_vectors = 0;    // NR / lanes: vectors of B columns per micro-tile
  int k_block = 0;        // KC: depth of one pass over a micro-tile
  /// A and B are bf16 (the bits, uint16_t); products accumulate in f32 and C is f32. With
  /// AVX512-BF16 (and 16 lanes) Bᵀ is packed as pairs of K and the micro-kernel runs vdpbf16ps
  /// (two products per lane and instruction); otherwise both are widened to f32 as they are packed.
  bool bf16 = false;
  /// A and B are IEEE f16 (the bits): widened to f32 as they are loaded or packed (never with bf16).
  bool f16 = false;

  [[nodiscard]] std::uint64_t hash() const;
  friend bool operator==(const GemmSpec&, const GemmSpec&) = default;
};

/// C[m, n] = A[m, k] · B[n, k]ᵀ (+ bias[n] when bias is non-null), row-major and dense, on
/// `threads` threads (<= 0: one per hardware thread). C must not overlap A, B or bias. Throws
/// std::invalid_argument for negative sizes or a null pointer that is needed, and
/// std::runtime_error when the kernel cannot be compiled.
void run_linear(const float* a, const float* b, const float* bias, float* c, std::int64_t m, std::int64_t n,
                std::int64_t k, int threads = 0, const GemmSpec& spec = {});

/// run_linear on bf16 A and B (the bits; spec.bf16 is implied): C (f32) = A·Bᵀ + bias (f32).
void run_linear_bf16(const std::uint16_t* a, const std::uint16_t* b, const float* bias, float* c, std::int64_t m,
                     std::int64_t n, std::int64_t k, int threads = 0, GemmSpec spec = {});

/// What preparing a GEMM kernel cost, and how it is blocked.
struct GemmInfo {
  std::string name;       // the JIT symbol
  bool cached = false;    // found in the cache (no compilation)
  double compile_ms = 0;  // IR generation + -O3 + machine code
  int vector_floats = 0;  // lanes per vector
  int rows = 0;           // MR
  int cols = 0;           // NR = col_vectors · lanes
  int k_block = 0;        // KC
  bool dpbf16 = false;    // bf16 pairs on vdpbf16ps (spec.bf16 on a host with AVX512-BF16)
};

/// Gets the kernel for `spec` from the cache or compiles it (what run_linear does first).
GemmInfo prepare_linear(const GemmSpec& spec = {});

/// Drops every cached GEMM kernel and their JIT. Not to be called while run_linear runs.
void clear_linear_cache();

/// The kernel's LLVM IR as text: as generated, or after the -O3 pipeline.
std::string gemm_kernel_ir(const GemmSpec& spec, bool optimized);

}  // namespace qkv::codegen::cpu
