// qkv/ir/grad_builder.hpp — the pieces reverse mode (qkv/ir/grad.hpp) and the training steps
// (qkv/ir/train.hpp) build IR with: Builder (fills, sums over axes, permutes, renames,
// contractions in the IR's canonical order, pointwise nodes and their loads, one-hots), DExpr,
// the symbolic derivative of a ModExpr, one rule per ModOp, and tiling, which lays the parts a
// tensor's slices took end to end (their gradients then one concat).
//
// Plain data, no templates beyond the builders' callbacks.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <qkv/ir/error.hpp>
#include <qkv/ir/graph.hpp>
#include <qkv/ir/mod_expr.hpp>

namespace qkv {

/// A graph reverse mode cannot differentiate (an op without a rule, a loss that is not a
/// scalar, a captured tensor read at computed coordinates): one line naming the node.
struct GradError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

namespace grad_detail {

inline bool is_float(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16; }

inline std::vector<std::string> names_of(const std::vector<Axis>& axes) {
  std::vector<std::string> out;
  for (const auto& a : axes) out.push_back(a.name);
  return out;
}
inline bool has(const std::vector<Axis>& axes, const std::string& name) {
  return std::any_of(axes.begin(), axes.end(), [&](const Axis& a) { return a.name == name; });
}
inline const Axis& axis_named(const std::vector<Axis>& axes, const std::string& name) {
  for (const auto& a : axes)
    if (a.name == name) return a;
  internal_error("grad: no axis `" + name + "`");
}

/// Equal sizes: num/den in lowest terms, and no symbol in a size that is a multiple 0 of it (the
/// start of part 0 of K, part.times(0)).
inline bool same_size(const Extent& a, const Extent& b) {
  auto canonical = [](const Extent& e) { return e.is_dynamic() && e.num == 0 ? Extent::fixed(e.plus) : e.times(1); };
  return canonical(a) == canonical(b);
}
inline bool empty_extent(const Extent& e) { return same_size(e, Extent::fixed(0)); }

/// The gradient of a part of x along `axis`: `piece` (over x's axes renamed, axis `len` long),
/// `before` and `after` it the rest of x's axis.
struct SlicePart {
  std::string axis;
  Extent before, len, after;
  int piece;
};

/// The parts' order when they lie end to end from 0 to `whole` along one axis, each once.
inline std::optional<std::vector<std::size_t>> tiling(const std::vector<SlicePart>& parts, const Extent& whole) {
  std::vector<std::size_t> order;
  std::vector<bool> used(parts.size(), false);
  Extent at = Extent::fixed(0);
  try {
    while (order.size() < parts.size()) {
      std::size_t k = 0;
      while (k < parts.size() && (used[k] || parts[k].axis != parts[0].axis || !same_size(parts[k].before, at))) ++k;
      if (k == parts.size()) return std::nullopt;
      used[k] = true;
      order.push_back(k);
      at = at.plus_extent(parts[k].len);
    }
  } catch (const std::exception&) {  // parts of unrelated run-time lengths
    return std::nullopt;
  }
  return same_size(at, whole) ? std::optional(order) : std::nullopt;
}

/// Symbolic derivative of a ModExpr's node values with respect to one variable leaf, appended to
/// `e` (whose nodes it reads): d[i] is the id of d node_i / d var, or −1 for zero.
class DExpr {
 public:
  DExpr(ModExpr& e, std::vector<bool> is_var) : e_(e), var_(std::move(is_var)) {}

  /// d node `root` / d var (−1: zero), for the nodes [0, n) of e as they were when called.
  int of(int root, std::size_t n) {
    std::vector<int> d(n, -1);
    for (std::size_t i = 0; i < n; ++i) d[i] = one(static_cast<int>(i), d);
    return root < 0 ? -1 : d[static_cast<std::size_t>(root)];
  }

  int constant(double v) { return e_.add(mod_constant(v)); }
  int op(ModOp o, int a, int b = -1, int c = -1) { return e_.add(mod_node(o, a, b, c)); }
  /// a + b where either may be zero (−1).
  int sum(int a, int b) { return a < 0 ? b : b < 0 ? a : op(ModOp::add, a, b); }
  /// a · b where either may be zero (−1).
  int prod(int a, int b) { return a < 0 || b < 0 ? -1 : op(ModOp::mul, a, b); }
  int or_zero(int a) { return a < 0 ? constant(0.0) : a; }

 private:
  int one(int i, const std::vector<int>& d) {
    const ModNode n = e_.nodes[static_cast<std::size_t>(i)];  // a copy: adding nodes moves them
    auto da = [&] { return n.a < 0 ? -1 : d[static_cast<std::size_t>(n.a)]; };
    auto db = [&] { return n.b < 0 ? -1 : d[static_cast<std::size_t>(n.b)]; };
    switch (n.op) {
      case ModOp::score:
      case ModOp::load:
        return var_[static_cast<std::size_t>(i)] ? constant(1.0) : -1;
      case ModOp::index:
      case ModOp::position:
      case ModOp::length:
      case ModOp::constant:
      case ModOp::lt:
      case ModOp::le:
      case ModOp::gt:
      case ModOp::ge:
      case ModOp::eq:
      case ModOp::ne:
      case ModOp::logical_and:
      case ModOp::logical_or:
      case ModOp::logical_not:
        return -1;
      case ModOp::add:
        return sum(da(), db());
      case ModOp::sub:
        return db() < 0 ? da() : sum(da(), op(ModOp::neg, db()));
      case ModOp::mul:
        return sum(prod(da(), n.b), prod(n.a, db()));
      case ModOp::div: {
        // d(a/b) = da/b − a·db/b²
        const int first = da() < 0 ? -1 : op(ModOp::div, da(), n.b);
        const int second = db() < 0 ? -1 : op(ModOp::div, prod(n.a, db()), op(ModOp::mul, n.b, n.b));
        return second < 0 ? first : sum(first, op(ModOp::neg, second));
      }
      case ModOp::min:
      case ModOp::max: {
        if (da() < 0 && db() < 0) return -1;
        const int pick_a = op(n.op == ModOp::min ? ModOp::le : ModOp::ge, n.a, n.b);
        return op(ModOp::where, pick_a, or_zero(da()), or_zero(db()));
      }
      case ModOp::neg:
        return da() < 0 ? -1 : op(ModOp::neg, da());
      case ModOp::abs: {
        if (da() < 0) return -1;
        const int zero = constant(0.0);
        // sign(a)·da, 0 at a = 0 (PyTorch's abs backward).
        return op(ModOp::where, op(ModOp::gt, n.a, zero), da(),
                  op(ModOp::where, op(ModOp::lt, n.a, zero), op(ModOp::neg, da()), zero));
      }
      case ModOp::exp:
        return prod(da(), i);
      case ModOp::log:
        return da() < 0 ? -1 : op(ModOp::div, da(), n.a);
      case ModOp::tanh:  // (1 − t²)·da
        return prod(da(), op(ModOp::sub, constant(1.0), op(ModOp::mul, i, i)));
      case ModOp::sqrt:  // da / (2·sqrt a)
        return da() < 0 ? -1 : op(ModOp::div, da(), op(ModOp::mul, constant(2.0), i));
      case ModOp::rsqrt:  // −½·r³·da
        return prod(da(), op(ModOp::mul, constant(-0.5), op(ModOp::mul, i, op(ModOp::mul, i, i))));
      case ModOp::sigmoid:  // s·(1 − s)·da
        return prod(da(), op(ModOp::mul, i, op(ModOp::sub, constant(1.0), i)));
      case ModOp::erf:  // 2/√π · e^(−a²) · da
        return prod(da(), op(ModOp::mul, constant(2.0 / std::sqrt(std::acos(-1.0))),
                             op(ModOp::exp, op(ModOp::neg, op(ModOp::mul, n.a, n.a)))));
      case ModOp::pow: {
        // b·a^(b−1)·da + a^b·ln a·db
        const int first =
            da() < 0 ? -1 : prod(da(), op(ModOp::mul, n.b, op(ModOp::pow, n.a, op(ModOp::sub, n.b, constant(1.0)))));
        const int second = db() < 0 ? -1 : prod(db(), op(ModOp::mul, i, op(ModOp::log, n.a)));
        return sum(first, second);
      }
      case ModOp::where: {
        if (da() < 0 && db() < 0 && (n.c < 0 || d[static_cast<std::size_t>(n.c)] < 0)) return -1;
        const int dc = n.c < 0 ? -1 : d[static_cast<std::size_t>(n.c)];
        return op(ModOp::where, n.a, or_zero(db()), or_zero(dc));
      }
    }
    return -1;
  }

  ModExpr& e_;
  std::vector<bool> var_;
};

/// The reverse-mode builder: adjoints accumulated per forward node, rules appending IR nodes.
class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}

  [[nodiscard]] const Node& node(int id) const { return g_.node(id); }
  /// The forward value of node `id` as a rule reads it: the one place that decides recompute vs
  /// store (stored: the forward node is read where it is).
  [[nodiscard]] int primal(int id) const { return id; }

  int add_node(Node n) { return g_.add(std::move(n)); }

  /// A constant `v` over `axes`.
  int fill(std::vector<Axis> axes, double v, DType dt) {
    Node n;
    n.op = Op::fill;
    n.axes = std::move(axes);
    n.scalar = v;
    n.dtype = dt;
    return add_node(std::move(n));
  }

  /// x summed over the axes `drop` (a contraction with ones).
  int sum_over(int x, const std::vector<std::string>& drop) {
    if (drop.empty()) return x;
    const Node xn = node(x);
    std::vector<Axis> ones_axes, out_axes;
    for (const auto& a : xn.axes)
      (std::find(drop.begin(), drop.end(), a.name) != drop.end() ? ones_axes : out_axes).push_back(a);
    const DType dt = xn.dtype;
    const int ones = fill(ones_axes, 1.0, dt);
    Node c;
    c.op = Op::contract;
    c.inputs = {x, ones};
    c.axes = out_axes;
    c.attr_axes = drop;
    c.dtype = dt;
    return add_node(std::move(c));
  }

  /// x laid out as `target`'s axes (a permute when the order differs; the same names).
  int permute_to(int x, const std::vector<Axis>& target) {
    const Node xn = node(x);
    if (names_of(xn.axes) == names_of(target)) return x;
    Node p;
    p.op = Op::permute;
    p.inputs = {x};
    p.dtype = xn.dtype;
    for (const auto& t : target) p.axes.push_back(axis_named(xn.axes, t.name));
    return add_node(std::move(p));
  }

  /// contract(lhs, rhs) over `contracted`, its output in the IR's canonical order (lhs's kept
  /// axes, then rhs's kept axes lhs lacks), then laid out as `target` (the same names).
  int contract_to(int lhs, int rhs, const std::vector<std::string>& contracted, const std::vector<Axis>& target,
                  DType dt) {
    const std::vector<Axis> la = node(lhs).axes, ra = node(rhs).axes;
    auto kept = [&](const Axis& a) {
      return std::find(contracted.begin(), contracted.end(), a.name) == contracted.end();
    };
    Node c;
    c.op = Op::contract;
    c.inputs = {lhs, rhs};
    c.attr_axes = contracted;
    c.dtype = dt;
    for (const auto& a : la)
      if (kept(a)) c.axes.push_back(a);
    for (const auto& a : ra)
      if (kept(a) && !has(la, a.name)) c.axes.push_back(a);
    return permute_to(add_node(std::move(c)), target);
  }

  /// An adjoint `adj` (over the consumer's axes) reduced to the axes of `target`, which it
  /// broadcast by name into them: summed over the axes it lacks, laid out in its order.
  int sum_to(int adj, const Node target) {
    std::vector<std::string> drop;
    for (const auto& a : node(adj).axes)
      if (!has(target.axes, a.name)) drop.push_back(a.name);
    for (const auto& a : target.axes)
      if (!has(node(adj).axes, a.name))
        throw GradError("grad: the gradient reaching a tensor over " + axes_str(target.axes) + " lacks its axis `" +
                        a.name + "`");
    return permute_to(sum_over(adj, drop), target.axes);
  }

  int binary(Op op, int a, int b) {
    Node n;
    n.op = op;
    n.inputs = {a, b};
    n.axes = node(a).axes;
    n.dtype = node(a).dtype;
    return add_node(std::move(n));
  }
  int scaled(int x, double s) {
    Node n;
    n.op = Op::scale;
    n.inputs = {x};
    n.axes = node(x).axes;
    n.dtype = node(x).dtype;
    n.scalar = s;
    return add_node(std::move(n));
  }

  /// A pointwise node over `inputs` (the first gives the axes and, unless given, the dtype).
  int pointwise(std::vector<int> inputs, ModExpr e, std::optional<DType> dt = {}) {
    Node n;
    n.op = Op::pointwise;
    n.axes = node(inputs[0]).axes;
    n.dtype = dt.value_or(node(inputs[0]).dtype);
    n.inputs = std::move(inputs);
    n.mod = std::move(e);
    return add_node(std::move(n));
  }

  /// dy · f'(x) for an element-wise f: `derivative(e, x)` builds f'(x) in e from the node x
  /// (a load of the primal). The result has dy's axes.
  template <class F>
  int elementwise(int dy, int x, F&& derivative) {
    ModExpr e;
    const int s = e.add(mod_node(ModOp::score));
    const int xv = mod_load_in_place(e, 1, node(x).axes);
    const int d = derivative(e, xv);
    e.score = e.add(mod_node(ModOp::mul, s, d));
    return pointwise({dy, x}, std::move(e));
  }

  /// x with its axes renamed, in order, to `names` (renames one at a time, through temporary
  /// names where two would clash).
  int rename_axes(int x, const std::vector<std::string>& names) {
    std::vector<Axis> axes = node(x).axes;
    if (names_of(axes) == names) return x;
    auto rename = [&](int v, const std::string& from, const std::string& to) {
      Node r;
      r.op = Op::rename;
      r.inputs = {v};
      r.dtype = node(v).dtype;
      r.attr_axes = {from, to};
      for (auto a : node(v).axes) {
        if (a.name == from) a.name = to;
        r.axes.push_back(a);
      }
      return add_node(std::move(r));
    };
    for (std::size_t i = 0; i < axes.size(); ++i) x = rename(x, axes[i].name, "__grad_tmp" + std::to_string(i));
    for (std::size_t i = 0; i < axes.size(); ++i) x = rename(x, "__grad_tmp" + std::to_string(i), names[i]);
    return x;
  }

  /// ids [...] (integers) as a one-hot over `classes`: [..., classes], `on` where the entry's class
  /// index is its id, 0 elsewhere (an id outside the classes matches none).
  int one_hot(int ids, const Axis& classes, double on, DType dt) {
    Node b;
    b.op = Op::broadcast;
    b.inputs = {ids};
    b.axes = node(ids).axes;
    b.axes.push_back(classes);
    b.dtype = node(ids).dtype;
    const int ids_b = add_node(std::move(b));
    ModExpr e;
    ModNode k;
    k.op = ModOp::index;
    k.axis = classes.name;
    const int match = e.add(mod_node(ModOp::eq, e.add(mod_node(ModOp::score)), e.add(std::move(k))));
    e.score = e.add(mod_node(ModOp::where, match, e.add(mod_constant(on)), e.add(mod_constant(0.0))));
    return pointwise({ids_b}, std::move(e), dt);
  }

  static std::string axes_str(const std::vector<Axis>& axes) {
    std::string s = "[";
    for (std::size_t i = 0; i < axes.size(); ++i) s += (i ? ", " : "") + axes[i].name;
    return s + "]";
  }

  Graph& g_;
};

}  // namespace grad_detail

}  // namespace qkv
