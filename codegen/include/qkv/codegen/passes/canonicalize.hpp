// qkv/codegen/passes/canonicalize.hpp — fold what the DSL's views leave behind.
//
// After this pass: no permute reads a permute (chains are folded into one reordering); no
// permute keeps its input's order (it is replaced by its input); no plain scale reads a plain
// scale (constant factors are multiplied); no f32 pointwise node reads an f32 pointwise node that
// nothing else reads (the two expressions are one node: element-wise math becomes one loop); no
// permute reorders a contraction (through renames) read only by it into contract(b, a)'s order
// (the contraction's operands are swapped instead: a weight's gradient lands in its layout); no
// node is dead (every non-leaf node reaches a graph
// output; inputs and params are kept, since they bind sizes). Node ids are renumbered densely in
// the same topological order.
#pragma once

#include <qkv/ir/graph.hpp>

namespace qkv::codegen {

Graph canonicalize(const Graph& g);

/// The CPU module's graph (built after lower()): chains of element-wise nodes — f32 add, mul and
/// scale by an f32 factor, and pointwise nodes — read once each, become one pointwise node, so
/// that a gradient's element-wise steps (a layer norm's backward: six passes over [tokens, width])
/// run as one loop. Each node's value is computed as its own kernel computes it, bit for bit.
/// Leaves and outputs are kept, in order. (Not in lower(): the GPU plan runs add and scale on the
/// GPU, pointwise nodes on the host.)
Graph fuse_elementwise(const Graph& g);

/// Removes non-leaf nodes that reach no output; ids renumbered, order kept.
Graph eliminate_dead_nodes(const Graph& g);

}  // namespace qkv::codegen
