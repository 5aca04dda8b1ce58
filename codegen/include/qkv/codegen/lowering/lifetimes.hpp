// qkv/codegen/lowering/lifetimes.hpp — when each value of a lowered graph is alive, and which
// values can share memory: the one lifetime analysis of every backend (no LLVM).
//
// A value is alive from the node that writes it to its last reader; a view (split, merge,
// rename, view) or a dequantize read in place shares its input's memory, so it extends its root's life; graph outputs
// live to the end. Blocks whose lives do not overlap share a slot (greedy in order of birth, the largest free slot
// first); a slot is as large as its largest block. Sizes only steer the choice of slot: the assignment is correct for
// any sizes, so code compiled for dynamic sizes computes the slot sizes (a max over their blocks) at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <qkv/ir/graph.hpp>

namespace qkv::codegen {

/// Per node: the id of its last reader; g.size() for graph outputs; -1 if nothing reads it.
std::vector<int> last_uses(const Graph& g);

/// Whether node `id`'s value is its first input's memory: a view (the same bytes under other axes),
/// or a dequantize that only linear layers read (their kernels read its q in place:
/// select.hpp's dequantize_in_linear). Such a node has no memory of its own on any CPU path.
bool shares_input_memory(const Graph& g, int id);

/// Per node: the node whose memory it is (itself, or for a node that shares its input's memory,
/// that input's root).
std::vector<int> memory_roots(const Graph& g);

/// Per node: the last node at which its memory (its root's, for a view) is still read.
std::vector<int> memory_ends(const Graph& g);

/// A block of memory alive over [start, end] (node ids, inclusive) of about `bytes` bytes.
struct Lifetime {
  int start = 0, end = 0;
  std::int64_t bytes = 0;
};

/// The slot of each block (0, 1, …) such that blocks in one slot are never alive together.
std::vector<int> assign_slots(const std::vector<Lifetime>& blocks);

/// The memory of a whole graph under concrete sizes: every value that is not a leaf or a view
/// has a slot (a view has its root's), slots reused once their values are dead.
struct BufferPlan {
  std::vector<int> last_use;  // per node (last_uses)
  std::vector<int> slot;      // per node; -1 for leaves (fed by the caller)
  std::vector<std::size_t> slot_bytes;
  std::size_t peak_bytes = 0;      // the sum of the slots
  std::size_t unshared_bytes = 0;  // what one buffer per value would take
};
BufferPlan plan_buffers(const Graph& g, const Bindings& sizes);

}  // namespace qkv::codegen
