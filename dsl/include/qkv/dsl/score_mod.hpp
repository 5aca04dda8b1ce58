// qkv/dsl/score_mod.hpp — programmable attention: typed score and mask modifications.
//
//   auto alibi  = score_mod([&](auto s, auto b, auto h, auto q, auto k) { return s - slopes[h] * abs(q - k); });
//   auto window = mask_mod([](auto, auto, auto q, auto k) { return abs(q - k) <= 256; });
//   auto docs   = mask_mod([&](auto b, auto, auto q, auto k) { return q_doc[b][q] == kv_doc[b][k]; });
//   auto p = softmax<Key>(modded(scaled(contract<HeadDim>(q_, k_)), alibi, window && docs));
//
// score_mod / mask_mod only store the function. modded(scores, mods...) traces each one once,
// with index variables typed by the axes of the scores, into one ModExpr (qkv/ir/mod_expr.hpp)
// held by one `score_mod` node: the scores' axes, dtype and meaning, so softmax<Key> still checks.
//
// Roles of the score axes, by position (as contract lays Q*K^T out): the key is the last axis, the
// query the one before, the batch the first when there are three or more, and the heads are the
// axes in between ([Batch, Heads, Seq, Key]; under GQA [Batch, KvHeads, Group, Seq, Key], where h
// spans KvHeads and Group). With fewer axes b and h index no axis: they are 0 and cannot load.
//
// The type rules (each a compile error naming both axes):
//   * an axis of a loaded tensor that is an axis of the scores takes that axis's own index
//     variable (slopes[h], kv_doc[b][k]); any other axis takes any number (rounded toward zero
//     and clamped into range, as the IR loads do);
//   * in arithmetic and comparisons, indices of one role mix with each other and with numbers,
//     and query indices with key indices (q - k, k <= q: positions, the query aligned as the mod
//     says); any other mix (q - h, b + k) is a mistake;
//   * numbers and bools do not mix: a score_mod returns a number, a mask_mod a bool; && || ! take
//     bools; where(c, a, b) takes a bool c and arms of one kind.
// Order: the built-in softcap first, then the other score mods as written, then every mask and-ed.
#pragma once

#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include <qkv/dsl/mod_values.hpp>

namespace qkv {

// --- modded(scores, mods...) -------------------------------------------------------------------

namespace detail {

template <class L, std::size_t From, std::size_t... I>
axes<axis_at<L, From + I>...> sublist(std::index_sequence<I...>);

template <class L>
auto head_axes() {
  if constexpr (L::size >= 3)
    return decltype(sublist<L, 1>(std::make_index_sequence<L::size - 3>{})){};
  else
    return axes<>{};
}
template <class L>
auto batch_axes() {
  if constexpr (L::size >= 3)
    return axes<axis_at<L, 0>>{};
  else
    return axes<>{};
}

/// The variables a mod of kind Op is traced with, over scores L.
template <fixed_string Op, class L>
struct mod_vars {
  using ctx = mod_ctx<Op, L>;
  using s = mod_value<mod_kind::number, mod_tag<ctx, "", "", "", "", false>>;
  using b = mod_index<ctx, mod_role::batch, decltype(batch_axes<L>())>;
  using h = mod_index<ctx, mod_role::head, decltype(head_axes<L>())>;
  using q = mod_index<ctx, mod_role::query, axes<axis_at<L, L::size - 2>>>;
  using k = mod_index<ctx, mod_role::key, axes<axis_at<L, L::size - 1>>>;
};

/// What a mod's function returns must be a number (score_mod) or a bool (mask_mod): int when it
/// is, poison after the diagnostic otherwise.
template <fixed_string Op, bool WantBool, class R>
constexpr auto check_result() {
  if constexpr (is_poison<R>) {
    return poison{};
  } else if constexpr (!is_expr_operand<R>) {
    return operand_error<Op, R>();
  } else if constexpr (WantBool && !is_bool_operand<R>()) {
    return fail<Op +
                ": the function returns a number, not a bool; fix: compare it (abs(q - k) <= 256) to keep "
                "entries, or use score_mod to change the score">();
  } else if constexpr (!WantBool && is_bool_operand<R>()) {
    return fail<Op +
                ": the function returns a bool, not a number; fix: use mask_mod for a keep predicate, or "
                "where(cond, s, value) to change the score">();
  } else {
    return 0;
  }
}

template <class V, class F>
using score_result = decltype(std::declval<const F&>()(std::declval<typename V::s>(), typename V::b{}, typename V::h{},
                                                       typename V::q{}, typename V::k{}));
template <class V, class F>
using mask_result =
    decltype(std::declval<const F&>()(typename V::b{}, typename V::h{}, typename V::q{}, typename V::k{}));

template <class SV, class MV, class M>
constexpr auto check_mod();

template <class SV, class MV, class F, class A, bool C>
constexpr auto check_one(std::type_identity<score_mod_t<F, A, C>>) {
  return check_result<"score_mod", false, score_result<SV, F>>();
}
template <class SV, class MV, class F, class A>
constexpr auto check_one(std::type_identity<mask_mod_t<F, A>>) {
  return check_result<"mask_mod", true, mask_result<MV, F>>();
}
template <class SV, class MV, class A, class B>
constexpr auto check_both() {
  if constexpr (is_poison<decltype(check_mod<SV, MV, A>())>)
    return poison{};
  else
    return check_mod<SV, MV, B>();
}
template <class SV, class MV, class A, class B>
constexpr auto check_one(std::type_identity<mask_and_t<A, B>>) {
  return check_both<SV, MV, A, B>();
}
template <class SV, class MV, class A, class B>
constexpr auto check_one(std::type_identity<mask_or_t<A, B>>) {
  return check_both<SV, MV, A, B>();
}
template <class SV, class MV, class A>
constexpr auto check_one(std::type_identity<mask_not_t<A>>) {
  return check_mod<SV, MV, A>();
}
template <class SV, class MV, class M>
constexpr auto check_mod() {
  return check_one<SV, MV>(std::type_identity<M>{});
}

template <class SV, class MV, class M, class... Rest>
constexpr auto check_mods() {
  if constexpr (is_poison<decltype(check_mod<SV, MV, M>())>)
    return poison{};
  else if constexpr (sizeof...(Rest) == 0)
    return 0;
  else
    return check_mods<SV, MV, Rest...>();
}

/// The alignments the mods state, and whether an unaligned one reads query positions.
struct align_summary {
  bool top_left = false, bottom_right = false, unaligned_position = false;
  constexpr align_summary operator|(align_summary o) const {
    return {top_left || o.top_left, bottom_right || o.bottom_right, unaligned_position || o.unaligned_position};
  }
};
template <class Align, bool QPos>
constexpr align_summary leaf_summary() {
  if constexpr (std::is_same_v<Align, top_left_t>)
    return {true, false, false};
  else if constexpr (std::is_same_v<Align, bottom_right_t>)
    return {false, true, false};
  else
    return {false, false, QPos};
}
template <class SV, class MV, class M>
constexpr align_summary summary() {
  if constexpr (is_score_mod<M>) {
    return []<class F, class A, bool C>(std::type_identity<score_mod_t<F, A, C>>) {
      return leaf_summary<A, tag_t<score_result<SV, F>>::qpos>();
    }(std::type_identity<M>{});
  } else {
    return []<class X>(std::type_identity<X>) {
      if constexpr (requires { X::f; }) {
        return []<class F, class A>(std::type_identity<mask_mod_t<F, A>>) {
          return leaf_summary<A, tag_t<mask_result<MV, F>>::qpos>();
        }(std::type_identity<X>{});
      } else if constexpr (requires { X::b; }) {
        return summary<SV, MV, decltype(X::a)>() | summary<SV, MV, decltype(X::b)>();
      } else {
        return summary<SV, MV, decltype(X::a)>();
      }
    }(std::type_identity<M>{});
  }
}

template <class MV, class M>
int trace_mask(const M& m) {
  if constexpr (requires { m.f; }) {
    return value_id(m.f(typename MV::b{}, typename MV::h{}, typename MV::q{}, typename MV::k{}));
  } else if constexpr (requires { m.b; }) {
    const int a = trace_mask<MV>(m.a);
    const int b = trace_mask<MV>(m.b);
    constexpr bool is_and = std::is_same_v<M, mask_and_t<decltype(m.a), decltype(m.b)>>;
    return emit_op(is_and ? ModOp::logical_and : ModOp::logical_or, a, b);
  } else {
    return emit_op(ModOp::logical_not, trace_mask<MV>(m.a));
  }
}

template <class M>
inline constexpr bool is_softcap = false;
template <class F, class A>
inline constexpr bool is_softcap<score_mod_t<F, A, true>> = true;

/// The position of the first argument that is no mod (the count when all are).
template <class M, class... Rest>
constexpr int first_non_mod_of() {
  if constexpr (!is_score_mod<M> && !is_mask_mod<M>)
    return 0;
  else if constexpr (sizeof...(Rest) == 0)
    return 1;
  else
    return 1 + first_non_mod_of<Rest...>();
}

struct trace_guard {
  mod_trace* saved;
  explicit trace_guard(mod_trace& t) : saved(current_trace()) { current_trace() = &t; }
  ~trace_guard() { current_trace() = saved; }
  trace_guard(const trace_guard&) = delete;
  trace_guard& operator=(const trace_guard&) = delete;
};

}  // namespace detail

/// modded(scores, mods...): the scores with every score_mod applied (the built-in softcap first,
/// then the others as written) and every entry no mask_mod keeps set to −inf — one `score_mod`
/// node with the scores' axes and meaning.
template <class S, class... M>
auto modded(const S& scores, const M&... mods) {
  using namespace detail;
  if constexpr (any_poison<S, M...>) {
    return poison{};
  } else if constexpr (!TensorType<S>) {
    return fail<fixed_string("modded: the scores ") + operand_fs<S>() +
                " are not a tensor; fix: modded(scaled(contract<HeadDim>(q, k)), mods...)">();
  } else if constexpr (S::rank < 2) {
    return fail<fixed_string("modded: the scores ") + axes_fs<typename S::axis_list>() +
                " need a query axis and a key axis; fix: modded(scaled(contract<HeadDim>(q, k)), mods...)">();
  } else if constexpr (sizeof...(M) == 0) {
    return scores;
  } else if constexpr (constexpr int bad = first_non_mod_of<M...>(); bad < static_cast<int>(sizeof...(M))) {
    return fail<fixed_string("modded: argument ") + number<bad + 2>() +
                " is not a score_mod or mask_mod; fix: wrap the function: score_mod(f) or mask_mod(f)">();
  } else {
    using L = typename S::axis_list;
    using SV = mod_vars<"score_mod", L>;
    using MV = mod_vars<"mask_mod", L>;
    if constexpr (is_poison<decltype(check_mods<SV, MV, M...>())>) {
      return poison{};
    } else {
      constexpr align_summary sum = (align_summary{} | ... | summary<SV, MV, M>());
      using XQ = axis_at<L, L::size - 2>;
      using XK = axis_at<L, L::size - 1>;
      auto text = [](auto a, auto b) {
        return fixed_string("modded: `") + XQ::name_fs + "` (" + a + ") != `" + XK::name_fs + "` (" + b +
               "), so the alignment of a mod that reads query positions matters; fix: score_mod(f, top_left) / "
               "mask_mod(f, top_left) as in PyTorch is_causal, or bottom_right as in FlashAttention";
      };
      if constexpr (sum.top_left && sum.bottom_right) {
        return fail<fixed_string("modded: on the scores ") + axes_fs<L>() +
                    " one mod is aligned top_left and another bottom_right; fix: give every mod of one attention the "
                    "same alignment">();
      } else if constexpr (sum.unaligned_position && XQ::is_static && XK::is_static && XQ::extent != XK::extent) {
        return fail<text(number<XQ::extent>(), number<XK::extent>())>();
      } else {
        Graph& g = scores.graph();
        if constexpr (sum.unaligned_position)
          defer_equal(g, ir_axis(scores.node(), XQ::name).extent, ir_axis(scores.node(), XK::name).extent, text);
        mod_trace tr;
        tr.graph = &g;
        for (const auto& a : scores.node().axes) tr.score_axes.push_back(a.name);
        int score = -1;
        bool any_score = false;
        {
          trace_guard guard(tr);
          auto apply = [&]<class X>(const X& m, bool softcaps) {
            if constexpr (is_score_mod<X>) {
              if (is_softcap<X> != softcaps) return;
              if (score < 0) score = emit_leaf(ModOp::score, "");
              score = value_id(
                  m.f(typename SV::s{score}, typename SV::b{}, typename SV::h{}, typename SV::q{}, typename SV::k{}));
              any_score = true;
            }
          };
          (apply(mods, true), ...);
          (apply(mods, false), ...);
          int keep = -1;
          auto mask = [&]<class X>(const X& m) {
            if constexpr (is_mask_mod<X>) {
              const int id = trace_mask<MV>(m);
              keep = keep < 0 ? id : emit_op(ModOp::logical_and, keep, id);
            }
          };
          (mask(mods), ...);
          tr.expr.keep = keep;
        }
        tr.expr.score = any_score ? score : -1;
        tr.expr.query = std::string(XQ::name);
        tr.expr.key = std::string(XK::name);
        tr.expr.align = sum.bottom_right ? CausalAlign::bottom_right : CausalAlign::top_left;
        Node n = unary_node(scores, Op::score_mod, scores.node().axes);
        for (int id : tr.captured) n.inputs.push_back(id);
        n.mod = std::move(tr.expr);
        using Claim = trait::key_claim<trait::claimant::mod, XK::name_fs, XQ::name_fs>;
        return tensor<typename S::dtype, L, with_claim_t<typename S::trait_type, Claim>>(g, g.add(std::move(n)));
      }
    }
  }
}

// --- built-in mods (runtime arguments) --------------------------------------------------------

namespace detail {
/// Whether the first axis of the tensor T is the axis the index I stands for (slopes [Batch, ...]).
template <class T, class I>
constexpr bool leads_with() {
  using IL = typename I::axis_list;
  if constexpr (IL::size == 0 || T::rank == 0)
    return false;
  else
    return same_name<axis_at<typename T::axis_list, 0>, axis_at<IL, 0>>;
}
}  // namespace detail

namespace mods {

/// Keeps key j for query i when j <= i' (i' the aligned query position).
template <class Align = unaligned_t>
auto causal(Align align = {}) {
  return mask_mod([](auto, auto, auto q, auto k) { return k <= q; }, align);
}

/// Keeps keys j with i' - left <= j <= i' + right; -1 leaves that side unbounded.
template <class Align = unaligned_t>
auto sliding_window(std::int64_t left, std::int64_t right, Align align = {}) {
  return mask_mod(
      [left, right](auto, auto, auto q, auto k) {
        return (left < 0 || k >= q - static_cast<double>(left)) && (right < 0 || k <= q + static_cast<double>(right));
      },
      align);
}

/// ALiBi: score - slope * |i' - j|, slopes [Heads...] or [Batch, Heads...] (f32).
template <class T, class Align = unaligned_t>
auto alibi(const T& slopes, Align align = {}) {
  return score_mod(
      [slopes](auto s, auto b, auto h, auto q, auto k) {
        if constexpr (detail::leads_with<T, decltype(b)>())
          return s - slopes[b][h] * abs(q - k);
        else
          return s - slopes[h] * abs(q - k);
      },
      align);
}

/// c * tanh(s / c), applied before every other score mod.
inline auto softcap(double c) {
  auto f = [c](auto s, auto, auto, auto, auto) { return c * tanh(s / c); };
  return score_mod_t<decltype(f), unaligned_t, true>{f};
}

/// Keeps entries whose query and key carry the same id: q_ids [Batch, Query], kv_ids [Batch, Key].
template <class Q, class K>
auto document_mask(const Q& q_ids, const K& kv_ids) {
  return mask_mod([q_ids, kv_ids](auto b, auto, auto q, auto k) {
    if constexpr (Q::rank == 2)
      return q_ids[b][q] == kv_ids[b][k];
    else
      return q_ids[q] == kv_ids[k];
  });
}

/// Keeps keys j >= first[b], first [Batch] (i32 / i64): a batch of sequences of different lengths
/// left-padded to one, first[b] the position of row b's first key (the padding before it unseen).
template <class F>
auto keys_from(const F& first) {
  return mask_mod([first](auto b, auto, auto, auto k) { return k >= first[b]; });
}

/// Prefix-LM: keeps j < prefix_len (bidirectional prefix) or j <= i'; prefix_len an int or a
/// per-batch int tensor [Batch].
template <class P, class Align = unaligned_t>
auto prefix_lm(const P& prefix_len, Align align = {}) {
  return mask_mod(
      [prefix_len](auto b, auto, auto q, auto k) {
        if constexpr (TensorType<P>)
          return k < prefix_len[b] || k <= q;
        else
          return k < static_cast<double>(prefix_len) || k <= q;
      },
      align);
}

/// A learned relative-position bias: score + table[h][j - i' + S - 1], table [Heads..., RelPos]
/// with RelPos = 2 S - 1 (S the key length; indices outside are clamped).
template <class T, class Align = unaligned_t>
auto relative_bias(const T& table, Align align = {}) {
  return score_mod([table](auto s, auto, auto h, auto q, auto k) { return s + table[h][k - q + k.length() - 1]; },
                   align);
}

}  // namespace mods

}  // namespace qkv
