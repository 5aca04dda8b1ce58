// qkv/dsl/mod_values.hpp — what a score or mask mod is traced with (see score_mod.hpp): typed
// values (numbers and bools) that are nodes of the ModExpr being built, the index variables b, h,
// q, k of the score axes, their operators and functions (+ - * / min max abs exp log tanh sqrt
// rsqrt sigmoid erf pow,
// comparisons, && || !, where), and loads t[i][j]... from captured tensors. Every type rule of
// score_mod.hpp's header is checked here, at the operator or the load that breaks it.
#pragma once

#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <qkv/dsl/ops_math.hpp>

namespace qkv {

// --- what modded() traces with ----------------------------------------------------------------

/// The role of an index variable (and of a score axis).
enum class mod_role : std::uint8_t { batch, head, query, key };
enum class mod_kind : std::uint8_t { number, boolean };

/// Where a traced expression comes from: the mod kind ("score_mod" / "mask_mod", for messages)
/// and the axes of the scores.
template <fixed_string Op, class ScoresL>
struct mod_ctx {
  static constexpr auto op = Op;
  using scores = ScoresL;
};

/// What the type of an expression records: its context (void for a bare constant), the axes of
/// the index variables it mixes, by role ("" where none), and whether it reads a query position.
template <class Ctx, fixed_string B, fixed_string H, fixed_string Q, fixed_string K, bool QPos>
struct mod_tag {
  using ctx = Ctx;
  static constexpr auto b = B;
  static constexpr auto h = H;
  static constexpr auto q = Q;
  static constexpr auto k = K;
  static constexpr bool qpos = QPos;
};

/// A traced number or bool: a node of the ModExpr being built.
template <mod_kind Kind, class Tag>
struct mod_value {
  static constexpr mod_kind kind = Kind;
  using tag = Tag;
  int id = -1;
};

/// b, h, q or k: the coordinate of an entry along the axes IL of the scores (h: every head axis;
/// b and h of scores with fewer than three / four axes: none).
template <class Ctx, mod_role R, class IL>
struct mod_index {
  using ctx = Ctx;
  static constexpr mod_role role = R;
  using axis_list = IL;
  /// The extent of the axes in this call (ModOp::length; several head axes: their product).
  [[nodiscard]] auto length() const;
};

/// A tensor indexed along its first Done axes (at: the index expressions so far).
template <class T, std::size_t Done, class Ctx, bool QPos>
struct mod_partial {
  using tensor_type = T;
  Graph* graph;
  int node;
  std::vector<int> at;
  template <class I>
  auto operator[](const I& i) const;
};

/// score_mod(f [, align]) / mask_mod(f [, align]) and mask combinations.
template <class F, class Align, bool Softcap = false>
struct score_mod_t {
  F f;
};
template <class F, class Align>
struct mask_mod_t {
  F f;
};
template <class A, class B>
struct mask_and_t {
  A a;
  B b;
};
template <class A, class B>
struct mask_or_t {
  A a;
  B b;
};
template <class A>
struct mask_not_t {
  A a;
};

template <class T>
inline constexpr bool is_score_mod = false;
template <class F, class A, bool S>
inline constexpr bool is_score_mod<score_mod_t<F, A, S>> = true;
template <class T>
inline constexpr bool is_mask_mod = false;
template <class F, class A>
inline constexpr bool is_mask_mod<mask_mod_t<F, A>> = true;
template <class A, class B>
inline constexpr bool is_mask_mod<mask_and_t<A, B>> = true;
template <class A, class B>
inline constexpr bool is_mask_mod<mask_or_t<A, B>> = true;
template <class A>
inline constexpr bool is_mask_mod<mask_not_t<A>> = true;

template <class T>
concept MaskMod = is_mask_mod<std::remove_cvref_t<T>>;

/// score_mod(f): f(s, b, h, q, k) returns the new score (a number).
template <class F, class Align = unaligned_t>
auto score_mod(F f, Align /*align*/ = {}) {
  return score_mod_t<F, Align>{std::move(f)};
}
/// mask_mod(f): f(b, h, q, k) returns whether the entry is kept (a bool).
template <class F, class Align = unaligned_t>
auto mask_mod(F f, Align /*align*/ = {}) {
  return mask_mod_t<F, Align>{std::move(f)};
}
template <MaskMod A, MaskMod B>
auto operator&&(const A& a, const B& b) {
  return mask_and_t<A, B>{a, b};
}
template <MaskMod A, MaskMod B>
auto operator||(const A& a, const B& b) {
  return mask_or_t<A, B>{a, b};
}
template <MaskMod A>
auto operator!(const A& a) {
  return mask_not_t<A>{a};
}

namespace detail {

// --- the trace: the expression being built, and the tensors it reads ----------------------------

struct mod_trace {
  ModExpr expr;
  Graph* graph = nullptr;
  std::vector<std::string> score_axes;
  std::vector<int> captured;  // node ids; input k of the score_mod node is captured[k - 1]

  /// Appends a node, or returns an identical one already there.
  int emit(ModNode n) {
    for (std::size_t i = 0; i < expr.nodes.size(); ++i)
      if (expr.nodes[i] == n) return static_cast<int>(i);
    return expr.add(std::move(n));
  }
  int capture(Graph& g, int id) {
    if (&g != graph)
      throw std::invalid_argument(
          "modded: a mod reads a tensor of another Graph; fix: build the tensors a mod reads "
          "in the graph of the scores");
    for (std::size_t i = 0; i < captured.size(); ++i)
      if (captured[i] == id) return static_cast<int>(i) + 1;
    captured.push_back(id);
    return static_cast<int>(captured.size());
  }
};

inline mod_trace*& current_trace() {
  thread_local mod_trace* t = nullptr;
  return t;
}
inline mod_trace& trace() {
  mod_trace* t = current_trace();
  if (t == nullptr)
    throw std::logic_error("qkv: score_mod / mask_mod expressions exist only while modded() traces them");
  return *t;
}
inline int emit(ModNode n) { return trace().emit(std::move(n)); }
inline int emit_leaf(ModOp op, std::string axis) {
  ModNode n;
  n.op = op;
  n.axis = std::move(axis);
  return emit(std::move(n));
}
inline int emit_constant(double v) { return emit(mod_constant(v)); }
inline int emit_op(ModOp op, int a, int b = -1, int c = -1) { return emit(mod_node(op, a, b, c)); }

// --- what an operand is ----------------------------------------------------------------------

enum class mod_cat : std::uint8_t { other, value, index, partial, tensor, poison, number, boolean };

template <class T>
struct mod_cat_of {
  static constexpr mod_cat value = std::is_same_v<T, bool>   ? mod_cat::boolean
                                   : std::is_arithmetic_v<T> ? mod_cat::number
                                   : TensorType<T>           ? mod_cat::tensor
                                   : is_poison<T>            ? mod_cat::poison
                                                             : mod_cat::other;
};
template <mod_kind K, class Tag>
struct mod_cat_of<mod_value<K, Tag>> {
  static constexpr mod_cat value = mod_cat::value;
};
template <class C, mod_role R, class IL>
struct mod_cat_of<mod_index<C, R, IL>> {
  static constexpr mod_cat value = mod_cat::index;
};
template <class T, std::size_t D, class C, bool Q>
struct mod_cat_of<mod_partial<T, D, C, Q>> {
  static constexpr mod_cat value = mod_cat::partial;
};
template <class T>
inline constexpr mod_cat cat = mod_cat_of<std::remove_cvref_t<T>>::value;

/// Types that make an operator a mod operator: traced values, indices, partial loads, poison.
template <class T>
inline constexpr bool mod_trigger =
    cat<T> == mod_cat::value || cat<T> == mod_cat::index || cat<T> == mod_cat::partial || cat<T> == mod_cat::poison;

/// Whether an operand is a number or a bool (for operands that are either).
template <class T>
constexpr bool is_bool_operand() {
  if constexpr (cat<T> == mod_cat::value)
    return std::remove_cvref_t<T>::kind == mod_kind::boolean;
  else
    return cat<T> == mod_cat::boolean;
}
template <class T>
inline constexpr bool is_expr_operand =
    cat<T> == mod_cat::value || cat<T> == mod_cat::index || cat<T> == mod_cat::number || cat<T> == mod_cat::boolean;

template <class IL>
constexpr auto names_or_empty() {
  if constexpr (IL::size == 0)
    return fixed_string("");
  else
    return names_fs<IL>();
}

/// The tag of an operand.
template <class T>
struct tag_of {
  using type = mod_tag<void, "", "", "", "", false>;
};
template <mod_kind K, class Tag>
struct tag_of<mod_value<K, Tag>> {
  using type = Tag;
};
template <bool C, auto X>
constexpr auto when() {
  if constexpr (C)
    return X;
  else
    return fixed_string("");
}
template <class C, mod_role R, class IL>
struct tag_of<mod_index<C, R, IL>> {
  static constexpr auto n = names_or_empty<IL>();
  using type =
      mod_tag<C, when<R == mod_role::batch, n>(), when<R == mod_role::head, n>(), when<R == mod_role::query, n>(),
              when<R == mod_role::key, n>(), R == mod_role::query && IL::size != 0>;
};
template <class T, std::size_t D, class C, bool Q>
struct tag_of<mod_partial<T, D, C, Q>> {
  using type = mod_tag<C, "", "", "", "", Q>;
};
template <class T>
using tag_t = typename tag_of<std::remove_cvref_t<T>>::type;

template <auto X, auto Y>
constexpr auto pick() {
  if constexpr (X.size() > 0)
    return X;
  else
    return Y;
}
template <class A, class B>
using ctx_union = std::conditional_t<std::is_void_v<typename A::ctx>, typename B::ctx, typename A::ctx>;
template <class A, class B>
using tag_union = mod_tag<ctx_union<A, B>, pick<A::b, B::b>(), pick<A::h, B::h>(), pick<A::q, B::q>(),
                          pick<A::k, B::k>(), A::qpos || B::qpos>;
/// A comparison's result: a bool, whose roles no longer matter (it cannot enter arithmetic).
template <class A>
using tag_bool = mod_tag<typename A::ctx, "", "", "", "", A::qpos>;

template <class Ctx>
constexpr auto op_of() {
  if constexpr (std::is_void_v<Ctx>)
    return fixed_string("mod");
  else
    return Ctx::op;
}

template <int R>
constexpr auto role_word() {
  if constexpr (R == 0)
    return fixed_string("the batch index b");
  else if constexpr (R == 1)
    return fixed_string("the head index h");
  else if constexpr (R == 2)
    return fixed_string("the query index q");
  else
    return fixed_string("the key index k");
}
template <class T, int R>
constexpr auto role_axes() {
  if constexpr (R == 0)
    return T::b;
  else if constexpr (R == 1)
    return T::h;
  else if constexpr (R == 2)
    return T::q;
  else
    return T::k;
}

/// The first pair (role of A, role of B) that may not mix, as 4 * ra + rb; -1 when all may.
template <class A, class B>
constexpr int bad_mix() {
  const bool ra[4] = {A::b.size() > 0, A::h.size() > 0, A::q.size() > 0, A::k.size() > 0};
  const bool rb[4] = {B::b.size() > 0, B::h.size() > 0, B::q.size() > 0, B::k.size() > 0};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      if (ra[i] && rb[j] && i != j && !((i == 2 && j == 3) || (i == 3 && j == 2))) return 4 * i + j;
  return -1;
}

template <fixed_string Sym, class A, class B>
constexpr auto mix_error() {
  constexpr int m = bad_mix<A, B>();
  constexpr int i = m / 4, j = m % 4;
  return fail<op_of<ctx_union<A, B>>() + ": `" + Sym + "` mixes " + role_word<i>() + " (`" + role_axes<A, i>() +
              "`) with " + role_word<j>() + " (`" + role_axes<B, j>() +
              "`); fix: only query and key positions mix (q - k); read per-head or per-batch values by "
              "loading them (slopes[h])">();
}

template <class P>
inline constexpr std::size_t mod_partial_done = 0;
template <class T, std::size_t D, class C, bool Q>
inline constexpr std::size_t mod_partial_done<mod_partial<T, D, C, Q>> = D;

/// A stray operand: a partially indexed tensor, a whole tensor, or something that is no expression.
template <fixed_string Op, class T>
constexpr auto operand_error() {
  using U = std::remove_cvref_t<T>;
  if constexpr (cat<T> == mod_cat::partial) {
    using L = typename U::tensor_type::axis_list;
    return fail<fixed_string("load: ") + axes_fs<L>() + " is indexed by " +
                number<static_cast<std::int64_t>(mod_partial_done<U>)>() + " of its " +
                number<static_cast<std::int64_t>(L::size)>() + " axes; fix: index every axis, one [] per axis">();
  } else if constexpr (cat<T> == mod_cat::tensor) {
    return fail<Op + ": the tensor " + axes_fs<typename U::axis_list>() +
                " is used whole inside a mod; fix: read one element, one index per axis (slopes[h])">();
  } else {
    return fail<Op +
                ": an operand is neither a number nor a bool; fix: use numbers, bools, index variables and "
                "indexed tensors">();
  }
}

// --- operands to nodes -----------------------------------------------------------------------

/// h (or b) as a number: the row-major flattened index over its axes (0 for none).
template <class IL>
int flat_index() {
  if constexpr (IL::size == 0) {
    return emit_constant(0.0);
  } else {
    int id = -1;
    hana::for_each(IL::types, [&](auto t) {
      using X = typename decltype(t)::type;
      const int i = emit_leaf(ModOp::index, std::string(X::name));
      id = id < 0 ? i : emit_op(ModOp::add, emit_op(ModOp::mul, id, emit_leaf(ModOp::length, std::string(X::name))), i);
    });
    return id;
  }
}

/// The node of an operand used as a value (the query index as its aligned position).
template <class T>
int value_id(const T& x) {
  if constexpr (cat<T> == mod_cat::value) {
    return x.id;
  } else if constexpr (cat<T> == mod_cat::index) {
    using IL = typename T::axis_list;
    if constexpr (T::role == mod_role::query && IL::size == 1)
      return emit_leaf(ModOp::position, std::string(axis_at<IL, 0>::name));
    else
      return flat_index<IL>();
  } else {
    return emit_constant(static_cast<double>(x));
  }
}

}  // namespace detail

template <class C, mod_role R, class IL>
auto mod_index<C, R, IL>::length() const {
  int id = -1;
  if constexpr (IL::size == 0) {
    id = detail::emit_constant(1.0);
  } else {
    hana::for_each(IL::types, [&](auto t) {
      const int l = detail::emit_leaf(ModOp::length, std::string(decltype(t)::type::name));
      id = id < 0 ? l : detail::emit_op(ModOp::mul, id, l);
    });
  }
  return mod_value<mod_kind::number, mod_tag<C, "", "", "", "", false>>{id};
}

namespace detail {

// --- arithmetic, comparisons, logic ------------------------------------------------------------

/// What a binary operator takes and gives: numbers to a number (arith), numbers to a bool
/// (compare), two of one kind to a bool (equality), bools to a bool (logic).
enum class mod_sig : std::uint8_t { arith, compare, equality, logic };

template <ModOp Op, fixed_string Sym, mod_sig Sig, class A, class B>
auto mod_binary(const A& a, const B& b) {
  using Ctx = ctx_union<tag_t<A>, tag_t<B>>;
  constexpr auto op = op_of<Ctx>();
  if constexpr (any_poison<A, B>) {
    return poison{};
  } else if constexpr (!is_expr_operand<A>) {
    return operand_error<op, A>();
  } else if constexpr (!is_expr_operand<B>) {
    return operand_error<op, B>();
  } else {
    constexpr bool ba = is_bool_operand<A>(), bb = is_bool_operand<B>();
    if constexpr (Sig == mod_sig::logic && (!ba || !bb)) {
      return fail<op + ": `" + Sym + "` takes bools, but its " + (ba ? fixed_string("right") : fixed_string("left ")) +
                  " operand is a number; fix: compare it (x < y) to get a bool">();
    } else if constexpr ((Sig == mod_sig::arith || Sig == mod_sig::compare) && (ba || bb)) {
      return fail<op + ": `" + Sym + "` takes numbers, but its " +
                  (ba ? fixed_string("left ") : fixed_string("right")) +
                  " operand is a bool; fix: where(cond, a, b) turns a bool into a number">();
    } else if constexpr (Sig == mod_sig::equality && ba != bb) {
      return fail<op + ": `" + Sym +
                  "` compares a number with a bool; fix: compare numbers with numbers, bools with "
                  "bools">();
    } else if constexpr (Sig != mod_sig::logic && bad_mix<tag_t<A>, tag_t<B>>() >= 0) {
      return mix_error<Sym, tag_t<A>, tag_t<B>>();
    } else {
      const int id = emit_op(Op, value_id(a), value_id(b));
      using U = tag_union<tag_t<A>, tag_t<B>>;
      if constexpr (Sig == mod_sig::arith)
        return mod_value<mod_kind::number, U>{id};
      else
        return mod_value<mod_kind::boolean, tag_bool<U>>{id};
    }
  }
}

template <ModOp Op, fixed_string Sym, bool Bool, class A>
auto mod_unary(const A& a) {
  constexpr auto op = op_of<typename tag_t<A>::ctx>();
  if constexpr (is_poison<A>) {
    return poison{};
  } else if constexpr (!is_expr_operand<A>) {
    return operand_error<op, A>();
  } else if constexpr (is_bool_operand<A>() != Bool) {
    if constexpr (Bool)
      return fail<op + ": `" + Sym + "` takes a bool, but its operand is a number; fix: compare it (x < y)">();
    else
      return fail<op + ": `" + Sym +
                  "` takes a number, but its operand is a bool; fix: where(cond, a, b) turns a bool into a number">();
  } else {
    return mod_value<Bool ? mod_kind::boolean : mod_kind::number, tag_t<A>>{emit_op(Op, value_id(a))};
  }
}

template <class A, class B>
concept ModOperands = (mod_trigger<A> || mod_trigger<B>) && !MaskMod<A> && !MaskMod<B>;
template <class A>
concept ModOperand = mod_trigger<A>;

}  // namespace detail

// The operators of traced expressions (found by argument-dependent lookup inside the lambdas).
#define QKV_MOD_BINARY(OPERATOR, OP, SIG)                                        \
  template <class A, class B>                                                    \
    requires detail::ModOperands<A, B>                                           \
  auto operator OPERATOR(const A& a, const B& b) {                               \
    return detail::mod_binary<ModOp::OP, #OPERATOR, detail::mod_sig::SIG>(a, b); \
  }
QKV_MOD_BINARY(+, add, arith)
QKV_MOD_BINARY(-, sub, arith)
QKV_MOD_BINARY(*, mul, arith)
QKV_MOD_BINARY(/, div, arith)
QKV_MOD_BINARY(<, lt, compare)
QKV_MOD_BINARY(<=, le, compare)
QKV_MOD_BINARY(>, gt, compare)
QKV_MOD_BINARY(>=, ge, compare)
QKV_MOD_BINARY(==, eq, equality)
QKV_MOD_BINARY(!=, ne, equality)
QKV_MOD_BINARY(&&, logical_and, logic)
QKV_MOD_BINARY(||, logical_or, logic)
#undef QKV_MOD_BINARY

template <class A, class B>
  requires detail::ModOperands<A, B>
auto min(const A& a, const B& b) {
  return detail::mod_binary<ModOp::min, "min", detail::mod_sig::arith>(a, b);
}
template <class A, class B>
  requires detail::ModOperands<A, B>
auto max(const A& a, const B& b) {
  return detail::mod_binary<ModOp::max, "max", detail::mod_sig::arith>(a, b);
}
template <detail::ModOperand A>
auto operator-(const A& a) {
  return detail::mod_unary<ModOp::neg, "-", false>(a);
}
template <detail::ModOperand A>
auto operator!(const A& a) {
  return detail::mod_unary<ModOp::logical_not, "!", true>(a);
}
template <detail::ModOperand A>
auto abs(const A& a) {
  return detail::mod_unary<ModOp::abs, "abs", false>(a);
}
template <detail::ModOperand A>
auto exp(const A& a) {
  return detail::mod_unary<ModOp::exp, "exp", false>(a);
}
template <detail::ModOperand A>
auto log(const A& a) {
  return detail::mod_unary<ModOp::log, "log", false>(a);
}
template <detail::ModOperand A>
auto tanh(const A& a) {
  return detail::mod_unary<ModOp::tanh, "tanh", false>(a);
}
template <detail::ModOperand A>
auto sqrt(const A& a) {
  return detail::mod_unary<ModOp::sqrt, "sqrt", false>(a);
}
template <detail::ModOperand A>
auto rsqrt(const A& a) {
  return detail::mod_unary<ModOp::rsqrt, "rsqrt", false>(a);
}
template <detail::ModOperand A>
auto sigmoid(const A& a) {
  return detail::mod_unary<ModOp::sigmoid, "sigmoid", false>(a);
}
template <detail::ModOperand A>
auto erf(const A& a) {
  return detail::mod_unary<ModOp::erf, "erf", false>(a);
}
template <class A, class B>
  requires detail::ModOperands<A, B>
auto pow(const A& a, const B& b) {
  return detail::mod_binary<ModOp::pow, "pow", detail::mod_sig::arith>(a, b);
}

/// where(c, a, b): a where c holds, else b (c a bool; a and b both numbers or both bools).
template <class C, class A, class B>
  requires(detail::mod_trigger<C> || detail::mod_trigger<A> || detail::mod_trigger<B>)
auto where(const C& c, const A& a, const B& b) {
  using namespace detail;
  constexpr auto op = op_of<ctx_union<tag_t<C>, tag_union<tag_t<A>, tag_t<B>>>>();
  if constexpr (any_poison<C, A, B>) {
    return poison{};
  } else if constexpr (!is_expr_operand<C>) {
    return operand_error<op, C>();
  } else if constexpr (!is_expr_operand<A>) {
    return operand_error<op, A>();
  } else if constexpr (!is_expr_operand<B>) {
    return operand_error<op, B>();
  } else if constexpr (!is_bool_operand<C>()) {
    return fail<op + ": where(c, a, b) needs a bool condition c, got a number; fix: compare it (x < y)">();
  } else if constexpr (is_bool_operand<A>() != is_bool_operand<B>()) {
    return fail<op + ": the arms of where(c, a, b) are a number and a bool; fix: both numbers or both bools">();
  } else if constexpr (bad_mix<tag_t<A>, tag_t<B>>() >= 0) {
    return mix_error<"where", tag_t<A>, tag_t<B>>();
  } else {
    using U = tag_union<tag_union<tag_t<A>, tag_t<B>>, tag_bool<tag_t<C>>>;
    const int id = emit_op(ModOp::where, value_id(c), value_id(a), value_id(b));
    return mod_value<is_bool_operand<A>() ? mod_kind::boolean : mod_kind::number, U>{id};
  }
}

// --- loads: t[i][j]... ------------------------------------------------------------------------

namespace detail {

/// The role (0 batch, 1 head, 2 query, 3 key) of the axis X of scores L.
template <class L, class X>
constexpr int score_role() {
  constexpr std::size_t p = index_of<L, X>, n = L::size;
  return p == n - 1 ? 3 : p == n - 2 ? 2 : (p == 0 && n >= 3) ? 0 : 1;
}

/// How many axes of L, from Done on, are axes of IL (the run an h of several head axes indexes).
template <class L, std::size_t Done, class IL>
constexpr std::size_t run_in() {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    constexpr bool in[] = {has_axis_named<IL, axis_at<L, Done + I>>..., false};
    std::size_t r = 0;
    while (in[r]) ++r;
    return r;
  }(std::make_index_sequence<L::size - Done>{});
}

template <class L, class X, class Scores, int R, fixed_string Names>
constexpr auto wrong_index() {
  return fail<fixed_string("load: `") + X::name_fs + "` of " + axes_fs<L>() +
              " is an axis of the scores, indexed here by " + role_word<R>() + " (`" + Names + "`); fix: index `" +
              X::name_fs + "` by " + role_word<score_role<Scores, X>()>()>();
}

template <class T, std::size_t Done, class Ctx, bool QPos>
auto mod_advance(const mod_partial<T, Done, Ctx, QPos>& p) {
  using L = typename T::axis_list;
  if constexpr (Done < L::size) {
    return p;
  } else {
    mod_trace& tr = trace();
    ModNode n;
    n.op = ModOp::load;
    n.input = tr.capture(*p.graph, p.node);
    n.at = p.at;
    // Indices that were plain numbers could not be checked by type when nothing else told the
    // scores apart: check by name that an axis of the scores takes its own index.
    const Node& t = p.graph->node(p.node);
    for (std::size_t k = 0; k < t.axes.size(); ++k) {
      if (!has_name(tr.score_axes, t.axes[k].name)) continue;
      const ModNode& x = tr.expr.nodes[static_cast<std::size_t>(n.at[k])];
      if (x.op != ModOp::index || x.axis != t.axes[k].name)
        throw std::invalid_argument("load: `" + t.axes[k].name + "` of " + axes_str(t.axes) +
                                    " is an axis of the scores; fix: index it by its own index variable");
    }
    constexpr mod_kind kind = std::is_same_v<typename T::dtype, boolean> ? mod_kind::boolean : mod_kind::number;
    return mod_value<kind, mod_tag<Ctx, "", "", "", "", QPos>>{tr.emit(std::move(n))};
  }
}

template <class T, std::size_t Done, class Ctx, bool QPos, class I>
auto mod_step(const mod_partial<T, Done, Ctx, QPos>& p, const I& i) {
  using L = typename T::axis_list;
  using Ctx2 = std::conditional_t<std::is_void_v<Ctx>, typename tag_t<I>::ctx, Ctx>;
  if constexpr (is_poison<I>) {
    return poison{};
  } else if constexpr (Done >= L::size) {
    return fail<fixed_string("load: ") + axes_fs<L>() + " has " + number<static_cast<std::int64_t>(L::size)>() +
                " axes and takes no more indices; fix: one [] per axis">();
  } else {
    using X = axis_at<L, Done>;
    constexpr bool known = !std::is_void_v<Ctx2>;
    constexpr bool score_axis = [] {
      if constexpr (known)
        return has_axis_named<typename Ctx2::scores, X>;
      else
        return false;
    }();
    auto next = [&]<std::size_t N, bool Q>(std::vector<int> ids) {
      auto at = p.at;
      at.insert(at.end(), ids.begin(), ids.end());
      return mod_advance(mod_partial < T, Done + N, Ctx2, QPos || Q > {p.graph, p.node, std::move(at)});
    };
    if constexpr (cat<I> == mod_cat::index) {
      using IL = typename I::axis_list;
      constexpr int r = static_cast<int>(I::role);
      if constexpr (IL::size == 0) {
        return fail<fixed_string("load: ") + role_word<r>() + " indexes no axis of the scores " +
                    axes_fs<typename Ctx2::scores>() + " (they have no " +
                    (r == 0 ? fixed_string("batch") : fixed_string("head ")) +
                    " axis); fix: index by an axis the scores have">();
      } else if constexpr (constexpr std::size_t n = run_in<L, Done, IL>(); n > 0) {
        std::vector<int> ids;
        [&]<std::size_t... J>(std::index_sequence<J...>) {
          (ids.push_back(emit_leaf(ModOp::index, std::string(axis_at<L, Done + J>::name))), ...);
        }(std::make_index_sequence<n>{});
        return next.template operator()<n, false>(std::move(ids));
      } else if constexpr (score_axis) {
        return wrong_index<L, X, typename Ctx2::scores, r, names_fs<IL>()>();
      } else {
        // An axis the scores lack, indexed by the coordinate itself (raw, never aligned).
        return next.template operator()<1, false>({flat_index<IL>()});
      }
    } else if constexpr (cat<I> == mod_cat::boolean || (cat<I> == mod_cat::value && is_bool_operand<I>())) {
      return fail<fixed_string("load: a bool indexes `") + X::name_fs + "` of " + axes_fs<L>() +
                  "; fix: index by a number (where(cond, 1, 0) turns a bool into one)">();
    } else if constexpr (cat<I> == mod_cat::value || cat<I> == mod_cat::number) {
      if constexpr (score_axis) {
        return fail<fixed_string("load: `") + X::name_fs + "` of " + axes_fs<L>() +
                    " is an axis of the scores, indexed here by an expression; fix: index `" + X::name_fs + "` by " +
                    role_word<score_role<typename Ctx2::scores, X>()>() +
                    " itself (expressions index axes the scores do not have)">();
      } else {
        return next.template operator()<1, tag_t<I>::qpos>({value_id(i)});
      }
    } else {
      return operand_error<op_of<Ctx2>(), I>();
    }
  }
}

template <class T, class I>
auto mod_subscript(const T& t, const I& i) {
  return mod_step(mod_partial<T, 0, void, false>{&t.graph(), t.id(), {}}, i);
}

}  // namespace detail

template <class T, std::size_t Done, class Ctx, bool QPos>
template <class I>
auto mod_partial<T, Done, Ctx, QPos>::operator[](const I& i) const {
  return detail::mod_step(*this, i);
}

}  // namespace qkv
