// codegen/cpu/kernels/gemm_kernel.hpp — the GEMM kernel's IR generator and ABI (private to codegen):
// gemm.hpp's run_linear drives it in-process, the AOT compiler (aot.cpp) calls it from generated
// code. What the generated function computes is described at the top of gemm_kernel.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <qkv/codegen/cpu/gemm.hpp>
#include <qkv/codegen/target.hpp>

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace qkv::codegen::cpu {

/// What the generated function reads through its first argument (its layout is the kernel ABI).
struct GemmArgs {
  const void* a;      // [M, K], f32 (or bf16 / f16 bits with GemmConfig::bf16 / f16); [K, M] with a_transposed
  const void* bp;     // packed Bᵀ: ceil(N / NR) panels of [K][NR] f32, or with dpbf16 of [ceil(K/2)][NR][2] bf16
  const float* bias;  // ceil(N / NR)·NR floats (zeros when the call has no bias)
  float* c;           // [M, N]
  std::int64_t m, n, k;
  // int8_dot: A is 8-bit activations [M][ceil(K / group) · group] (q + 128, as u8) and these
  // their scales [M][ceil(K / group)] (row r's group g is A's q times a_scales[r][g]); null otherwise.
  const float* a_scales;
};

/// void name(const GemmArgs* args, i64 m0, i64 m1, i64 n0, i64 n1): rows [m0, m1) × columns
/// [n0, n1) of C; n0 a multiple of NR.
using GemmKernelFn = void(const GemmArgs* args, std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1);

/// The blocking of one kernel (GemmSpec resolved for a target).
struct GemmConfig {
  int lanes = 16, rows = 12, col_vectors = 2, k_block = 256;
  // A call of at most 2 · rows rows whose row count small_rows tiles with fewer rows runs the
  // kernel of this config with small_rows rows instead (module_builder.cpp); 0: never.
  int small_rows = 0;
  bool bf16 = false;    // A (and W for the GEMV) are bf16, widened as loaded unless dpbf16
  bool dpbf16 = false;  // bf16 with vdpbf16ps: A and the panels hold pairs of K (k_block even)
  bool f16 = false;     // A (and W for the GEMV) are IEEE f16, widened as loaded (never with bf16)
  // W quantized (a dequantize the linear reads in place, select.hpp): int8 with one f16 scale per
  // quant_group entries of a row's K (a multiple of select.hpp's kQuantGroupQuantum); 0: W is stored as x is.
  int quant_group = 0;
  // A quantized W holds two 4-bit entries a byte (ir/quant.hpp's order; K a multiple of quant_group).
  bool q4 = false;
  // A quantized W's GEMM multiplies 8-bit activations by W's 8-bit entries on vpdpbusd
  // (tuning.hpp's int8_dot_products): A given as GemmArgs::a_scales says, the panels as
  // gemm_panel_bytes says; its int32 sums scaled into f32 accumulators once a group.
  bool int8_dot = false;
  // W is a quantized weight dequantized into memory (not read in place): x's rows are rounded to
  // 8 bits per group of this many first, as for quant_group; 0: they are not.
  int round_group = 0;
  // A given transposed, as [K, M] rows (a contraction over the leading axes of both operands: a
  // weight's gradient Σ over Batch and Seq): f32 read in place down its columns, bf16 packed from them.
  bool a_transposed = false;
  std::string cpu, features;
  [[nodiscard]] int cols() const { return lanes * col_vectors; }
};

/// Whether the kernel reads A where it is (f32 A) instead of packing it per row block (bf16 A:
/// widened, or paired for vdpbf16ps). Reading in place, it runs every row block of its range
/// under each panel, so it wants tall row ranges (gemm_blocks's `tall`).
inline bool a_in_place(const GemmConfig& cfg) { return !cfg.bf16 && !cfg.f16; }

/// Whether A (and W for the GEMV, or the panels' source) hold 16-bit floats: bf16 or f16 bits.
inline bool half_bits(const GemmConfig& cfg) { return cfg.bf16 || cfg.f16; }
/// Whether the panels hold W's 16-bit floats as they are (bf16 without vdpbf16ps, f16), widened
/// by the micro-kernel as it loads them: half the bytes of f32 panels to keep and to stream.
inline bool half_panels(const GemmConfig& cfg) { return half_bits(cfg) && !cfg.dpbf16; }
/// What a kernel's name says of those: "_bf16", "_f16" or nothing.
inline const char* half_suffix(const GemmConfig& cfg) { return cfg.bf16 ? "_bf16" : cfg.f16 ? "_f16" : ""; }

/// Bytes of the packed Bᵀ of an [n, k] weight (cols() columns a panel): f32 panels, or 16-bit ones
/// (half_panels), or bf16 pairs. I: std::int64_t, or the generated code's ir::Int.
///
/// int8_dot: a panel is ceil(K / group) groups, each [group / 4][NR][4] i8 (four consecutive K
/// of a column a 32-bit word; zeros past K and N), then W's scales of the group [NR] f32, then
/// −128 · Σ of the group's entries [NR] i32 (taking back the +128 of the u8 activations).
template <class I>
I gemm_panel_bytes(const GemmConfig& cfg, const I& n, const I& k) {
  const I cols = (n + (cfg.cols() - 1)) / cfg.cols() * cfg.cols();
  if (cfg.int8_dot) return cols * ((k + (cfg.quant_group - 1)) / cfg.quant_group) * (cfg.quant_group + 8);
  return cfg.dpbf16 ? cols * ((k + 1) / 2) * 4 : cols * k * (half_panels(cfg) ? 2 : 4);
}

/// Bytes of a quantized linear's rounded activations, for m rows of K in groups of `group`: f32
/// [m, K] for the GEMV and the f32 GEMM, or (int8_dot) the 8-bit activations and their scales
/// GemmArgs describes — never more than 4 bytes an entry of whole groups.
template <class I>
I rounded_activation_bytes(std::int64_t group, const I& m, const I& k) {
  return m * ((k + (group - 1)) / group) * group * 4;
}

/// GemmSpec's non-zero fields win; the rest is chosen from the target's vector width.
GemmConfig choose_gemm_config(const GemmSpec& spec, const HostTarget& host);

/// Adds the kernel function `name` to `module`.
void emit_gemm_kernel(llvm::Module& module, const GemmConfig& cfg, const std::string& name);

/// What the GEMV kernel reads (its layout is the kernel ABI): x [m, k]; W [n, k] read in place,
/// each of its rows once for all m rows of x — at decode a linear layer is a matrix-vector
/// product whose time is the time to read W, and packing W first would read it twice and write
/// it once; bias [n] (never null: zeros when the call has none); y [m, n].
struct GemvArgs {
  const void* x;  // f32, or bf16 / f16 bits with GemmConfig::bf16 / f16
  const void* w;  // as x, or int8 (q4: two entries a byte) with GemmConfig::quant_group
  const float* bias;
  float* y;
  std::int64_t m, n, k;
  // quantized: [n, ceil(k / quant_group)] f16 (W[o][kk] = q[o][kk] · scale[o][kk / group])
  const std::uint16_t* scales;
};

/// The most rows of x the GEMV kernel takes at once; above it the GEMM packs Bᵀ and runs its
/// micro-kernel — but for a quantized W, whose panels are packed on every call (a pass over all
/// of W): up to kQuantGemvMaxRows rows (batched decoding: 16 sequences a step) W stays read in
/// place, by the GEMV kGemvMaxRows rows of x at a time past each group of W's rows while they are
/// in L1, or with VNNI from kGemvMaxRows + 1 rows by the integer GEMV with x's rows in the lanes
/// (module_quantized.cpp).
inline constexpr int kGemvMaxRows = 4;
inline constexpr int kQuantGemvMaxRows = 32;

/// Outputs per register group of the GEMV kernel for `rows` rows: 8 (4 with 4 rows), at most
/// `lanes` (a power of two).
int gemv_outputs(int rows, int lanes);

/// void name(const GemvArgs* args, i64 n0, i64 n1): y[0, m)[n0, n1) = x·W[n0, n1)ᵀ + bias. Per
/// group of gemv_outputs outputs, per chunk of `rows` rows of x: rows × outputs lane-wise dot
/// products over K (the tail by masked loads), summed by ir::transpose_sum; masked stores past n1
/// and m.
void emit_gemv_kernel(llvm::Module& module, const GemmConfig& cfg, int rows, const std::string& name);

/// A module holding only that function.
std::unique_ptr<llvm::Module> build_gemm_module(llvm::LLVMContext& context, const GemmConfig& cfg,
                                                const std::string& name);

}  // namespace qkv::codegen::cpu
