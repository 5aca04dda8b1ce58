// qkv/codegen/lowering/attention_call.hpp — how a `fused_attention` node of a lowered graph maps
// onto the fused kernel's contract (AttentionSpec + its per-call sizes and masks). Every backend
// starts from this, so none can disagree (no LLVM).
//
// Masks (the node's inputs 3…): a bool keep-mask over [batch, key] goes to the kernel as its
// key-padding bytes; every other mask (bool keep-masks and float biases over [query, key], [key]
// or [query], in that order after the layout pass) is combined into one additive [L, S] bias:
// 0 / −inf for keep-masks, the value for biases (combine_masks; the CPU module emits the same
// loop as IR).
#pragma once

#include <cstdint>
#include <vector>

#include <qkv/codegen/cpu/attention.hpp>
#include <qkv/ir/graph.hpp>
#include <qkv/runtime/io/array.hpp>

namespace qkv::codegen {

/// The fused node's call with its sizes as extents: what code compiled once for many sizes needs.
struct AttentionCall {
  cpu::AttentionSpec spec;  // head counts and widths resolved: the kernel is specialised on them
  Extent batch = Extent::fixed(1), len_q, len_k;
  std::uint64_t seed = 0;
  int key_padding_input = -1;  // the input index of the [batch, key] keep-mask, or -1
  /// One term of the additive bias over [query, key], [key] or [query].
  struct BiasTerm {
    int input = 0;
    bool keep_mask = false;  // bool: false → −inf; float: added
    bool has_q = false, has_k = false;
  };
  std::vector<BiasTerm> bias_terms;
};

/// `fixed` must bind every symbol of the head axes, dk, dv and the scale's extent (the kernel is
/// specialised on them); the other sizes may stay symbolic. Throws ShapeError naming the symbol.
AttentionCall describe_attention(const Graph& lowered, int id, const Bindings& fixed);

/// The symbols describe_attention needs bound for node `id`.
std::vector<std::string> attention_kernel_symbols(const Graph& lowered, int id);

/// The same under concrete sizes (every extent bound).
struct FusedAttentionCall {
  cpu::AttentionSpec spec;
  std::int64_t batch = 1, len_q = 0, len_k = 0;
  std::uint64_t seed = 0;
  std::vector<std::int64_t> out_shape;  // the node's output, laid out [batch, heads…, query, dv]
  int key_padding_input = -1;
  /// Element (i, j) of the term's mask is at i·stride_q + j·stride_k.
  struct BiasTerm {
    int input = 0;
    bool keep_mask = false;
    std::int64_t stride_q = 0, stride_k = 0;
  };
  std::vector<BiasTerm> bias_terms;
};

/// Throws ShapeError when a size the node needs is not bound.
FusedAttentionCall describe_fused_attention(const Graph& lowered, int id, const Bindings& sizes);

/// The kernel's key-padding bytes [B, S] (1 = may attend) and additive bias [L, S] from the node's
/// mask inputs (`in[k]` is input k of the node; only the mask inputs are read). Either output may
/// be null; a call without such masks leaves it empty.
void combine_masks(const FusedAttentionCall& call, const std::vector<const NdArray*>& in,
                   std::vector<std::uint8_t>* key_keep, std::vector<float>* bias);

}  // namespace qkv::codegen
