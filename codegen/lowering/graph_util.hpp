// codegen/lowering/graph_util.hpp — small facts about nodes and dense layouts that every executor and
// code generator of qkv::codegen needs (private; no LLVM). Axes are matched by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <qkv/ir/graph.hpp>

namespace qkv::codegen::util {

using Shape = std::vector<std::int64_t>;

using qkv::is_view;  // the op table (qkv/ir/ops.hpp)

inline std::int64_t numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

/// Row-major strides (in elements) of a dense shape.
inline Shape strides_of(const Shape& s) {
  Shape st(s.size(), 1);
  for (std::size_t k = s.size(); k-- > 1;) st[k - 1] = st[k] * s[k];
  return st;
}

/// Position of the axis `name`; a logic_error if it is not there.
inline std::size_t axis_pos(const std::vector<Axis>& axes, const std::string& name, const char* who = "codegen") {
  for (std::size_t k = 0; k < axes.size(); ++k)
    if (axes[k].name == name) return k;
  internal_error(std::string(who) + ": no axis `" + name + "`");
}

/// For each axis of `target`, the stride of the same-named axis of `src` (0: broadcast along it).
inline Shape strides_by_name(const std::vector<Axis>& target, const std::vector<Axis>& src, const Shape& src_shape) {
  const Shape st = strides_of(src_shape);
  Shape out(target.size(), 0);
  for (std::size_t t = 0; t < target.size(); ++t)
    for (std::size_t k = 0; k < src.size(); ++k)
      if (src[k].name == target[t].name) out[t] = st[k];
  return out;
}

/// The same axis names in the same order.
inline bool same_axes(const std::vector<Axis>& a, const std::vector<Axis>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k)
    if (a[k].name != b[k].name) return false;
  return true;
}

/// The names of `axes`, in order.
inline std::vector<std::string> names(const std::vector<Axis>& axes) {
  std::vector<std::string> out;
  for (const Axis& a : axes) out.push_back(a.name);
  return out;
}

/// Whether `axes` are, by name, `first` then `second` (a tensor laid out as that matrix).
inline bool laid_out(const std::vector<Axis>& axes, const std::vector<std::string>& first,
                     const std::vector<std::string>& second) {
  if (axes.size() != first.size() + second.size()) return false;
  for (std::size_t i = 0; i < axes.size(); ++i)
    if (axes[i].name != (i < first.size() ? first[i] : second[i - first.size()])) return false;
  return true;
}

/// A linear node whose projected axis is x's contiguous (last) one and stays last: a GEMM
/// y[M, out] = x[M, in]·Wᵀ + b.
inline bool linear_on_last_axis(const Graph& g, const Node& n) {
  return n.op == Op::linear && n.attr_axes.size() == 2 && !g.node(n.inputs[0]).axes.empty() &&
         g.node(n.inputs[0]).axes.back().name == n.attr_axes[0] && !n.axes.empty() &&
         n.axes.back().name == n.attr_axes[1];
}

/// A layer norm over its input's contiguous (last) axis: independent rows.
inline bool layer_norm_on_last_axis(const Graph& g, const Node& n) {
  return n.op == Op::layer_norm && n.attr_axes.size() == 1 && !g.node(n.inputs[0]).axes.empty() &&
         g.node(n.inputs[0]).axes.back().name == n.attr_axes[0];
}

}  // namespace qkv::codegen::util
