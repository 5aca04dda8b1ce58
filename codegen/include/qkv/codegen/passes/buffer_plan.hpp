// qkv/codegen/passes/buffer_plan.hpp — which intermediate values can share memory.
//
// After this pass (an analysis; the graph is unchanged): every node has the id of its last
// consumer (graph outputs live to the end), and under concrete sizes every non-leaf value has a
// buffer slot, slots reused once their value is dead (greedy, largest-fit), with the peak and the
// no-reuse total in bytes. The executor frees values at their last use.
#pragma once

#include <cstddef>
#include <vector>

#include <qkv/codegen/lowering/lifetimes.hpp>
#include <qkv/ir/graph.hpp>

namespace qkv::codegen {

struct BufferPlan {
  std::vector<int> last_use;  // per node; g.size() for graph outputs
  std::vector<int> slot;      // per node; -1 for leaves (fed by the caller)
  std::vector<std::size_t> slot_bytes;
  std::size_t peak_bytes = 0;      // the sum of the slots
  std::size_t unshared_bytes = 0;  // what one buffer per value would take
};

BufferPlan plan_buffers(const Graph& g, const Bindings& sizes);

}  // namespace qkv::codegen
