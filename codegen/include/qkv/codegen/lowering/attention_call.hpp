// qkv/codegen/lowering/attention_call.hpp — how a `fused_attention` node of a lowered graph maps
// onto the fused kernel's contract (AttentionSpec + its per-call sizes and masks). Every backend
// starts from this, so none can disagree (no LLVM).
//
// Every score / mask modification is in the node's mod expression (AttentionAttrs::mod); the
// spec carries it with its loads renumbered onto spec.tensors (tensor k = the node's input 3 + k)
// and the score axes' roles (spec.axes).
#pragma once

#include <cstdint>
#include <optional>
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
  std::vector<int> tensor_inputs;  // the node's inputs read by the mod: spec.tensors, in order
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
  std::vector<int> tensor_inputs;
  std::vector<std::int64_t> tensor_extents;  // AttentionArgs::extents: every tensor's, concatenated
};

/// Throws ShapeError when a size the node needs is not bound.
FusedAttentionCall describe_fused_attention(const Graph& lowered, int id, const Bindings& sizes);

/// How the tiles of one (batch, head) stand under the fused node's keep predicate: the host-side
/// reference of the bounds the kernels emit (mod_classify over each tile's index ranges; a load
/// whose indices range over the tile is bounded by scanning its values, as the CPU kernel does).
/// Row-major [ceil(L / tile_q)][ceil(S / tile_k)]. `in[k]` is input k of the node (only the mod's
/// tensors are read). For lessons, tests and tools, not the hot path.
std::vector<BlockClass> classify_tiles(const Graph& lowered, int id, const std::vector<const NdArray*>& in,
                                       const Bindings& sizes, std::int64_t batch, std::int64_t head,
                                       std::int64_t tile_q, std::int64_t tile_k);

/// What the PTX attention kernel's flags express (it takes no mod expression yet): a causal
/// mask, one key-padding keep-mask over [batch, key], and an additive [L, S] bias combined from
/// biases and keep-masks over [query, key], [query] or [key]. `classic_masks` recognises a mod
/// that is only that (what masked / biased / causal make); nullopt for anything else.
struct ClassicMasks {
  bool causal = false;
  CausalAlign align = CausalAlign::top_left;
  int key_padding_input = -1;  // the node input of the [batch, key] keep-mask, or −1
  struct BiasTerm {
    int input = 0;
    bool keep_mask = false;                   // bool: false → −inf; float: added
    std::int64_t stride_q = 0, stride_k = 0;  // element (i, j) at i·stride_q + j·stride_k
  };
  std::vector<BiasTerm> bias_terms;
};
std::optional<ClassicMasks> classic_masks(const Graph& lowered, int id, const Bindings& sizes);

/// The kernel's key-padding bytes [B, S] (1 = may attend) and additive bias [L, S] from the
/// node's inputs (`in[k]` is input k of the node; only the mask inputs are read). Either output
/// may be null; a call without such masks leaves it empty.
void combine_masks(const FusedAttentionCall& call, const ClassicMasks& masks, const std::vector<const NdArray*>& in,
                   std::vector<std::uint8_t>* key_keep, std::vector<float>* bias);

}  // namespace qkv::codegen
