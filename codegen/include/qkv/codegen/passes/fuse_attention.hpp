// qkv/codegen/passes/fuse_attention.hpp — recognise attention and make it one node.
//
// After this pass: every chain
//     contract<Dk>(q, k) → {scale, keep_mask, bias, causal, score_mod}* → softmax<Key> → [dropout] → contract<Key>(·,
//     v)
// whose intermediate values are used only inside the chain (or, for the weights, as a graph
// output) and whose masks the fused kernel supports (a key-padding keep-mask over
// [batch, key], keep-masks or biases over [query, key]) is one `fused_attention` node with
// inputs (q, k, v, masks...) and AttentionAttrs naming the roles of the axes — including the
// multi-head layout ([batch, heads, query, dk]) and GQA (query heads grouped over shared
// key/value heads). When the weights are a graph output, an `attention_weights` node reads them
// from the fused node; a logsumexp<Key> of the softmax's input becomes an `attention_lse` node
// reading the statistic the kernel keeps anyway. The replaced chain is left dead (canonicalize
// removes it).
#pragma once

#include <qkv/ir/graph.hpp>

namespace qkv::codegen {

Graph fuse_attention(const Graph& g);

}  // namespace qkv::codegen
