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

/// Node `id` is a fused_attention or a fused_attention_backward (the same contract; its tensors
/// follow q, k, v, out, d_out and lse). `fixed` must bind every symbol of the head axes, dk, dv and the scale's extent
/// (the kernel is specialised on them); the other sizes may stay symbolic. Throws ShapeError naming the symbol.
AttentionCall describe_attention(const Graph& lowered, int id, const Bindings& fixed);

/// The attention_dtensor nodes of fused_attention_backward `id` that hold the gradient of its mask
/// tensor `tensor` (its input 6 + tensor), in id order.
std::vector<int> tensor_grad_nodes(const Graph& lowered, int id, int tensor);

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

}  // namespace qkv::codegen
