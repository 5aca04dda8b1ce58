// qkv/ir/ops.hpp — the one table of what every op of the Graph IR is: its name, how many inputs
// it takes, whether it only reinterprets its input's memory (a view), whether its output keeps
// its first input's axes, and what its attributes mean. op_name, verify, the interpreter's
// argument checks, the lifetime analysis and the kernel selection all read this table.
//
// Plain data, no templates: the DSL, codegen and the runtime include it alike.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace qkv {

/// Every op a DSL program can contain (the attributes each reads: kOps below).
enum class Op : std::uint8_t {
  input,
  param,
  contract,
  add,
  mul,
  scale,
  split,
  merge,
  permute,
  rename,
  view,
  softmax,
  keep_mask,
  bias,
  causal,
  dropout,
  concat,
  layer_norm,
  relu,
  gelu,
  linear,
  broadcast,
  fill,
  fused_attention,
  attention_weights,
  slice,
  score_mod,
  logsumexp,
  attention_lse,
  rms_norm,
  silu,
  rope,
  embedding,
  argmax,
  update_slice,
  convert,
  pointwise,
  fused_attention_backward,
  attention_dk,
  attention_dv,
  dequantize,
  attention_dtensor,
  embedding_grad,
};

struct OpInfo {
  Op op;
  std::string_view name;
  int min_inputs = 0, max_inputs = 0;  // max -1: any number
  bool view = false;                   // shares its input's memory (same bytes under other axes)
  bool keeps_axes = false;             // the output has exactly its first input's axes, in order
  bool codegen_only = false;           // made by the pass pipeline, never by the DSL
  std::string_view attributes;         // what attr_axes / scalar / seed / align / mask / offset / dim mean
};

inline constexpr std::array<OpInfo, 43> kOps{{
    {Op::input, "input", 0, 0, false, false, false,
     "name: the feed; with dim (no axes, an integer dtype): a run-time size fed by value, the scalar binds dim"},
    {Op::param, "param", 0, 0, false, false, false, "name: the weight or bias"},
    {Op::contract, "contract", 2, 2, false, false, false,
     "attr_axes: the contracted axes; sum of lhs*rhs, other axes matched by name"},
    {Op::add, "add", 2, 2, false, true, false, "rhs broadcast into lhs by name"},
    {Op::mul, "mul", 2, 2, false, true, false, "rhs broadcast into lhs by name"},
    {Op::scale, "scale", 1, 1, false, true, false, "x * scalar; with dim: x / sqrt(dim)"},
    {Op::split, "split", 1, 1, true, false, false, "attr_axes[0] -> the output's axes attr_axes[1..]"},
    {Op::merge, "merge", 1, 1, true, false, false, "attr_axes[0..n-1] (adjacent) -> attr_axes[n]"},
    {Op::permute, "permute", 1, 1, false, false, false, "the output's axes give the order"},
    {Op::rename, "rename", 1, 1, true, false, false, "attr_axes[0] -> attr_axes[1]"},
    {Op::view, "view", 1, 1, true, false, false, "extents reinterpreted; names and order unchanged"},
    {Op::softmax, "softmax", 1, 1, false, true, false, "over attr_axes[0]; a row with no visible key -> 0"},
    {Op::keep_mask, "keep_mask", 2, 2, false, true, false, "(x, bool mask): masked-out entries -> -inf; mask_kind"},
    {Op::bias, "bias", 2, 2, false, true, false, "(x, float bias): x + bias broadcast by name"},
    {Op::causal, "causal", 1, 1, false, true, false, "attr_axes = {query, key}; align: top-left / bottom-right"},
    {Op::dropout, "dropout", 1, 1, false, true, false, "scalar: p; seed: the counter-based RNG key"},
    {Op::concat, "concat", 1, -1, false, false, false, "along attr_axes[0]"},
    {Op::layer_norm, "layer_norm", 3, 3, false, true, false, "(x, gamma, beta) over attr_axes[0]; scalar: eps"},
    {Op::relu, "relu", 1, 1, false, true, false, ""},
    {Op::gelu, "gelu", 1, 1, false, true, false, "exact (erf) form"},
    {Op::linear, "linear", 2, 3, false, false, false, "(x, W[out, in], b?): attr_axes = {in axis of x, out axis}"},
    {Op::broadcast, "broadcast", 1, 1, false, false, false, "the input repeated along the output's axes it lacks"},
    {Op::fill, "fill", 0, 0, false, false, false, "scalar: the constant"},
    {Op::fused_attention, "fused_attention", 3, -1, false, false, true,
     "(q, k, v, masks...): attention (AttentionAttrs)"},
    {Op::attention_weights, "attention_weights", 1, 1, false, false, true,
     "the weights its fused_attention input wrote (write_weights)"},
    {Op::slice, "slice", 1, 1, false, false, false,
     "part `offset` of attr_axes[0]: [offset*P, (offset+1)*P), P the extent of attr_axes[1]; with dim: elements "
     "[dim, dim + P)"},
    {Op::score_mod, "score_mod", 1, -1, false, true, false,
     "(scores, captured tensors...): mod (ModExpr): keep ? score' : -inf per entry"},
    {Op::logsumexp, "logsumexp", 1, 1, false, false, false,
     "log sum exp over attr_axes[0] (dropped from the output); a row of only -inf -> -inf"},
    {Op::attention_lse, "attention_lse", 1, 1, false, false, true,
     "the log-sum-exp of the scores its fused_attention input wrote (write_lse)"},
    {Op::rms_norm, "rms_norm", 2, 2, false, true, false,
     "(x, weight) over attr_axes[0]: x / sqrt(mean(x^2) + scalar) * weight; scalar: eps"},
    {Op::silu, "silu", 1, 1, false, true, false, "x * sigmoid(x)"},
    {Op::rope, "rope", 2, 2, false, true, false,
     "(x, positions): rotate-half rotary embedding over attr_axes[0] at the positions, which index attr_axes[1] "
     "(RopeAttrs)"},
    {Op::embedding, "embedding", 2, 2, false, false, false,
     "(table [attr_axes[0], attr_axes[1]], ids): row ids[...] of the table; output: the ids' axes, then attr_axes[1]"},
    {Op::argmax, "argmax", 1, 1, false, false, false,
     "index of the first largest entry along attr_axes[0] (dropped from the output); a NaN counts as largest"},
    {Op::update_slice, "update_slice", 3, 3, false, true, false,
     "(x, rows, start): x with rows written at [dim, dim + n) of attr_axes[0], n the extent of rows' attr_axes[1]; "
     "start: the size input of dim (a KV cache's append)"},
    {Op::convert, "convert", 1, 1, false, true, false,
     "the input's values as this node's dtype (f32, f16, bf16; rounded to nearest, ties to even)"},
    {Op::pointwise, "pointwise", 1, -1, false, true, false,
     "(x, tensors...): mod (ModExpr) `score` per entry of x: its `score` leaf is x's entry, its loads read the "
     "other inputs (broadcast by name: indexed by the entry's coordinates); keep is -1"},
    {Op::fused_attention_backward, "fused_attention_backward", 6, -1, false, false, true,
     "(q, k, v, out, d_out, lse, masks...): dQ of the attention its AttentionAttrs describe (FlashAttention-2's "
     "backward; dK and dV are its attention_dk / attention_dv companions)"},
    {Op::attention_dk, "attention_dk", 1, 1, false, false, true, "dK its fused_attention_backward input wrote"},
    {Op::attention_dv, "attention_dv", 1, 1, false, false, true, "dV its fused_attention_backward input wrote"},
    {Op::dequantize, "dequantize", 2, 2, false, true, false,
     "(q, scale): a weight stored as integers (q: i8, any axes) with one scale (f32 / f16 / bf16) per `offset` "
     "consecutive entries of the last axis: q[..., k] * scale[..., k / offset]; scale has q's axes with the last "
     "one's extent ceil(K / offset). scalar 4: q holds two 4-bit entries a byte (K / 2 bytes a row, K a multiple "
     "of offset; ir/quant.hpp's order), each worth nibble - 8"},
    {Op::attention_dtensor, "attention_dtensor", 1, 1, false, false, true,
     "the gradient of the tensor its fused_attention_backward input reads as input 6 + offset (one its score "
     "modification loads), which that node wrote"},
    {Op::embedding_grad, "embedding_grad", 2, 2, false, false, false,
     "(dy [ids' axes..., attr_axes[1]], ids): the gradient of an embedding's table [attr_axes[0], attr_axes[1]]: "
     "row r is the sum of dy's rows whose id is r, in the ids' order (an id outside the rows adds to none)"},
}};

/// What an op value outside the enum (a corrupt graph) reads as: name "?", any inputs.
inline constexpr OpInfo kUnknownOp{Op::input, "?", 0, -1, false, false, false, "not an op"};

/// The table's row for `op`.
constexpr const OpInfo& op_info(Op op) {
  const auto k = static_cast<std::size_t>(op);
  return k < kOps.size() ? kOps[k] : kUnknownOp;
}

static_assert(
    [] {
      for (std::size_t k = 0; k < kOps.size(); ++k)
        if (static_cast<std::size_t>(kOps[k].op) != k) return false;
      return true;
    }(),
    "kOps must list the ops in the order of the enum");

inline std::string_view op_name(Op op) { return op_info(op).name; }

/// Ops that only reinterpret their input's memory.
constexpr bool is_view(Op op) { return op_info(op).view; }

}  // namespace qkv
