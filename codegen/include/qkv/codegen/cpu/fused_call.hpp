// qkv/codegen/cpu/fused_call.hpp — how a `fused_attention` node of a lowered graph maps onto the
// fused kernel's AttentionSpec and arguments (attention.hpp), under concrete sizes. The in-process
// executor and the AOT compiler both start from this, so they cannot disagree.
//
// Masks (the node's inputs 3…): a bool keep-mask over [batch, key] goes to the kernel as its
// key-padding bytes; every other mask (bool keep-masks and float biases over [query, key], [key]
// or [query], in that order after the layout pass) is summed into one additive [L, S] bias:
// 0 / −inf for keep-masks, the value for biases.
#pragma once

#include <cstdint>
#include <vector>

#include <qkv/codegen/cpu/attention.hpp>
#include <qkv/ir/graph.hpp>

namespace qkv::codegen::cpu {

struct FusedAttentionCall {
  AttentionSpec spec;
  std::int64_t batch = 1, len_q = 0, len_k = 0;
  std::uint64_t seed = 0;
  std::vector<std::int64_t> out_shape;  // the node's output, laid out [batch, heads…, query, dv]
  int key_padding_input = -1;           // the input index of the [batch, key] keep-mask, or -1
  /// One term of the additive bias: element (i, j) of the mask is at i·stride_q + j·stride_k.
  struct BiasTerm {
    int input = 0;
    bool keep_mask = false;  // bool: false → −inf; float: added
    std::int64_t stride_q = 0, stride_k = 0;
  };
  std::vector<BiasTerm> bias_terms;
};

/// Throws ShapeError when a size the node needs is not bound.
FusedAttentionCall describe_fused_attention(const Graph& lowered, int id, const Bindings& sizes);

}  // namespace qkv::codegen::cpu
