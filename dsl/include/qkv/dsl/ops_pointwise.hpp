// qkv/dsl/ops_pointwise.hpp — element-wise math on tensors: tanh, sigmoid, exp, log, sqrt,
// rsqrt, abs, erf, pow, gelu_tanh, clamp, min, max, where, arithmetic with scalars (x * 0.5,
// 1.0 - x, -x), arange (positions as a value) and broadcast_like (repetition by name).
//
// Each is one `pointwise` node of the Graph IR holding an expression (the ModExpr of score mods,
// qkv/ir/mod_expr.hpp) over its first input's entry and its other inputs, read by axis name; the
// canonicalize pass merges a chain of them into one node, so gelu_tanh or a user's own
// composition is one loop in the compiled code, on every backend that runs mod expressions.
// Every operand is checked like add's: a floating tensor (a bool condition for where), and every
// axis of a second operand an axis of the first, of the same size — so broadcasting is by name.
// The results are plain tensors (not scores): element-wise math between a contraction and
// softmax belongs in a score_mod.
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include <qkv/dsl/ops_math.hpp>

namespace qkv {

namespace detail {

/// The expression of one pointwise node while it is built: x is its first input's entry.
class pointwise_expr {
 public:
  pointwise_expr() { x_ = add(mod_node(ModOp::score)); }
  [[nodiscard]] int x() const { return x_; }
  int constant(double v) { return add(mod_constant(v)); }
  int op(ModOp o, int a, int b = -1, int c = -1) { return add(mod_node(o, a, b, c)); }
  /// The entry's coordinate along `axis`.
  int index(std::string axis) {
    ModNode i;
    i.op = ModOp::index;
    i.axis = std::move(axis);
    return add(std::move(i));
  }
  /// Input `input` of the node at this entry: indexed by the entry's coordinate along each of
  /// its axes (by name; they are axes of the first input).
  int load(int input, const std::vector<Axis>& axes) {
    ModNode l;
    l.op = ModOp::load;
    l.input = input;
    for (const auto& a : axes) l.at.push_back(index(a.name));
    return add(std::move(l));
  }
  [[nodiscard]] ModExpr finish(int root) && {
    e_.score = root;
    return std::move(e_);
  }

 private:
  int add(ModNode n) { return e_.add(std::move(n)); }
  ModExpr e_;
  int x_ = -1;
};

/// The node computing `root` of `e` over x and `others` (x's axes and dtype, a plain tensor).
template <class T>
auto pointwise_tensor(const T& x, const std::vector<int>& others, pointwise_expr&& e, int root) {
  Node n = unary_node(x, Op::pointwise, x.node().axes);
  n.inputs.insert(n.inputs.end(), others.begin(), others.end());
  n.mod = std::move(e).finish(root);
  return make<typename T::dtype, typename T::axis_list, trait::plain>(x.graph(), std::move(n));
}

template <fixed_string Op, class T>
constexpr auto not_float_text() {
  return Op + ": " + axes_fs<typename T::axis_list>() + " is " + T::dtype::name +
         ", not a floating tensor; fix: convert<f32>(x) first (a mask selects with where)";
}
template <fixed_string Op, class T>
constexpr auto not_float_error() {
  return fail<not_float_text<Op, T>()>();
}

/// f(e, x) builds the expression of a one-input function.
template <fixed_string Op, class T, class F>
auto pointwise_unary(const T& t, F&& f) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else if constexpr (!is_float_dtype<typename T::dtype>) {
    return not_float_error<Op, T>();
  } else {
    pointwise_expr e;
    const int root = f(e, e.x());
    return pointwise_tensor(t, {}, std::move(e), root);
  }
}

/// broadcast_problem (ops_math.hpp) with the pointwise ops' fixes.
inline constexpr fixed_string kSameSizes = "every axis of rhs must be an axis of lhs, of the same size";
template <fixed_string Op, class A, class B>
constexpr auto pointwise_problem() {
  return broadcast_problem<Op, A, B, kSameSizes + " (the operand with every axis goes first)", kSameSizes>();
}

/// The run-time half of pointwise_problem: shared dynamic axes of rhs b and lhs a checked when
/// the sizes are bound.
template <fixed_string Op, class A, class B>
void defer_pointwise(const A& a, const B& b) {
  defer_shared<Op, typename A::axis_list>(a.graph(), a.node(), b.node(), [](auto) { return kSameSizes; });
}

/// f(e, x, y) builds the expression of a two-input function, y broadcast into x by name.
template <fixed_string Op, class A, class B, class F>
auto pointwise_binary(const A& a, const B& b, F&& f) {
  if constexpr (any_poison<A, B>) {
    return poison{};
  } else if constexpr (!is_float_dtype<typename A::dtype>) {
    return not_float_error<Op, A>();
  } else if constexpr (!is_float_dtype<typename B::dtype>) {
    return not_float_error<Op, B>();
  } else if constexpr (constexpr auto why = pointwise_problem<Op, A, B>(); why.size() > 0) {
    return fail<why>();
  } else {
    defer_pointwise<Op>(a, b);
    pointwise_expr e;
    const int y = e.load(1, b.node().axes);
    const int root = f(e, e.x(), y);
    return pointwise_tensor(a, {b.id()}, std::move(e), root);
  }
}

}  // namespace detail

// --- one input -----------------------------------------------------------------------------------

template <TensorType T>
auto tanh(const T& t) {
  return detail::pointwise_unary<"tanh">(t, [](auto& e, int x) { return e.op(ModOp::tanh, x); });
}
/// 1 / (1 + e^−x).
template <TensorType T>
auto sigmoid(const T& t) {
  return detail::pointwise_unary<"sigmoid">(t, [](auto& e, int x) { return e.op(ModOp::sigmoid, x); });
}
template <TensorType T>
auto exp(const T& t) {
  return detail::pointwise_unary<"exp">(t, [](auto& e, int x) { return e.op(ModOp::exp, x); });
}
/// The natural logarithm (−inf at 0, NaN below).
template <TensorType T>
auto log(const T& t) {
  return detail::pointwise_unary<"log">(t, [](auto& e, int x) { return e.op(ModOp::log, x); });
}
template <TensorType T>
auto sqrt(const T& t) {
  return detail::pointwise_unary<"sqrt">(t, [](auto& e, int x) { return e.op(ModOp::sqrt, x); });
}
/// 1 / sqrt(x), as torch.rsqrt.
template <TensorType T>
auto rsqrt(const T& t) {
  return detail::pointwise_unary<"rsqrt">(t, [](auto& e, int x) { return e.op(ModOp::rsqrt, x); });
}
template <TensorType T>
auto abs(const T& t) {
  return detail::pointwise_unary<"abs">(t, [](auto& e, int x) { return e.op(ModOp::abs, x); });
}
template <TensorType T>
auto erf(const T& t) {
  return detail::pointwise_unary<"erf">(t, [](auto& e, int x) { return e.op(ModOp::erf, x); });
}
/// x^p, as torch.pow with a number exponent (p = 2, 3, −1: products and a quotient, exact).
template <TensorType T>
auto pow(const T& t, double p) {
  return detail::pointwise_unary<"pow">(t, [p](auto& e, int x) {
    if (p == 1.0) return e.op(ModOp::mul, x, e.constant(1.0));
    if (p == 2.0) return e.op(ModOp::mul, x, x);
    if (p == 3.0) return e.op(ModOp::mul, e.op(ModOp::mul, x, x), x);
    if (p == -1.0) return e.op(ModOp::div, e.constant(1.0), x);
    return e.op(ModOp::pow, x, e.constant(p));
  });
}
/// GELU's tanh form, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): torch's gelu(approximate="tanh"),
/// Hugging Face's gelu_new / gelu_pytorch_tanh (GPT-2). Computed as x·sigmoid(2·√(2/π)·(...)),
/// the same function without 1 + tanh's cancellation (far below 0 it keeps its relative accuracy
/// where the tanh form in f32 rounds to 0).
template <TensorType T>
auto gelu_tanh(const T& t) {
  return detail::pointwise_unary<"gelu_tanh">(t, [](auto& e, int x) {
    const int x3 = e.op(ModOp::mul, e.op(ModOp::mul, x, x), x);
    const int inner = e.op(ModOp::mul, e.constant(2.0 * 0.7978845608028654),  // 2·√(2/π)
                           e.op(ModOp::add, x, e.op(ModOp::mul, e.constant(0.044715), x3)));
    return e.op(ModOp::mul, x, e.op(ModOp::sigmoid, inner));
  });
}
/// x limited to [lo, hi], as torch.clamp: NaN stays NaN.
template <TensorType T>
auto clamp(const T& t, double lo, double hi) {
  return detail::pointwise_unary<"clamp">(t, [lo, hi](auto& e, int x) {
    const int l = e.constant(lo), h = e.constant(hi);
    return e.op(ModOp::where, e.op(ModOp::lt, x, l), l, e.op(ModOp::where, e.op(ModOp::gt, x, h), h, x));
  });
}

/// x repeated over the axes of `like` it lacks: the result has like's axes (in like's order) and
/// x's values and dtype — e.g. a learned token [Seq = 1, Model] made [Batch, Seq = 1, Model] for
/// a batch. Every axis of x must be an axis of like, of the same size.
template <TensorType X, TensorType Like>
auto broadcast_like(const X& x, const Like& like) {
  if constexpr (constexpr auto why = detail::pointwise_problem<"broadcast_like", Like, X>(); why.size() > 0) {
    return fail<why>();
  } else {
    detail::defer_pointwise<"broadcast_like">(like, x);
    std::vector<Axis> target = like.node().axes;
    Node n = detail::unary_node(x, Op::broadcast, std::move(target));
    return detail::make<typename X::dtype, typename Like::axis_list, trait::plain>(x.graph(), std::move(n));
  }
}

/// Positions as a value: an i64 tensor with like's axes whose entries are their coordinates along
/// Ax (torch.arange broadcast like `like`): arange<Seq>(ids) gives GPT-2's position ids [Batch, Seq]
/// for embedding(wpe, ...). Exact below 2^24 (integers are held in f32).
template <template <auto> class Ax, TensorType T>
auto arange(const T& like) {
  using L = typename T::axis_list;
  if constexpr (!has_family<L, Ax>) {
    return missing_axis<"arange", L, Ax>();
  } else {
    detail::pointwise_expr e;
    const int root = e.index(std::string(find_family<L, Ax>::name));
    Node n = detail::unary_node(like, Op::pointwise, like.node().axes);
    n.mod = std::move(e).finish(root);
    return detail::make<i64, L, trait::plain>(like.graph(), std::move(n));
  }
}

// --- with a number ------------------------------------------------------------------------------

namespace detail {
template <fixed_string Op, ModOp O, bool NumberFirst, class T>
auto with_number(const T& t, double v) {
  return pointwise_unary<Op>(t, [v](auto& e, int x) {
    const int c = e.constant(v);
    return NumberFirst ? e.op(O, c, x) : e.op(O, x, c);
  });
}
}  // namespace detail

template <TensorType T>
auto operator+(const T& t, double v) {
  return detail::with_number<"+", ModOp::add, false>(t, v);
}
template <TensorType T>
auto operator+(double v, const T& t) {
  return detail::with_number<"+", ModOp::add, true>(t, v);
}
template <TensorType T>
auto operator-(const T& t, double v) {
  return detail::with_number<"-", ModOp::sub, false>(t, v);
}
template <TensorType T>
auto operator-(double v, const T& t) {
  return detail::with_number<"-", ModOp::sub, true>(t, v);
}
template <TensorType T>
auto operator*(const T& t, double v) {
  return detail::with_number<"*", ModOp::mul, false>(t, v);
}
template <TensorType T>
auto operator*(double v, const T& t) {
  return detail::with_number<"*", ModOp::mul, true>(t, v);
}
template <TensorType T>
auto operator/(const T& t, double v) {
  return detail::with_number<"/", ModOp::div, false>(t, v);
}
template <TensorType T>
auto operator/(double v, const T& t) {
  return detail::with_number<"/", ModOp::div, true>(t, v);
}
template <TensorType T>
auto operator-(const T& t) {
  return detail::pointwise_unary<"-">(t, [](auto& e, int x) { return e.op(ModOp::neg, x); });
}

// --- two and three tensors ----------------------------------------------------------------------

/// a ⊕ b entry by entry, b broadcast into a by name (plain tensors: unlike add / mul, these do
/// not carry the meaning of scores, a residual or a scale; use those where it matters).
template <TensorType A, TensorType B>
auto operator+(const A& a, const B& b) {
  return detail::pointwise_binary<"+">(a, b, [](auto& e, int x, int y) { return e.op(ModOp::add, x, y); });
}
template <TensorType A, TensorType B>
auto operator-(const A& a, const B& b) {
  return detail::pointwise_binary<"-">(a, b, [](auto& e, int x, int y) { return e.op(ModOp::sub, x, y); });
}
template <TensorType A, TensorType B>
auto operator*(const A& a, const B& b) {
  return detail::pointwise_binary<"*">(a, b, [](auto& e, int x, int y) { return e.op(ModOp::mul, x, y); });
}
template <TensorType A, TensorType B>
auto operator/(const A& a, const B& b) {
  return detail::pointwise_binary<"/">(a, b, [](auto& e, int x, int y) { return e.op(ModOp::div, x, y); });
}

/// The larger of a and b entry by entry, b broadcast into a by name; NaN in either gives NaN (as
/// torch.maximum).
template <TensorType A, TensorType B>
auto max(const A& a, const B& b) {
  return detail::pointwise_binary<"max">(a, b, [](auto& e, int x, int y) {
    const int pick_x = e.op(ModOp::logical_or, e.op(ModOp::gt, x, y), e.op(ModOp::ne, x, x));
    return e.op(ModOp::where, pick_x, x, y);
  });
}
/// The smaller of a and b entry by entry, b broadcast into a by name; NaN in either gives NaN.
template <TensorType A, TensorType B>
auto min(const A& a, const B& b) {
  return detail::pointwise_binary<"min">(a, b, [](auto& e, int x, int y) {
    const int pick_x = e.op(ModOp::logical_or, e.op(ModOp::lt, x, y), e.op(ModOp::ne, x, x));
    return e.op(ModOp::where, pick_x, x, y);
  });
}
/// a^b entry by entry, b broadcast into a by name.
template <TensorType A, TensorType B>
auto pow(const A& a, const B& b) {
  return detail::pointwise_binary<"pow">(a, b, [](auto& e, int x, int y) { return e.op(ModOp::pow, x, y); });
}

namespace detail {
/// What is wrong with where's b (a number, or a floating tensor broadcast into a), or "".
template <class A, class B>
constexpr auto where_rhs_problem() {
  if constexpr (std::is_arithmetic_v<B>)
    return fixed_string("");
  else if constexpr (!is_float_dtype<typename B::dtype>)
    return not_float_text<"where", B>();
  else
    return pointwise_problem<"where", A, B>();
}
}  // namespace detail

/// a where cond holds, else b: cond a bool tensor, b a tensor or a number, each broadcast into a
/// by name (a's axes are the result's), as torch.where.
template <TensorType C, TensorType A, class B>
  requires(TensorType<B> || std::is_arithmetic_v<B>)
auto where(const C& cond, const A& a, const B& b) {
  if constexpr (!std::is_same_v<typename C::dtype, boolean>) {
    return fail<fixed_string("where: the condition ") + axes_fs<typename C::axis_list>() + " is " + C::dtype::name +
                ", not bool; fix: compare first, or pass a bool mask">();
  } else if constexpr (!detail::is_float_dtype<typename A::dtype>) {
    return detail::not_float_error<"where", A>();
  } else if constexpr (constexpr auto why = detail::pointwise_problem<"where", A, C>(); why.size() > 0) {
    return fail<why>();
  } else if constexpr (constexpr auto why_b = detail::where_rhs_problem<A, B>(); why_b.size() > 0) {
    return fail<why_b>();
  } else {
    detail::pointwise_expr e;
    detail::defer_pointwise<"where">(a, cond);
    std::vector<int> inputs{cond.id()};
    const int c = e.load(1, cond.node().axes);
    int y = -1;  // b's value
    if constexpr (std::is_arithmetic_v<B>) {
      y = e.constant(static_cast<double>(b));
    } else {
      detail::defer_pointwise<"where">(a, b);
      inputs.push_back(b.id());
      y = e.load(2, b.node().axes);
    }
    const int root = e.op(ModOp::where, c, e.x(), y);
    return detail::pointwise_tensor(a, inputs, std::move(e), root);
  }
}

}  // namespace qkv
