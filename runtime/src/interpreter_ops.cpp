// runtime/src/interpreter_ops.cpp — the reference interpreter's ops, one function each (the
// decoder ops: interpreter_decoder_ops.cpp), and the helpers they share (interpreter_ops.hpp).
//
// Every op reads its inputs' values (dense row-major fp32) and the axis names of its inputs'
// nodes, and matches axes by NAME, never by position. The rules are pinned in docs/semantics.md.
#include "interpreter_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>

#include <qkv/runtime/quantize.hpp>
#include <qkv/runtime/rng.hpp>

namespace qkv::interp {

std::string node_label(const Graph& g, int id) {
  const Node& n = g.node(id);
  std::string s = "%" + std::to_string(id) + " (" + std::string(op_name(n.op));
  if (!n.name.empty()) s += " " + n.name;
  return s + ")";
}

std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::vector<std::int64_t> strides_of(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> s(shape.size(), 1);
  for (std::size_t k = shape.size(); k-- > 1;) s[k - 1] = s[k] * shape[k];
  return s;
}

bool next_index(std::vector<std::int64_t>& idx, const std::vector<std::int64_t>& shape) {
  for (std::size_t k = idx.size(); k-- > 0;) {
    if (++idx[k] < shape[k]) return true;
    idx[k] = 0;
  }
  return false;
}

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (std::size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
  return out + ")";
}

std::string where(const OpArgs& a) { return node_label(a.graph, a.id) + ": "; }

bool has_axis(const std::vector<Axis>& axes, std::string_view name) {
  for (const auto& x : axes)
    if (x.name == name) return true;
  return false;
}

bool has_name(const std::vector<std::string>& names, std::string_view name) {
  for (const auto& x : names)
    if (x == name) return true;
  return false;
}

/// Position of the axis `name` in `axes`; an internal error if it is not there.
std::size_t axis_pos(const OpArgs& a, const std::vector<Axis>& axes, std::string_view name, std::string_view whose) {
  for (std::size_t k = 0; k < axes.size(); ++k)
    if (axes[k].name == name) return k;
  internal_error(where(a) + std::string(whose) + " " + axes_str(axes) + " has no axis `" + std::string(name) + "`");
}

/// The number of inputs the op table (qkv/ir/ops.hpp) gives the node's op.
void expect_inputs(const OpArgs& a) {
  const OpInfo& op = op_info(a.node.op);
  const auto lo = static_cast<std::size_t>(op.min_inputs);
  const std::size_t hi =
      op.max_inputs < 0 ? std::numeric_limits<std::size_t>::max() : static_cast<std::size_t>(op.max_inputs);
  const std::size_t n = a.in.size();
  if (n < lo || n > hi)
    internal_error(
        where(a) + "expects " +
        (lo == hi ? std::to_string(lo) : std::to_string(lo) + ".." + (op.max_inputs < 0 ? "" : std::to_string(hi))) +
        " inputs, has " + std::to_string(n));
}

void expect_attrs(const OpArgs& a, std::size_t n) {
  if (a.node.attr_axes.size() < n)
    internal_error(where(a) + "expects " + std::to_string(n) + " axis attributes, has " +
                   std::to_string(a.node.attr_axes.size()));
}

/// The size of a declared output axis under the bindings.
std::int64_t bound_extent(const OpArgs& a, const Axis& ax) {
  auto v = ax.extent.resolve(a.bindings);
  if (!v)
    internal_error(where(a) + "axis `" + ax.name + "` has the extent " + ax.extent.str() + ", which is not bound");
  return *v;
}

/// The node's declared output shape (node.axes) under the bindings.
Shape declared_shape(const OpArgs& a) {
  Shape s;
  for (const auto& ax : a.node.axes) s.push_back(bound_extent(a, ax));
  return s;
}

/// For each name in `target`, the stride of the same-named axis of a value laid out as `src`
/// with `src_shape` (0 where `src` has no such axis: the value is broadcast along it).
Shape strides_by_name(const std::vector<std::string>& target, const std::vector<Axis>& src, const Shape& src_shape) {
  const Shape st = strides_of(src_shape);
  Shape out(target.size(), 0);
  for (std::size_t t = 0; t < target.size(); ++t)
    for (std::size_t k = 0; k < src.size(); ++k)
      if (src[k].name == target[t]) out[t] = st[k];
  return out;
}

std::vector<std::string> names_of(const std::vector<Axis>& axes) {
  std::vector<std::string> out;
  for (const auto& x : axes) out.push_back(x.name);
  return out;
}

std::int64_t dot(const Shape& idx, const Shape& strides) {
  std::int64_t off = 0;
  for (std::size_t k = 0; k < idx.size(); ++k) off += idx[k] * strides[k];
  return off;
}

Around around(const Shape& s, std::size_t p) {
  Around r;
  for (std::size_t k = 0; k < p; ++k) r.outer *= s[k];
  r.n = s[p];
  for (std::size_t k = p + 1; k < s.size(); ++k) r.inner *= s[k];
  return r;
}

/// Sizes that must agree by construction (the DSL checked them, or recorded a constraint).
void expect_same_size(const OpArgs& a, const std::string& axis, std::int64_t lhs, std::int64_t rhs) {
  if (lhs != rhs)
    internal_error(where(a) + "axis `" + axis + "` is " + std::to_string(lhs) + " in the first operand but " +
                   std::to_string(rhs) + " in the other");
}

Shape without_axis(Shape s, std::size_t p) {
  s.erase(s.begin() + static_cast<std::ptrdiff_t>(p));
  return s;
}

Value unary_map(const OpArgs& a, float (*f)(float)) {
  expect_inputs(a);
  Value out{a.in[0]->shape, a.in[0]->data};
  for (float& x : out.data) x = f(x);
  return out;
}

namespace {

// --- ops ----------------------------------------------------------------------------------------

/// out[o] = Σ_c lhs[o, c] · rhs[o, c], axes matched by name; accumulated in double.
Value op_contract(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 1);
  const Node &ln = *a.in_nodes[0], &rn = *a.in_nodes[1];
  const Value &L = *a.in[0], &R = *a.in[1];
  const std::vector<std::string>& contracted = a.node.attr_axes;
  const std::vector<std::string> out_names = names_of(a.node.axes);

  for (const auto& c : contracted) {
    axis_pos(a, ln.axes, c, "lhs");
    axis_pos(a, rn.axes, c, "rhs");
    if (has_axis(a.node.axes, c)) internal_error(where(a) + "the contracted axis `" + c + "` is also an output axis");
  }
  for (const auto* operand : {&ln, &rn})
    for (const auto& x : operand->axes)
      if (!has_axis(a.node.axes, x.name) && !has_name(contracted, x.name))
        internal_error(where(a) + "operand axis `" + x.name + "` is neither contracted nor an output axis");
  for (std::size_t i = 0; i < ln.axes.size(); ++i)
    for (std::size_t j = 0; j < rn.axes.size(); ++j)
      if (ln.axes[i].name == rn.axes[j].name) expect_same_size(a, ln.axes[i].name, L.shape[i], R.shape[j]);

  Shape out_shape;
  for (const auto& x : a.node.axes) {
    if (has_axis(ln.axes, x.name))
      out_shape.push_back(L.shape[axis_pos(a, ln.axes, x.name, "lhs")]);
    else
      out_shape.push_back(R.shape[axis_pos(a, rn.axes, x.name, "rhs")]);
  }
  Shape c_shape;  // extents of the contracted axes, from the lhs
  for (const auto& c : contracted) c_shape.push_back(L.shape[axis_pos(a, ln.axes, c, "lhs")]);

  const Shape l_out = strides_by_name(out_names, ln.axes, L.shape),
              r_out = strides_by_name(out_names, rn.axes, R.shape);
  const Shape l_c = strides_by_name(contracted, ln.axes, L.shape), r_c = strides_by_name(contracted, rn.axes, R.shape);

  // Offsets of every contracted multi-index in lhs and rhs.
  const std::int64_t nc = numel(c_shape);
  std::vector<std::int64_t> l_off(static_cast<std::size_t>(nc)), r_off(static_cast<std::size_t>(nc));
  Shape cidx(c_shape.size(), 0);
  for (std::int64_t c = 0; c < nc; ++c, next_index(cidx, c_shape)) {
    l_off[static_cast<std::size_t>(c)] = dot(cidx, l_c);
    r_off[static_cast<std::size_t>(c)] = dot(cidx, r_c);
  }

  Value out{out_shape, std::vector<float>(static_cast<std::size_t>(numel(out_shape)))};
  Shape idx(out_shape.size(), 0);
  for (std::size_t o = 0; o < out.data.size(); ++o, next_index(idx, out_shape)) {
    const std::int64_t lb = dot(idx, l_out), rb = dot(idx, r_out);
    double acc = 0.0;
    for (std::size_t c = 0; c < l_off.size(); ++c)
      acc += static_cast<double>(L.data[static_cast<std::size_t>(lb + l_off[c])]) *
             static_cast<double>(R.data[static_cast<std::size_t>(rb + r_off[c])]);
    out.data[o] = static_cast<float>(acc);
  }
  return out;
}

/// add / mul / bias / keep_mask: the rhs is broadcast into the lhs by axis name.
Value op_broadcast(const OpArgs& a) {
  expect_inputs(a);
  const Node &xn = *a.in_nodes[0], &yn = *a.in_nodes[1];
  const Value &X = *a.in[0], &Y = *a.in[1];
  for (std::size_t j = 0; j < yn.axes.size(); ++j)
    expect_same_size(a, yn.axes[j].name, X.shape[axis_pos(a, xn.axes, yn.axes[j].name, "lhs")], Y.shape[j]);
  const Shape ys = strides_by_name(names_of(xn.axes), yn.axes, Y.shape);

  Value out{X.shape, std::vector<float>(X.data.size())};
  Shape idx(X.shape.size(), 0);
  for (std::size_t i = 0; i < X.data.size(); ++i, next_index(idx, X.shape)) {
    const float x = X.data[i], y = Y.data[static_cast<std::size_t>(dot(idx, ys))];
    switch (a.node.op) {
      case Op::add:
      case Op::bias:
        out.data[i] = x + y;
        break;
      case Op::mul:
        out.data[i] = x * y;
        break;
      case Op::keep_mask:
        out.data[i] = y != 0.0f ? x : kNegInf;
        break;
      default:
        internal_error(where(a) + "not a broadcasting op");
    }
  }
  return out;
}

/// x * scalar, or x / sqrt(d) with d the bound size of node.dim; the factor in double.
Value op_scale(const OpArgs& a) {
  expect_inputs(a);
  double factor = a.node.scalar;
  if (a.node.dim) {
    const auto d = a.node.dim->resolve(a.bindings);
    if (!d) internal_error(where(a) + "scale by 1/sqrt(" + a.node.dim->str() + "): the extent is not bound");
    factor = 1.0 / std::sqrt(static_cast<double>(*d));
  }
  Value out{a.in[0]->shape, a.in[0]->data};
  for (float& x : out.data) x = static_cast<float>(static_cast<double>(x) * factor);
  return out;
}

/// split / view: the data unchanged under the declared shape.
Value op_reshape(const OpArgs& a) {
  expect_inputs(a);
  if (a.node.op == Op::split) {
    expect_attrs(a, 2);
    axis_pos(a, a.in_nodes[0]->axes, a.node.attr_axes[0], "input");
    for (std::size_t k = 1; k < a.node.attr_axes.size(); ++k) axis_pos(a, a.node.axes, a.node.attr_axes[k], "output");
  }
  Value out{declared_shape(a), a.in[0]->data};
  if (numel(out.shape) != numel(a.in[0]->shape))
    internal_error(where(a) + "the output " + axes_str(a.node.axes) + " = " + shape_str(out.shape) +
                   " does not hold the " + std::to_string(numel(a.in[0]->shape)) + " elements of the input " +
                   shape_str(a.in[0]->shape));
  return out;
}

/// merge: two adjacent axes into one, data unchanged.
Value op_merge(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 3);
  const auto& in_axes = a.in_nodes[0]->axes;
  const std::size_t ia = axis_pos(a, in_axes, a.node.attr_axes[0], "input");
  const std::size_t ib = axis_pos(a, in_axes, a.node.attr_axes[1], "input");
  if (ib != ia + 1) internal_error(where(a) + "merged axes are not adjacent in " + axes_str(in_axes));
  if (axis_pos(a, a.node.axes, a.node.attr_axes[2], "output") != ia)
    internal_error(where(a) + "the merged axis is not where the parts were");
  Shape s = a.in[0]->shape;
  s[ia] *= s[ib];
  s.erase(s.begin() + static_cast<std::ptrdiff_t>(ib));
  return Value{s, a.in[0]->data};
}

/// rename: the same data under a new axis name.
Value op_rename(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 2);
  const std::size_t p = axis_pos(a, a.in_nodes[0]->axes, a.node.attr_axes[0], "input");
  if (axis_pos(a, a.node.axes, a.node.attr_axes[1], "output") != p) internal_error(where(a) + "the renamed axis moved");
  return Value{a.in[0]->shape, a.in[0]->data};
}

/// permute: out[idx] = in[the same indices, read by name].
Value op_permute(const OpArgs& a) {
  expect_inputs(a);
  const Node& xn = *a.in_nodes[0];
  const Value& X = *a.in[0];
  if (xn.axes.size() != a.node.axes.size())
    internal_error(where(a) + "permute " + axes_str(xn.axes) + " -> " + axes_str(a.node.axes) + " changes the rank");
  Shape out_shape;
  for (const auto& x : a.node.axes) out_shape.push_back(X.shape[axis_pos(a, xn.axes, x.name, "input")]);
  const Shape src = strides_by_name(names_of(a.node.axes), xn.axes, X.shape);
  Value out{out_shape, std::vector<float>(X.data.size())};
  Shape idx(out_shape.size(), 0);
  for (std::size_t i = 0; i < out.data.size(); ++i, next_index(idx, out_shape))
    out.data[i] = X.data[static_cast<std::size_t>(dot(idx, src))];
  return out;
}

/// broadcast: the input repeated along the output axes it lacks (matched by name).
Value op_broadcast_to(const OpArgs& a) {
  expect_inputs(a);
  const Node& xn = *a.in_nodes[0];
  const Value& X = *a.in[0];
  const Shape out_shape = declared_shape(a);
  for (std::size_t k = 0; k < xn.axes.size(); ++k)
    expect_same_size(a, xn.axes[k].name, X.shape[k], out_shape[axis_pos(a, a.node.axes, xn.axes[k].name, "output")]);
  const Shape src = strides_by_name(names_of(a.node.axes), xn.axes, X.shape);
  Value out{out_shape, std::vector<float>(static_cast<std::size_t>(numel(out_shape)))};
  Shape idx(out_shape.size(), 0);
  for (std::size_t i = 0; i < out.data.size(); ++i, next_index(idx, out_shape))
    out.data[i] = X.data[static_cast<std::size_t>(dot(idx, src))];
  return out;
}

/// fill: the constant `scalar` in the node's shape (booleans: nonzero is true).
Value op_fill(const OpArgs& a) {
  expect_inputs(a);
  const Shape out_shape = declared_shape(a);
  const float v =
      a.node.dtype == DType::boolean ? (a.node.scalar != 0.0 ? 1.0f : 0.0f) : static_cast<float>(a.node.scalar);
  return Value{out_shape, std::vector<float>(static_cast<std::size_t>(numel(out_shape)), v)};
}

/// The largest of X.data[at(k)] over k in [0, n) (−inf when n = 0); a NaN wins.
template <class At>
float row_max(const Value& X, std::int64_t n, const At& at) {
  float m = kNegInf;
  for (std::int64_t k = 0; k < n; ++k) {
    const float v = X.data[at(k)];
    if (v > m || std::isnan(v)) m = v;
  }
  return m;
}

/// softmax over attr_axes[0]: max-subtracted, sums in double; an all −inf row gives zeros.
Value op_softmax(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 1);
  const Value& X = *a.in[0];
  const Around r = around(X.shape, axis_pos(a, a.in_nodes[0]->axes, a.node.attr_axes[0], "input"));
  Value out{X.shape, std::vector<float>(X.data.size(), 0.0f)};
  std::vector<double> e(static_cast<std::size_t>(r.n));
  for (std::int64_t o = 0; o < r.outer; ++o) {
    for (std::int64_t i = 0; i < r.inner; ++i) {
      auto at = [&](std::int64_t k) { return static_cast<std::size_t>((o * r.n + k) * r.inner + i); };
      const float m = row_max(X, r.n, at);
      if (m == kNegInf) continue;  // nothing visible: the row stays zero
      double sum = 0.0;
      for (std::int64_t k = 0; k < r.n; ++k) {
        e[static_cast<std::size_t>(k)] = std::exp(static_cast<double>(X.data[at(k)]) - static_cast<double>(m));
        sum += e[static_cast<std::size_t>(k)];
      }
      for (std::int64_t k = 0; k < r.n; ++k) out.data[at(k)] = static_cast<float>(e[static_cast<std::size_t>(k)] / sum);
    }
  }
  return out;
}

/// logsumexp over attr_axes[0]: m + log(sum exp(x - m)) in double, the axis dropped (the other
/// axes keep their order); an all −inf row gives −inf, a NaN in the row gives NaN.
Value op_logsumexp(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 1);
  const Value& X = *a.in[0];
  const auto& in_axes = a.in_nodes[0]->axes;
  const std::size_t p = axis_pos(a, in_axes, a.node.attr_axes[0], "input");
  std::vector<std::string> rest = names_of(in_axes);
  rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(p));
  if (rest != names_of(a.node.axes))
    internal_error(where(a) + "the output " + axes_str(a.node.axes) + " is not the input without the reduced axis");
  const Around r = around(X.shape, p);
  Value out{without_axis(X.shape, p), std::vector<float>(static_cast<std::size_t>(r.outer * r.inner), kNegInf)};
  for (std::int64_t o = 0; o < r.outer; ++o) {
    for (std::int64_t i = 0; i < r.inner; ++i) {
      auto at = [&](std::int64_t k) { return static_cast<std::size_t>((o * r.n + k) * r.inner + i); };
      const float m = row_max(X, r.n, at);
      float& y = out.data[static_cast<std::size_t>(o * r.inner + i)];
      if (m == kNegInf || std::isnan(m) || std::isinf(m)) {
        y = m;  // nothing visible (−inf), a NaN, or a +inf entry
        continue;
      }
      double sum = 0.0;
      for (std::int64_t k = 0; k < r.n; ++k)
        sum += std::exp(static_cast<double>(X.data[at(k)]) - static_cast<double>(m));
      y = static_cast<float>(static_cast<double>(m) + std::log(sum));
    }
  }
  return out;
}

/// causal: entry (i, j) of query i and key j is kept iff j <= i (top-left) or j <= i + S - L
/// (bottom-right); the others become −inf.
Value op_causal(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 2);
  const Value& X = *a.in[0];
  const std::size_t pq = axis_pos(a, a.in_nodes[0]->axes, a.node.attr_axes[0], "input");
  const std::size_t pk = axis_pos(a, a.in_nodes[0]->axes, a.node.attr_axes[1], "input");
  const std::int64_t L = X.shape[pq], S = X.shape[pk];
  const std::int64_t shift = a.node.align == CausalAlign::bottom_right ? S - L : 0;
  Value out{X.shape, X.data};
  Shape idx(X.shape.size(), 0);
  for (std::size_t e = 0; e < out.data.size(); ++e, next_index(idx, X.shape))
    if (idx[pk] > idx[pq] + shift) out.data[e] = kNegInf;
  return out;
}

/// score_mod: out = keep ? score' : −inf per entry, the expression evaluated in double over
/// the entry's coordinates (mod_eval in qkv/ir/mod_expr.hpp: the reference semantics).
Value op_score_mod(const OpArgs& a) {
  expect_inputs(a);
  if (!a.node.mod) internal_error(where(a) + "a " + std::string(op_name(a.node.op)) + " node without its expression");
  const ModExpr& e = *a.node.mod;
  const Value& X = *a.in[0];
  const auto& axes = a.in_nodes[0]->axes;
  for (std::size_t i = 0; i < e.nodes.size(); ++i) {
    const ModNode& n = e.nodes[i];
    if (n.op == ModOp::index || n.op == ModOp::position || n.op == ModOp::length) axis_pos(a, axes, n.axis, "scores");
    if (n.op == ModOp::load) {
      if (n.input < 1 || static_cast<std::size_t>(n.input) >= a.in.size() ||
          a.in[static_cast<std::size_t>(n.input)]->shape.size() != n.at.size())
        internal_error(where(a) + "load " + std::to_string(i) + " does not match an input of the node");
    }
  }
  if (!e.query.empty()) {
    axis_pos(a, axes, e.query, "scores");
    axis_pos(a, axes, e.key, "scores");
  }
  Shape idx(X.shape.size(), 0);
  const ModEnv env{axes, X.shape, idx, a.in};  // the axes checked above
  Value out{X.shape, X.data};
  std::vector<double> v;
  for (std::size_t i = 0; i < out.data.size(); ++i, next_index(idx, X.shape)) {
    mod_eval(e, static_cast<double>(X.data[i]), env, v);
    const bool keep = e.keep < 0 || v[static_cast<std::size_t>(e.keep)] != 0.0;
    const double s = e.score < 0 ? X.data[i] : v[static_cast<std::size_t>(e.score)];
    out.data[i] = keep ? static_cast<float>(s) : kNegInf;
  }
  return out;
}

/// dropout: keep iff dropout_keep(p, seed, batch, head, row, col); kept entries scaled 1/(1-p).
/// col = last index, row = second-to-last, batch = first when rank >= 3, head = the row-major
/// flattened index over the axes strictly between the first and the second-to-last.
Value op_dropout(const OpArgs& a) {
  expect_inputs(a);
  const Value& X = *a.in[0];
  const double p = a.node.scalar;
  if (!(p >= 0.0 && p < 1.0))
    internal_error(where(a) + "dropout probability " + std::to_string(p) + " is not in [0, 1)");
  if (p == 0.0) return X;
  const double keep_scale = 1.0 / (1.0 - p);
  const std::size_t rank = X.shape.size();
  Value out{X.shape, std::vector<float>(X.data.size(), 0.0f)};
  Shape idx(rank, 0);
  for (std::size_t e = 0; e < out.data.size(); ++e, next_index(idx, X.shape)) {
    const std::int64_t col = rank >= 1 ? idx[rank - 1] : 0;
    const std::int64_t row = rank >= 2 ? idx[rank - 2] : 0;
    const std::int64_t batch = rank >= 3 ? idx[0] : 0;
    std::int64_t head = 0;
    for (std::size_t k = 1; k + 2 < rank; ++k) head = head * X.shape[k] + idx[k];
    if (dropout_keep(p, a.node.seed, static_cast<std::uint32_t>(batch), static_cast<std::uint32_t>(head),
                     static_cast<std::uint32_t>(row), static_cast<std::uint32_t>(col)))
      out.data[e] = static_cast<float>(static_cast<double>(X.data[e]) * keep_scale);
  }
  return out;
}

/// concat along attr_axes[0], in input order; the axis is called attr_axes[1] in the output.
Value op_concat(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 2);
  const auto& axes0 = a.in_nodes[0]->axes;
  const std::size_t p = axis_pos(a, axes0, a.node.attr_axes[0], "input");
  if (axis_pos(a, a.node.axes, a.node.attr_axes[1], "output") != p) internal_error(where(a) + "the joined axis moved");
  Shape out_shape = a.in[0]->shape;
  out_shape[p] = 0;
  for (std::size_t k = 0; k < a.in.size(); ++k) {
    if (names_of(a.in_nodes[k]->axes) != names_of(axes0))
      internal_error(where(a) + "part " + std::to_string(k) + " " + axes_str(a.in_nodes[k]->axes) +
                     " differs from part 0 " + axes_str(axes0));
    for (std::size_t d = 0; d < out_shape.size(); ++d)
      if (d != p) expect_same_size(a, axes0[d].name, a.in[0]->shape[d], a.in[k]->shape[d]);
    out_shape[p] += a.in[k]->shape[p];
  }
  const Around r = around(out_shape, p);
  Value out{out_shape, {}};
  out.data.reserve(static_cast<std::size_t>(numel(out_shape)));
  for (std::int64_t o = 0; o < r.outer; ++o) {
    for (const Value* part : a.in) {
      const std::int64_t block = part->shape[p] * r.inner;
      const auto first = part->data.begin() + static_cast<std::ptrdiff_t>(o * block);
      out.data.insert(out.data.end(), first, first + static_cast<std::ptrdiff_t>(block));
    }
  }
  return out;
}

/// slice: output axis attr_axes[1] (extent P) is input axis attr_axes[0] at [offset*P, (offset+1)*P).
Value op_slice(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 2);
  const Value& X = *a.in[0];
  const std::size_t p = axis_pos(a, a.in_nodes[0]->axes, a.node.attr_axes[0], "input");
  const std::size_t q = axis_pos(a, a.node.axes, a.node.attr_axes[1], "output");
  if (p != q || a.node.axes.size() != X.shape.size()) internal_error(where(a) + "the sliced axis moved");
  const std::int64_t P = bound_extent(a, a.node.axes[q]);
  std::int64_t start = a.node.offset * P;
  if (a.node.dim) {  // the first element, not a part
    const auto s = a.node.dim->resolve(a.bindings);
    if (!s) internal_error(where(a) + "the start " + a.node.dim->str() + " is not bound");
    start = *s;
  }
  if (a.node.offset < 0 || start < 0 || start + P > X.shape[p])
    internal_error(where(a) + "[" + std::to_string(start) + ", " + std::to_string(start + P) + ") is outside `" +
                   a.node.attr_axes[0] + "` (" + std::to_string(X.shape[p]) + ")");
  Shape out_shape = X.shape;
  out_shape[p] = P;
  const Around r = around(X.shape, p);
  Value out{out_shape, {}};
  out.data.reserve(static_cast<std::size_t>(numel(out_shape)));
  for (std::int64_t o = 0; o < r.outer; ++o) {
    const auto first = X.data.begin() + static_cast<std::ptrdiff_t>((o * r.n + start) * r.inner);
    out.data.insert(out.data.end(), first, first + static_cast<std::ptrdiff_t>(P * r.inner));
  }
  return out;
}

/// layer_norm over attr_axes[0] (PyTorch: biased variance, eps inside the square root).
Value op_layer_norm(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 1);
  const Value &X = *a.in[0], &G = *a.in[1], &B = *a.in[2];
  const std::size_t p = axis_pos(a, a.in_nodes[0]->axes, a.node.attr_axes[0], "input");
  const Around r = around(X.shape, p);
  for (std::size_t k = 1; k <= 2; ++k) {
    if (a.in[k]->shape.size() != 1)
      internal_error(where(a) + "gamma/beta must have one axis, have " + shape_str(a.in[k]->shape));
    expect_same_size(a, a.node.attr_axes[0], r.n, a.in[k]->shape[0]);
  }
  const double eps = a.node.scalar;
  Value out{X.shape, std::vector<float>(X.data.size())};
  for (std::int64_t o = 0; o < r.outer; ++o) {
    for (std::int64_t i = 0; i < r.inner; ++i) {
      auto at = [&](std::int64_t k) { return static_cast<std::size_t>((o * r.n + k) * r.inner + i); };
      double mean = 0.0;
      for (std::int64_t k = 0; k < r.n; ++k) mean += X.data[at(k)];
      mean /= static_cast<double>(r.n);
      double var = 0.0;
      for (std::int64_t k = 0; k < r.n; ++k) {
        const double d = X.data[at(k)] - mean;
        var += d * d;
      }
      var /= static_cast<double>(r.n);
      const double inv_std = 1.0 / std::sqrt(var + eps);
      for (std::int64_t k = 0; k < r.n; ++k) {
        const auto kk = static_cast<std::size_t>(k);
        out.data[at(k)] = static_cast<float>((X.data[at(k)] - mean) * inv_std * G.data[kk] + B.data[kk]);
      }
    }
  }
  return out;
}

/// linear (x, W[out, in], b?[out]): x's axis attr_axes[0] becomes attr_axes[1] in place;
/// y[.., o, ..] = Σ_i x[.., i, ..]·W[o, i] + b[o], accumulated in double.
Value op_linear(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 2);
  const Value &X = *a.in[0], &W = *a.in[1];
  const Value* bias = a.in.size() == 3 ? a.in[2] : nullptr;
  const std::size_t p = axis_pos(a, a.in_nodes[0]->axes, a.node.attr_axes[0], "x");
  if (axis_pos(a, a.node.axes, a.node.attr_axes[1], "output") != p)
    internal_error(where(a) + "the projected axis moved");
  if (W.shape.size() != 2) internal_error(where(a) + "the weight must be [out, in], is " + shape_str(W.shape));
  const Around r = around(X.shape, p);
  const std::int64_t n_out = W.shape[0], n_in = W.shape[1];
  expect_same_size(a, a.node.attr_axes[0], r.n, n_in);
  if (bias && (bias->shape.size() != 1 || bias->shape[0] != n_out))
    internal_error(where(a) + "the bias " + shape_str(bias->shape) + " does not match the weight's out (" +
                   std::to_string(n_out) + ")");
  Shape out_shape = X.shape;
  out_shape[p] = n_out;
  Value out{out_shape, std::vector<float>(static_cast<std::size_t>(numel(out_shape)))};
  // A quantized weight's linear reads its input rounded to 8 bits per group of the weight's.
  const Node& w_node = *a.in_nodes[1];
  std::vector<float> rounded;
  if (w_node.op == Op::dequantize) {
    rounded = X.data;
    std::vector<float> row(static_cast<std::size_t>(n_in));
    for (std::int64_t o = 0; o < r.outer; ++o)
      for (std::int64_t c = 0; c < r.inner; ++c) {
        auto at = [&](std::int64_t i) { return static_cast<std::size_t>((o * n_in + i) * r.inner + c); };
        for (std::int64_t i = 0; i < n_in; ++i) row[static_cast<std::size_t>(i)] = rounded[at(i)];
        round_activations(row.data(), n_in, w_node.offset);
        for (std::int64_t i = 0; i < n_in; ++i) rounded[at(i)] = row[static_cast<std::size_t>(i)];
      }
  }
  const std::vector<float>& xs = rounded.empty() ? X.data : rounded;
  for (std::int64_t o = 0; o < r.outer; ++o) {
    for (std::int64_t j = 0; j < n_out; ++j) {
      for (std::int64_t c = 0; c < r.inner; ++c) {
        double acc = 0.0;
        for (std::int64_t i = 0; i < n_in; ++i)
          acc += static_cast<double>(xs[static_cast<std::size_t>((o * n_in + i) * r.inner + c)]) *
                 static_cast<double>(W.data[static_cast<std::size_t>(j * n_in + i)]);
        if (bias) acc += static_cast<double>(bias->data[static_cast<std::size_t>(j)]);
        out.data[static_cast<std::size_t>((o * n_out + j) * r.inner + c)] = static_cast<float>(acc);
      }
    }
  }
  return out;
}

float relu(float x) { return x > 0.0f ? x : (std::isnan(x) ? x : 0.0f); }

/// The exact GELU, 0.5·x·(1 + erf(x/√2)), evaluated in double; gelu(−∞) = 0, its limit (the
/// formula would give −∞·0 = NaN).
float gelu(float x) {
  if (std::isinf(x) && x < 0.0f) return 0.0f;
  const double v = x;
  return static_cast<float>(0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))));
}

}  // namespace

Value eval_op(const OpArgs& a) {
  switch (a.node.op) {
    case Op::contract:
      return op_contract(a);
    case Op::add:
    case Op::mul:
    case Op::bias:
    case Op::keep_mask:
      return op_broadcast(a);
    case Op::scale:
      return op_scale(a);
    case Op::split:
    case Op::view:
      return op_reshape(a);
    case Op::merge:
      return op_merge(a);
    case Op::rename:
      return op_rename(a);
    case Op::permute:
      return op_permute(a);
    case Op::softmax:
      return op_softmax(a);
    case Op::logsumexp:
      return op_logsumexp(a);
    case Op::causal:
      return op_causal(a);
    case Op::score_mod:
    case Op::pointwise:  // the same evaluation, with no keep predicate
      return op_score_mod(a);
    case Op::dropout:
      return op_dropout(a);
    case Op::concat:
      return op_concat(a);
    case Op::slice:
      return op_slice(a);
    case Op::broadcast:
      return op_broadcast_to(a);
    case Op::fill:
      return op_fill(a);
    case Op::layer_norm:
      return op_layer_norm(a);
    case Op::linear:
      return op_linear(a);
    case Op::rms_norm:
      return op_rms_norm(a);
    case Op::silu:
      return op_silu(a);
    case Op::rope:
      return op_rope(a);
    case Op::embedding:
      return op_embedding(a);
    case Op::embedding_grad:
      return op_embedding_grad(a);
    case Op::argmax:
      return op_argmax(a);
    case Op::update_slice:
      return op_update_slice(a);
    case Op::dequantize:
      return op_dequantize(a);
    case Op::convert:  // the rounding to the node's dtype is every node's (interpreter.cpp's run)
      return unary_map(a, [](float x) { return x; });
    case Op::relu:
      return unary_map(a, relu);
    case Op::gelu:
      return unary_map(a, gelu);
    case Op::fused_attention:
      return eval_fused_attention(a)[0];
    case Op::fused_attention_backward:
      return eval_attention_backward(a)[0];
    case Op::attention_weights:
    case Op::attention_lse:
    case Op::attention_dk:
    case Op::attention_dv:
    case Op::attention_dtensor:
      internal_error(where(a) + "a companion node is computed with its fused node (interpreter.cpp's run)");
    case Op::input:
    case Op::param:
      internal_error(where(a) + "a leaf has no op to evaluate");
  }
  internal_error(where(a) + "unknown op (code " + std::to_string(static_cast<int>(a.node.op)) + ")");
}

}  // namespace qkv::interp
