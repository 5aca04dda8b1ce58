// qkv/codegen/lowering/select.hpp — which kind of kernel runs each node of a lowered graph: the
// one table every backend reads (no LLVM). A backend implements kinds; where it has no
// implementation of a kind it says so in its own kind → implementation table (docs/architecture.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <qkv/ir/graph.hpp>

namespace qkv::codegen {

enum class KernelKind : std::uint8_t {
  leaf,                // input / param: the caller's buffer
  view,                // split, merge, rename, view: the input's memory under other axes (no code)
  fused_attention,     // the flash-style attention kernel
  attention_weights,   // written by its fused_attention input (no code of its own)
  attention_lse,       // likewise: the log-sum-exp its fused_attention input wrote
  attention_backward,  // FlashAttention-2's backward (dQ; dK and dV into its companions)
  attention_grads,     // attention_dk / attention_dv / attention_dtensor: written by their attention_backward input
  gemm,                // linear whose features are the contiguous axis: y = x·Wᵀ + b
  linear_strided,      // linear over another axis
  layer_norm_rows,     // layer norm over the contiguous axis: independent rows
  layer_norm_strided,  // layer norm over another axis
  unary,               // relu, gelu, silu, scale: one value in, one out, same layout
  add_same,            // add of two tensors with the same axes and sizes (the residual add)
  broadcast_binary,    // add, mul, bias, keep_mask with the rhs broadcast by name
  strided_copy,        // permute, broadcast, slice, concat: a strided read into a dense write
  fill,                // a constant
  softmax,             // along one axis, max-subtracted, empty rows → 0
  logsumexp,           // along one axis (dropped), empty rows → −inf
  causal,              // the causal mask outside a fused attention
  dropout,             // the counter-based dropout outside a fused attention
  contract,            // a general contraction outside a fused attention
  score_mod,       // a mod expression entry by entry: a score / mask mod outside a fused attention, a pointwise node
  rms_norm,        // RMSNorm along one axis
  rope,            // the rotary embedding, pair by pair of features
  embedding,       // rows of a table gathered by ids (an id out of range: status 3)
  embedding_grad,  // a table's gradient: dy's rows added into the rows their ids name
  argmax,          // along one axis (dropped)
  update_slice,    // rows written into a copy of x (in place when the output is x's buffer)
  convert,         // the values stored as another dtype (f32 <-> f16 / bf16)
  dequantize,      // a quantized weight's values (q · its group's scale), written out
  dequantize_in_linear,  // a quantized weight only linear layers read: their kernels read q and the
                         // scales as stored (no code, no buffer of its own)
};

/// The linear kernels read a quantized weight a vector at a time, and a vector must not straddle
/// two groups: they take groups of a multiple of this many entries (every target's f32 lanes).
inline constexpr std::int64_t kQuantGroupQuantum = 16;

/// Whether dequantize node `id` is read only as the weight [out, in] of linear layers on the GEMM /
/// GEMV kernels, from an i8 q and f16 scales the caller passes (array leaves) in groups of a
/// multiple of kQuantGroupQuantum (a q4 q: of 2 · kQuantGroupQuantum, so that each half of a group
/// — one nibble of its bytes — is whole vectors, and q's static bytes a row whole groups), and is no
/// graph output: those kernels read q and the scales as stored, and the weight is never written out.
bool dequantize_in_linear(const Graph& lowered, int id);

/// A contraction's roles as GEMMs, C[M, N] = Σ_K A[M, K]·B[K, N] per batch index: `a` is the
/// input whose axis comes first in the output (so that M's axes lead C as they lead the output),
/// the output's axes split into `batch` (in both inputs), `m` (a's alone) and `n` (b's alone), and
/// `k` the contracted axes in a's order. Nullopt — not a GEMM — when an output axis is in neither
/// input, an input has an axis neither kept nor contracted, or M, N or K has no axis.
struct GemmRoles {
  int a = -1, b = -1;
  std::vector<Axis> batch, m, n, k;
};
std::optional<GemmRoles> contract_gemm_roles(const Graph& lowered, int id);

/// A contraction with a `fill` (a sum: a bias's or a norm weight's gradient; with no output axes,
/// a whole tensor's sum: a gradient's squared norm) over x laid out as [C..., O...] (columns: sums
/// down columns) or [O..., C...] (rows; a whole sum is one row), C the contracted axes in order:
/// x's id and which. Nullopt otherwise.
struct FillSums {
  int x = -1, fill = -1;
  bool columns = false;
};
std::optional<FillSums> contract_fill_sums(const Graph& lowered, int id);

/// Whether fill node `id` is read only by such sums (which take its value, not its entries): it
/// is never written.
bool fill_only_summed(const Graph& lowered, int id);

/// Whether node `id` is an element-wise value that only such sums read (x of each), and that
/// they compute entry by entry as they add it up instead of reading it (never written; a bf16 or
/// f16 value rounded as its store would round it): a pointwise node (no keep predicate, no
/// positions; float inputs of its own axes, loaded at its own coordinates), or an add or mul of
/// two float values of its axes. A norm's backward sums several such products over a row or
/// down a column.
bool elementwise_only_summed(const Graph& lowered, int id);

/// The kind that runs node `id`.
KernelKind select_kernel(const Graph& lowered, int id);

std::string_view kernel_kind_name(KernelKind kind);

}  // namespace qkv::codegen
