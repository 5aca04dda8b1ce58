// qkv/codegen/passes/layout.hpp — put fused attention's operands in the kernel's layout.
//
// After this pass: every fused_attention reads q as [batch, heads..., group..., query, dk],
// k as [batch, heads..., key, dk], v as [batch, heads..., key, dv] and masks as [batch, key] or
// [query, key], and produces [batch, heads..., group..., query, dv] (attention_weights:
// [..., query, key]); where the graph had another order, a permute node moves the data in or
// out. The CPU kernel then reads dense row-major tensors. (Weights of linear layers are used in
// PyTorch's [out, in] layout as stored.)
#pragma once

#include <qkv/ir/graph.hpp>

namespace qkv::codegen {

Graph layout(const Graph& g);

}  // namespace qkv::codegen
