// runtime/src/interpreter_ops.hpp — internal to the reference interpreter: the value type the
// ops compute on, small index helpers, and the op dispatcher (interpreter_ops.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
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

// --- the ops' shared helpers (interpreter_ops.cpp) ----------------------------------------------

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
using Shape = std::vector<std::int64_t>;

/// "(2, 3)".
std::string shape_str(const Shape& s);
/// "%3 (softmax): " — the start of a message about the node being evaluated.
std::string where(const OpArgs& a);
bool has_axis(const std::vector<Axis>& axes, std::string_view name);
bool has_name(const std::vector<std::string>& names, std::string_view name);
/// Position of the axis `name` in `axes`; an internal error if it is not there.
std::size_t axis_pos(const OpArgs& a, const std::vector<Axis>& axes, std::string_view name, std::string_view whose);
/// The number of inputs the op table (qkv/ir/ops.hpp) gives the node's op.
void expect_inputs(const OpArgs& a);
void expect_attrs(const OpArgs& a, std::size_t n);
/// The size of a declared output axis under the bindings.
std::int64_t bound_extent(const OpArgs& a, const Axis& ax);
/// The node's declared output shape (node.axes) under the bindings.
Shape declared_shape(const OpArgs& a);
/// For each name in `target`, the stride of the same-named axis of a value laid out as `src`
/// (0 where `src` has no such axis: the value is broadcast along it).
Shape strides_by_name(const std::vector<std::string>& target, const std::vector<Axis>& src, const Shape& src_shape);
std::vector<std::string> names_of(const std::vector<Axis>& axes);
std::int64_t dot(const Shape& idx, const Shape& strides);
/// A shape seen as [outer, n, inner] around dimension p: element (o, k, i) is at (o*n + k)*inner + i.
struct Around {
  std::int64_t outer = 1, n = 1, inner = 1;
};
Around around(const Shape& s, std::size_t p);
/// `s` without dimension p (a reduction's output shape).
Shape without_axis(Shape s, std::size_t p);
/// Sizes that must agree by construction (the DSL checked them, or recorded a constraint).
void expect_same_size(const OpArgs& a, const std::string& axis, std::int64_t lhs, std::int64_t rhs);
/// f applied to every element of the one input.
Value unary_map(const OpArgs& a, float (*f)(float));

/// mod_eval's environment (qkv/ir/mod_expr.hpp) at one entry of the scores: `axes` (their
/// extents `shape`), the entry's coordinates `idx`; a load of input n reads tensors[n + shift]
/// (row-major over its own shape).
struct ModEnv {
  const std::vector<Axis>& axes;
  const Shape& shape;
  const Shape& idx;
  const std::vector<const Value*>& tensors;
  int shift = 0;
  [[nodiscard]] std::size_t pos(const std::string& axis) const {
    for (std::size_t k = 0; k < axes.size(); ++k)
      if (axes[k].name == axis) return k;
    internal_error("mod expression: the scores have no axis `" + axis + "`");
  }
  [[nodiscard]] const Value& tensor(int input) const { return *tensors[static_cast<std::size_t>(input + shift)]; }
  [[nodiscard]] double index(const std::string& axis) const { return static_cast<double>(idx[pos(axis)]); }
  [[nodiscard]] double length(const std::string& axis) const { return static_cast<double>(shape[pos(axis)]); }
  [[nodiscard]] std::int64_t extent(int input, std::size_t k) const { return tensor(input).shape[k]; }
  /// The row-major offset of the element a load of `input` reads at `at` (in range).
  [[nodiscard]] std::size_t offset(int input, const std::vector<double>& at) const {
    std::int64_t off = 0;
    for (std::size_t k = 0; k < at.size(); ++k) off = off * tensor(input).shape[k] + static_cast<std::int64_t>(at[k]);
    return static_cast<std::size_t>(off);
  }
  [[nodiscard]] double load(int input, const std::vector<double>& at) const {
    const Value& t = tensor(input);
    return t.data.empty() ? 0.0 : static_cast<double>(t.data[offset(input, at)]);
  }
};

// --- the fused attention nodes (interpreter_attention.cpp) --------------------------------------

/// fused_attention: {out, lse (score axes without the key), weights (score axes)}, the latter two
/// in the order [batch, heads..., group..., query(, key)].
std::vector<Value> eval_fused_attention(const OpArgs& a);
/// The lse / weights value `side` of the fused node `fused`, laid out as the companion a.node.
Value attention_side_value(const OpArgs& a, const Node& fused, const Value& side, bool weights);
/// fused_attention_backward: {dq, dk, dv, one gradient per captured tensor (input 6 + i; zero
/// where the score part does not read it)}, each laid out as its primal.
std::vector<Value> eval_attention_backward(const OpArgs& a);

// --- the decoder ops (interpreter_decoder_ops.cpp) ----------------------------------------------

Value op_rms_norm(const OpArgs& a);
Value op_silu(const OpArgs& a);
Value op_rope(const OpArgs& a);
Value op_embedding(const OpArgs& a);
Value op_embedding_grad(const OpArgs& a);
Value op_argmax(const OpArgs& a);
Value op_update_slice(const OpArgs& a);
Value op_dequantize(const OpArgs& a);

}  // namespace qkv::interp
