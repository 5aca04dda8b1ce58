// runtime/src/interpreter_ops.hpp — internal to the reference interpreter: the value type the
// ops compute on, small index helpers, and the op dispatcher (interpreter_ops.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <qkv/ir/graph.hpp>

namespace qkv::interp {

/// A node's value while the graph runs: a dense row-major fp32 array (booleans as 0 / 1).
struct Value {
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

/// The graph broke a rule the DSL enforces (qkv/ir/error.hpp).
using qkv::internal_error;

/// "%3 (softmax)" — how messages name a node.
std::string node_label(const Graph& g, int id);

/// Product of the dimensions (1 for rank 0).
std::int64_t numel(const std::vector<std::int64_t>& shape);

/// Row-major strides of `shape`, in elements.
std::vector<std::int64_t> strides_of(const std::vector<std::int64_t>& shape);

/// Advances a row-major multi-index over `shape`; false once it wraps around past the end.
bool next_index(std::vector<std::int64_t>& idx, const std::vector<std::int64_t>& shape);

/// Everything an op sees: its node, its inputs' nodes and values, the bound sizes, the graph.
struct OpArgs {
  const Graph& graph;
  int id;
  const Node& node;
  std::vector<const Node*> in_nodes;
  std::vector<const Value*> in;
  const Bindings& bindings;
};

/// Computes the value of one non-leaf node (every op except input and param).
Value eval_op(const OpArgs& a);

}  // namespace qkv::interp
