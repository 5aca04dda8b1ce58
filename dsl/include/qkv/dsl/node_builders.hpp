// qkv/dsl/node_builders.hpp — the graph-building halves of the DSL's ops, as plain functions.
//
// An op is a template: its checks are done on types, by the compiler, and each instantiation
// (one per combination of axes) is a function of its own. The node it records only needs the
// axis names and static sizes, so that part lives here, written once: an instantiation passes
// names and sizes and gets the node's id back. Kept out of line ([[gnu::noinline]]): inlined
// into every instantiation, the vector and string code of a node was most of what a model's
// translation unit gave the optimiser (docs/performance.md, "Compile time").
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <qkv/dsl/tensor.hpp>
#include <qkv/ir/graph.hpp>

namespace qkv::detail {

/// An axis of the IR as a type declares it: a static extent, or a dynamic one whose size symbol
/// is the axis name (what ir_extent<A>() gives).
[[gnu::noinline]] inline Axis ir_axis_of(std::string_view name, bool is_static, std::int64_t extent) {
  return Axis{std::string(name), is_static ? Extent::fixed(extent) : Extent::dynamic(std::string(name))};
}

/// A parameter `name` with the given axes; returns its id.
[[gnu::noinline]] inline int add_param(Graph& g, std::string name, std::vector<Axis> axes) {
  Node n;
  n.op = Op::param;
  n.name = std::move(name);
  n.axes = std::move(axes);
  return g.add(std::move(n));
}

/// A node of `op` reading `inputs`, with the given output axes, dtype, attribute axes and label.
[[gnu::noinline]] inline int add_node(Graph& g, Op op, std::vector<int> inputs, std::vector<Axis> axes, DType dtype,
                                      std::vector<std::string> attr_axes = {}, std::string name = {}) {
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.axes = std::move(axes);
  n.dtype = dtype;
  n.attr_axes = std::move(attr_axes);
  n.name = std::move(name);
  return g.add(std::move(n));
}

/// The axes of node `id` with the one named `name` replaced by `with` (in place).
[[gnu::noinline]] inline std::vector<Axis> replaced_axes(const Graph& g, int id, std::string_view name,
                                                         std::vector<Axis> with) {
  std::vector<Axis> out;
  for (const auto& a : g.node(id).axes) {
    if (a.name == name)
      out.insert(out.end(), with.begin(), with.end());
    else
      out.push_back(a);
  }
  return out;
}

/// merge: axes `a` and `b` of node `id` (adjacent, in this order) into one axis `into`.
[[gnu::noinline]] inline int add_merge(Graph& g, int id, DType dtype, std::string_view a, std::string_view b,
                                       std::string_view into) {
  const Node& t = g.node(id);
  const Extent ea = ir_axis(t, a).extent, eb = ir_axis(t, b).extent;
  Extent em = ea.is_static() ? eb.times(ea.value) : ea.times(eb.is_static() ? eb.value : 1);
  if (ea.is_dynamic() && eb.is_dynamic()) em = Extent::dynamic(std::string(into));  // bound separately
  std::vector<Axis> axes_out;
  for (const auto& x : t.axes) {
    if (x.name == b) continue;
    axes_out.push_back(x.name == a ? Axis{std::string(into), em} : x);
  }
  return add_node(g, Op::merge, {id}, std::move(axes_out), dtype, {std::string(a), std::string(b), std::string(into)});
}

/// permute: the axes of node `id` in the order of `names`.
[[gnu::noinline]] inline int add_permute(Graph& g, int id, DType dtype, std::initializer_list<std::string_view> names) {
  std::vector<Axis> out;
  out.reserve(names.size());
  for (std::string_view n : names) out.push_back(ir_axis(g.node(id), n));
  return add_node(g, Op::permute, {id}, std::move(out), dtype);
}

/// rename: axis `from` of node `id` called `to`.
[[gnu::noinline]] inline int add_rename(Graph& g, int id, DType dtype, std::string_view from, std::string_view to) {
  Axis renamed = ir_axis(g.node(id), from);
  renamed.name = std::string(to);
  std::string to_name = renamed.name;
  return add_node(g, Op::rename, {id}, replaced_axes(g, id, from, {std::move(renamed)}), dtype,
                  {std::string(from), std::move(to_name)});
}

/// contract: node a times node b summed over the axes `over`; a's other axes, then b's new ones.
[[gnu::noinline]] inline int add_contract(Graph& g, int a, int b, DType dtype,
                                          std::initializer_list<std::string_view> over) {
  std::vector<std::string> attr_axes(over.begin(), over.end());
  auto named = [](const auto& list, std::string_view n) {
    for (const auto& x : list)
      if (x == n) return true;
    return false;
  };
  std::vector<Axis> axes;
  for (const auto& x : g.node(a).axes)
    if (!named(attr_axes, x.name)) axes.push_back(x);
  for (const auto& x : g.node(b).axes) {
    bool taken = named(attr_axes, x.name);
    for (const auto& y : axes) taken = taken || y.name == x.name;
    if (!taken) axes.push_back(x);
  }
  return add_node(g, Op::contract, {a, b}, std::move(axes), dtype, std::move(attr_axes));
}

/// linear: axis `in` of node x replaced by `out` (weight [out, in], bias [out] unless -1).
[[gnu::noinline]] inline int add_linear(Graph& g, int x, DType dtype, int weight, int bias, std::string_view in,
                                        Axis out, const std::string& prefix) {
  std::vector<int> inputs{x, weight};
  if (bias >= 0) inputs.push_back(bias);
  std::string out_name = out.name;
  return add_node(g, Op::linear, std::move(inputs), replaced_axes(g, x, in, {std::move(out)}), dtype,
                  {std::string(in), std::move(out_name)}, prefix);
}

/// linear_params_named: weight [out, in] and, unless `bias` is empty, bias [out]; {weight, bias
/// or -1}.
[[gnu::noinline]] inline std::pair<int, int> add_linear_params(Graph& g, std::string weight, std::string bias,
                                                               const Extent& out, const Extent& in) {
  const int w = add_param(g, std::move(weight), {Axis{"out", out}, Axis{"in", in}});
  return {w, bias.empty() ? -1 : add_param(g, std::move(bias), {Axis{"out", out}})};
}

/// conv1d_params: `<prefix>.weight` [in, out] as the checkpoint holds it, permuted to [out, in]
/// as linear reads it, and `<prefix>.bias` [out] if `bias`; {the permuted weight, bias or -1}.
[[gnu::noinline]] inline std::pair<int, int> add_conv1d_params(Graph& g, const std::string& prefix, bool bias,
                                                               const Extent& out_extent, const Extent& in_extent) {
  const Axis out{"out", out_extent}, in{"in", in_extent};
  const int w = add_param(g, prefix + ".weight", {in, out});
  const int t = add_node(g, Op::permute, {w}, {out, in}, DType::f32);
  return {t, bias ? add_param(g, prefix + ".bias", {out}) : -1};
}

/// layer_norm over axis `over` of node x, with gain and shift.
[[gnu::noinline]] inline int add_layer_norm(Graph& g, int x, DType dtype, int gamma, int beta, std::string_view over,
                                            double eps, const std::string& prefix) {
  Node n;
  n.op = Op::layer_norm;
  n.inputs = std::vector<int>{x, gamma, beta};
  n.axes = g.node(x).axes;
  n.attr_axes = {std::string(over)};
  n.scalar = eps;
  n.name = prefix;
  n.dtype = dtype;
  return g.add(std::move(n));
}

/// embedding: rows of `table` [rows, features] at the ids of node `ids`; f32.
[[gnu::noinline]] inline int add_embedding(Graph& g, int table, int ids, std::string_view rows, Axis features,
                                           const std::string& prefix) {
  std::vector<Axis> axes = g.node(ids).axes;
  std::string features_name = features.name;
  axes.push_back(std::move(features));
  return add_node(g, Op::embedding, {table, ids}, std::move(axes), DType::f32,
                  {std::string(rows), std::move(features_name)}, prefix);
}

/// chunk: axis `axis` of node `id` cut into ids.size() equal parts, each a slice renamed `into`
/// (offset i in units of the part); their ids into `ids`.
[[gnu::noinline]] inline void add_chunks(Graph& g, int id, DType dtype, std::string_view axis, std::string_view into,
                                         std::span<int> ids) {
  const auto k = static_cast<std::int64_t>(ids.size());
  const Extent part = ir_axis(g.node(id), axis).extent.divided(k);
  if (part.is_dynamic())
    g.require(Constraint{Constraint::Kind::divisible, ir_axis(g.node(id), axis).extent, Extent::fixed(k),
                         "chunk: `" + std::string(axis) + "` ({a}) is not divisible by {b}"});
  for (std::int64_t i = 0; i < k; ++i) {
    Node n;
    n.op = Op::slice;
    n.inputs = {id};
    n.axes = replaced_axes(g, id, axis, {Axis{std::string(into), part}});
    n.dtype = dtype;
    n.attr_axes = {std::string(axis), std::string(into)};
    n.offset = i;  // in units of the part's extent
    ids[static_cast<std::size_t>(i)] = g.add(std::move(n));
  }
}

/// split: axis `axis` of node `id` into the factors `names` — static_size[i] when is_static[i],
/// else sizes[i], and the one factor of size 0 takes what is left. `factors` ("Heads (2) x
/// HeadDim (dyn)") and `deferred` (the divisibility message, sizes as {a} / {b}) word the errors.
[[gnu::noinline]] inline int add_split(Graph& g, int id, DType dtype, std::string_view axis,
                                       std::span<const std::string_view> names, std::span<const bool> is_static,
                                       std::span<const std::int64_t> static_size, std::span<const std::int64_t> sizes,
                                       std::string_view factors, std::string_view deferred) {
  const std::size_t n = names.size();
  const Extent whole = ir_axis(g.node(id), axis).extent;
  std::int64_t known = 1;
  int left = -1;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t size = is_static[i] ? static_size[i] : sizes[i];
    if (size > 0) {
      known *= size;
    } else if (left >= 0) {
      throw ShapeError("split: at most one factor of `" + std::string(axis) + "` may be left to derive, got " +
                       std::string(factors) + "; fix: give the other factors sizes");
    } else {
      left = static_cast<int>(i);
    }
  }
  const std::string message(deferred);
  if (left < 0) {
    if (whole.is_static() && whole.value != known)
      throw ShapeError(fill_sizes(message, std::to_string(whole.value), std::to_string(known)));
    require_equal(g, whole, Extent::fixed(known), message);
  } else if (whole.is_static()) {
    if (whole.value % known != 0)
      throw ShapeError(fill_sizes(message, std::to_string(whole.value), std::to_string(known)));
  } else {
    g.require(Constraint{Constraint::Kind::divisible, whole, Extent::fixed(known), message});
  }
  std::vector<Axis> parts;
  std::vector<std::string> attr_axes{std::string(axis)};
  for (std::size_t i = 0; i < n; ++i) {
    parts.push_back(Axis{std::string(names[i]), static_cast<int>(i) == left
                                                    ? whole.divided(known)
                                                    : Extent::fixed(is_static[i] ? static_size[i] : sizes[i])});
    attr_axes.emplace_back(names[i]);
  }
  return add_node(g, Op::split, {id}, replaced_axes(g, id, axis, std::move(parts)), dtype, std::move(attr_axes));
}

}  // namespace qkv::detail
