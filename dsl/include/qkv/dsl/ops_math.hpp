// qkv/dsl/ops_math.hpp — ops that compute: contract (einsum over named axes), linear, add/mul
// with by-name broadcasting, scaling, softmax, masks and biases, causal masks, dropout, layer
// norm, relu/gelu.
//
// Catalogue entries checked here: 2 (padding mask on the query axis), 3 (softmax over one axis,
// weighted sum over another), 4/10 (contraction sizes), 8 (projection/residual widths),
// 12 (causal alignment on L != S), 13 (softmax over unscaled scores); and a bool mask passed as
// an additive bias, causal<Key, Seq> with the axes swapped, K or V whose sequence axis was not
// renamed. Which axis is the key axis is decided by name, by softmax<Key> (see traits.hpp).
#pragma once

#include <cmath>
#include <optional>

#include <qkv/dsl/ops_structure.hpp>

namespace qkv {

namespace detail {

/// The name of L's only axis ("" unless L has exactly one).
template <class L>
constexpr auto single_name() {
  if constexpr (L::size == 1)
    return axis_at<L, 0>::name_fs;
  else
    return fixed_string("");
}

/// "[Batch=2, Key=4]" for a tensor operand; "(not a tensor)" for anything else.
template <class T>
constexpr auto operand_fs() {
  if constexpr (TensorType<T>)
    return axes_fs<typename T::axis_list>();
  else
    return fixed_string("(not a tensor)");
}

/// The first axis of L2 that L1 lacks (L2::size if none).
template <class L1, class L2>
constexpr std::size_t first_missing() {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    constexpr bool missing[] = {!has_axis_named<L1, axis_at<L2, I>>..., true};
    std::size_t i = 0;
    while (!missing[i]) ++i;
    return i;
  }(std::make_index_sequence<L2::size>{});
}

/// "`HeadDim` of lhs (64) must equal `HeadDim` of rhs (128); fix: ..."
template <fixed_string Op, class X>
constexpr auto equal_text(auto a, auto b, auto fix) {
  return Op + ": `" + X::name_fs + "` of lhs (" + a + ") must equal `" + X::name_fs + "` of rhs (" + b +
         "); fix: " + fix;
}

/// The message of the deferred check that axis X has one size in both operands of Op.
template <fixed_string Op, class X, class FixFor>
struct shared_text {
  constexpr auto operator()(auto sa, auto sb) const { return equal_text<Op, X>(sa, sb, FixFor{}(hana::type_c<X>)); }
};
template <fixed_string Op, class L, class FixFor>
struct shared_checks;
template <fixed_string Op, class... X, class FixFor>
struct shared_checks<Op, axes<X...>, FixFor> {
  static constexpr std::array<std::string_view, sizeof...(X)> names{X::name...};
  static constexpr std::array<std::string_view, sizeof...(X)> messages{
      deferred_text<shared_text<Op, X, FixFor>>.view()...};
};

/// defer_shared's run-time half: for each axis names[i] of `a` that `b` has too, the check
/// messages[i] that their extents agree.
[[gnu::noinline]] inline void require_shared(Graph& g, const Node& a, const Node& b, const std::string_view* names,
                                             const std::string_view* messages, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    for (const auto& y : b.axes)
      if (y.name == names[i]) require_equal(g, ir_axis(a, names[i]).extent, y.extent, messages[i]);
}

/// Defers the check of every shared axis whose extents involve a dynamic size; `fix_for(t)`
/// (a captureless lambda) gives the fix for the axis of hana type `t`.
template <fixed_string Op, class L1, class FixFor>
void defer_shared(Graph& g, const Node& a, const Node& b, FixFor /*fix_for*/) {
  using checks = shared_checks<Op, L1, FixFor>;
  require_shared(g, a, b, checks::names.data(), checks::messages.data(), checks::names.size());
}

inline bool has_name(const std::vector<std::string>& names, std::string_view n) {
  for (const auto& x : names)
    if (x == n) return true;
  return false;
}
inline bool has_name_in(const std::vector<Axis>& axes, std::string_view n) {
  for (const auto& x : axes)
    if (x.name == n) return true;
  return false;
}

/// True when Tr marks softmax weights normalised over an axis that is not contracted in CA.
template <class Tr, class CA>
inline constexpr bool normalised_elsewhere = false;
template <fixed_string Over, fixed_string Keys, class CA>
inline constexpr bool normalised_elsewhere<trait::weights<Over, Keys>, CA> = !has_axis_named<CA, axis<Over, dyn>>;

/// The fix for two sizes of one axis in contract(): contracted axes pair up d_k or the keys with
/// the values; axes both operands keep are batch axes.
template <class X, class CA>
constexpr auto contract_fix() {
  if constexpr (has_axis_named<CA, X>)
    return fixed_string(
        "contracted axes must have one size (Q*K^T: the same d_k; P*V: keys and values from one sequence)");
  else
    return fixed_string("`") + X::name_fs +
           "` is kept by both operands, so it is a batch axis and must have one size (the same batch, the same heads)";
}

/// Weights W (softmax over `Over`) contracted over CA with Other: the weighted sum must run over
/// the axis the weights are normalised over. When softmax was over the keys' axis and Other (the
/// values) lacks it, the values' sequence axis was not renamed; otherwise softmax took the
/// wrong axis.
template <class W, class CA, class Other>
constexpr auto misweighted() {
  using C = axis_at<CA, 0>;
  constexpr auto head =
      fixed_string("contract: weights are normalised over `") + W::over + "` but contracted over `" + C::name_fs + "`";
  if constexpr (W::keys == W::over && !has_axis_named<Other, axis<W::over, dyn>>)
    return fail<head + ", and the values " + axes_fs<Other>() + " have no axis `" + W::over +
                "`; fix: rename the sequence axis of the values: rename<" + C::name_fs + ", " + W::over +
                ">(v), then contract<" + W::over + ">(p, v)">();
  else
    return fail<head + "; fix: softmax<" + C::name_fs + ">(scores)">();
}

/// For ops that need scores: a contraction whose operands share every axis but the contracted
/// one has no key axis, because K's sequence axis was not renamed.
template <fixed_string Op, class L, class Tr, fixed_string KeyName>
constexpr auto unpaired_error() {
  using Dk = typename Tr::contracted;
  if constexpr (L::size == 0) {
    return fail<Op + ": the contraction over `" + Dk::name_fs +
                "` left no axis, so there are no scores; fix: contract Q and K that each have a sequence axis">();
  } else {
    using S = axis_at<L, L::size - 1>;
    return fail<Op + ": both operands of the contraction over `" + Dk::name_fs + "` have the axis `" + S::name_fs +
                "`, so the scores " + axes_fs<L>() + " have no key axis; fix: the keys need their own axis: rename<" +
                S::name_fs + ", " + KeyName + ">(k)">();
  }
}

/// "`Seq` (4)": an axis of L named N, with its extent.
template <class L, fixed_string N>
constexpr auto named_extent_fs() {
  if constexpr (has_axis_named<L, axis<N, dyn>>)
    return fixed_string("`") + N + "` (" + extent_fs<find_named<L, axis<N, dyn>>>() + ")";
  else
    return fixed_string("`") + N + "`";
}

/// What masked(scores, m) says about the key axis of the scores (void: nothing).
template <class M>
struct mask_claim {
  using type = void;
};
template <class DT, class B, class K>
struct mask_claim<tensor<DT, axes<B, K>, trait::mask<MaskKind::key_padding>>> {
  using type = trait::key_claim<trait::claimant::key_padding_mask, K::name_fs, fixed_string("")>;
};
template <class DT, class Q, class K>
struct mask_claim<tensor<DT, axes<Q, K>, trait::mask<MaskKind::attention>>> {
  using type = trait::key_claim<trait::claimant::attention_mask, K::name_fs, Q::name_fs>;
};
template <class Tr, class Claim>
using claimed_t = std::conditional_t<std::is_void_v<Claim>, Tr, with_claim_t<Tr, Claim>>;

/// softmax<Over> over scores L whose masks claimed another key axis: the claim's own message.
template <class Claim, class L, fixed_string Over>
constexpr auto claim_error() {
  if constexpr (Claim::by == trait::claimant::key_padding_mask) {
    return fail<fixed_string("masked: the key-padding mask covers ") + named_extent_fs<L, Claim::key>() +
                ", not the key axis `" + Over + "` of the scores " + axes_fs<L>() +
                "; fix: build the mask over the keys, e.g. rename<" + Claim::key + ", " + Over + ">(mask)">();
  } else if constexpr (Claim::by == trait::claimant::attention_mask) {
    return fail<fixed_string("masked: the attention mask [") + Claim::query + ", " + Claim::key +
                "] has the key axis `" + Claim::key + "` (its second), but softmax normalises the scores " +
                axes_fs<L>() + " over `" + Over +
                "`; fix: an attention mask is [query axis, key axis]: build it as AttnMask<" + Claim::key + ", " +
                Over + ">, or softmax<" + Claim::key + "> if that is the key axis">();
  } else if constexpr (Claim::by == trait::claimant::mod) {
    return fail<fixed_string("modded: the mods take `") + Claim::key +
                "` (the last axis) as the key axis, but softmax normalises the scores " + axes_fs<L>() + " over `" +
                Over + "`; fix: lay the scores out [..., query, key] (contract<HeadDim>(q, k)) before modded()">();
  } else {
    // causal<Key, Seq> for causal<Seq, Key>: the axes are swapped; else the query axis stands.
    constexpr auto query = [] {
      if constexpr (Claim::query == Over)
        return Claim::key;
      else
        return Claim::query;
    }();
    return fail<fixed_string("causal: causal<") + Claim::query + ", " + Claim::key + "> takes `" + Claim::key +
                "` as the key axis, but softmax normalises the scores " + axes_fs<L>() + " over `" + Over +
                "`; fix: the query axis first, then the key axis: causal<" + query + ", " + Over + ">(scores)">();
  }
}

/// The first claim in the list whose key axis is not Over (void if all agree).
template <fixed_string Over, class List>
struct first_wrong_claim;
template <fixed_string Over>
struct first_wrong_claim<Over, claim_list<>> {
  using type = void;
};
template <fixed_string Over, class C, class... Rest>
struct first_wrong_claim<Over, claim_list<C, Rest...>> {
  using type = std::conditional_t<C::key == Over, typename first_wrong_claim<Over, claim_list<Rest...>>::type, C>;
};

template <class DT, class L, class Tr>
auto make(Graph& g, Node n) {
  n.dtype = DT::value;
  return tensor<DT, L, Tr>(g, g.add(std::move(n)));
}

}  // namespace detail

/// contract<HeadDim>(q, k): multiply and sum over the named axes; axes both operands have
/// (Batch, Heads) are batch dimensions and must agree. The result has lhs's remaining axes,
/// then rhs's new ones: Q·Kᵀ gives [Batch, Heads, Seq, Key]; P·V gives [Batch, Heads, Seq, HeadDim].
///
/// Q·Kᵀ comes out as *raw scores*: softmax will refuse them until they are scaled. When an
/// operand is softmax weights, it must be contracted over the axis it was normalised over.
template <template <auto> class C0, template <auto> class... Cs, class A, class B>
auto contract(const A& a, const B& b) {
  if constexpr (any_poison<A, B>) {
    return poison{};
  } else {
    using LA = typename A::axis_list;
    using LB = typename B::axis_list;
    using CA = axes<C0<dyn>, Cs<dyn>...>;
    if constexpr (constexpr auto i = detail::first_missing<LA, CA>(); i != CA::size) {
      return fail<fixed_string("contract: lhs ") + axes_fs<LA>() + " has no axis `" + axis_at<CA, i>::name_fs +
                  "` to contract over; fix: contract over an axis both operands have">();
    } else if constexpr (constexpr auto j = detail::first_missing<LB, CA>(); j != CA::size) {
      return fail<fixed_string("contract: rhs ") + axes_fs<LB>() + " has no axis `" + axis_at<CA, j>::name_fs +
                  "` to contract over; fix: rename the matching axis of rhs to `" + axis_at<CA, j>::name_fs + "`">();
    } else if constexpr (detail::normalised_elsewhere<typename A::trait_type, CA>) {
      return detail::misweighted<typename A::trait_type, CA, LB>();
    } else if constexpr (detail::normalised_elsewhere<typename B::trait_type, CA>) {
      return detail::misweighted<typename B::trait_type, CA, LA>();
    } else if constexpr (constexpr auto k = detail::first_shared_mismatch<LA, LB>(); k != LA::size) {
      using X = axis_at<LA, k>;
      return fail<detail::equal_text<"contract", X>(number<X::extent>(), number<find_named<LB, X>::extent>(),
                                                    detail::contract_fix<X, CA>())>();
    } else {
      using Out = concat_axes<without<LA, CA>, without<without<LB, CA>, LA>>;
      using OwnA = without<LA, LB>;  // axes only lhs has (Q's sequence axis in Q*K^T)
      using OwnB = without<LB, LA>;  // axes only rhs has (K's)
      constexpr bool plain_operands =
          std::is_same_v<typename A::trait_type, trait::plain> && std::is_same_v<typename B::trait_type, trait::plain>;
      constexpr bool scores = plain_operands && (OwnA::size > 0 && OwnB::size > 0);
      constexpr bool unpaired = plain_operands && (OwnA::size == 0 && OwnB::size == 0);
      using Dk = find_family<LA, C0>;
      using Tr = std::conditional_t<scores, trait::raw_scores<Dk, detail::single_name<OwnB>()>,
                                    std::conditional_t<unpaired, trait::unpaired<Dk, Out>, trait::plain>>;
      Graph& g = a.graph();
      detail::defer_shared<"contract", LA>(
          g, a.node(), b.node(), [](auto t) { return detail::contract_fix<typename decltype(t)::type, CA>(); });
      return tensor<typename A::dtype, Out, Tr>(
          g, detail::add_contract(g, a.id(), b.id(), A::dtype::value, {family_name<C0>, family_name<Cs>...}));
    }
  }
}

namespace detail {
/// Whether rhs B may be read entry by entry beside lhs A (every axis of B an axis of A, shared
/// axes of one size): "" or the compile-time message, with MissingFix for an axis A lacks and
/// SizeFix for sizes that differ. The one by-name broadcast check of add, mul, masked, biased and
/// the pointwise ops.
template <fixed_string OpName, class A, class B, fixed_string MissingFix, fixed_string SizeFix>
constexpr auto broadcast_problem() {
  using LA = typename A::axis_list;
  using LB = typename B::axis_list;
  if constexpr (constexpr auto i = first_missing<LA, LB>(); i != LB::size) {
    return OpName + ": `" + axis_at<LB, i>::name_fs + "` of rhs " + axes_fs<LB>() + " is not an axis of lhs " +
           axes_fs<LA>() + "; fix: " + MissingFix;
  } else if constexpr (constexpr auto k = first_shared_mismatch<LA, LB>(); k != LA::size) {
    using X = axis_at<LA, k>;
    return equal_text<OpName, X>(number<X::extent>(), number<find_named<LB, X>::extent>(), SizeFix);
  } else {
    return fixed_string("");
  }
}

/// Elementwise with by-name broadcasting: every axis of rhs must be an axis of lhs (of the same
/// size); the result has lhs's axes and the meaning OutTrait. Used by add, mul, masked and biased.
template <fixed_string OpName, fixed_string Fix, Op IrOp, class OutTrait, class A, class B>
auto broadcast_binary(const A& a, const B& b) {
  using LA = typename A::axis_list;
  if constexpr (constexpr auto why = broadcast_problem<OpName, A, B, Fix, Fix>(); why.size() > 0) {
    return fail<why>();
  } else {
    Graph& g = a.graph();
    defer_shared<OpName, LA>(g, a.node(), b.node(), [](auto) { return Fix; });
    Node n;
    n.op = IrOp;
    n.inputs = std::vector<int>{a.id(), b.id()};
    n.axes = a.node().axes;
    if constexpr (is_mask_trait<typename B::trait_type>::value) n.mask = B::trait_type::kind;  // masked()
    return make<typename A::dtype, LA, OutTrait>(g, std::move(n));
  }
}
}  // namespace detail

/// a + b, rhs broadcast into lhs by axis name. A residual connection is add(x, sublayer(x)):
/// the sublayer must give back d_model features.
template <class A, class B>
auto add(const A& a, const B& b) {
  if constexpr (any_poison<A, B>)
    return poison{};
  else
    return detail::broadcast_binary<
        "add", "both operands need the same size on shared axes (a residual branch must return d_model features)",
        Op::add, typename A::trait_type>(a, b);
}

/// a * b, rhs broadcast into lhs by axis name. Multiplying raw scores is a deliberate scale:
/// they count as scaled.
template <class A, class B>
auto mul(const A& a, const B& b) {
  if constexpr (any_poison<A, B>)
    return poison{};
  else
    return detail::broadcast_binary<"mul", "both operands need the same size on shared axes", Op::mul,
                                    detail::rescaled_t<typename A::trait_type>>(a, b);
}

/// x * factor. On raw Q·Kᵀ scores a scale by hand (`scores / sqrt(d_k)` as the tutorials write
/// it, or any factor) is a deliberate choice: they count as scaled. The factor itself is a value
/// no type can check (see docs/diagnostics.md).
template <class T>
auto scale(const T& t, double factor) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    Node n = detail::unary_node(t, Op::scale, t.node().axes);
    n.scalar = factor;
    Graph& g = t.graph();
    return tensor<typename T::dtype, typename T::axis_list, detail::rescaled_t<typename T::trait_type>>(
        g, g.add(std::move(n)));
  }
}

/// scaled(contract<HeadDim>(q, k)): Q·Kᵀ / sqrt(d_k), with d_k the size of the contracted axis
/// (taken from the type, or bound at run time). `scaled(s, factor)` uses a custom factor;
/// `unscaled(s)` says explicitly that the scores are meant to stay as they are.
template <class T>
auto scaled(const T& t, std::optional<double> factor = std::nullopt) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else if constexpr (is_unpaired_trait<typename T::trait_type>::value) {
    return detail::unpaired_error<"scaled", typename T::axis_list, typename T::trait_type, "Key">();
  } else if constexpr (!is_raw_trait<typename T::trait_type>::value) {
    return fail<fixed_string("scaled: ") + axes_fs<typename T::axis_list>() +
                " is not a raw Q*K^T score (already scaled, or not a contraction); fix: scale(x, factor) multiplies "
                "anything">();
  } else {
    using Dk = typename T::trait_type::contracted;
    Node n = detail::unary_node(t, Op::scale, t.node().axes);
    if (factor) {
      n.scalar = *factor;
    } else if constexpr (Dk::is_static) {
      n.scalar = 1.0 / std::sqrt(static_cast<double>(Dk::extent));
    } else {
      // d_k is dynamic: find the contraction that made these scores and record its extent.
      int id = t.id();
      while (t.graph().node(id).op != Op::contract) id = t.graph().node(id).inputs.at(0);
      const Node& c = t.graph().node(id);
      n.dim = ir_axis(t.graph().node(c.inputs.at(0)), Dk::name).extent;
    }
    Graph& g = t.graph();
    return tensor<typename T::dtype, typename T::axis_list, detail::rescaled_t<typename T::trait_type>>(
        g, g.add(std::move(n)));
  }
}

/// Opt out of the 1/sqrt(d_k) scale on purpose (e.g. the scale was folded into W_q, or Q was
/// scaled before the contraction).
template <class T>
auto unscaled(const T& t) {
  if constexpr (any_poison<T>)
    return poison{};
  else
    return tensor<typename T::dtype, typename T::axis_list, detail::rescaled_t<typename T::trait_type>>(t.graph(),
                                                                                                        t.id());
}

namespace detail {
/// The key axis a scores trait got from its contraction ("" for any other trait).
template <class Tr>
constexpr auto scores_keys() {
  if constexpr (requires { Tr::keys; })
    return Tr::keys;
  else
    return fixed_string("");
}
/// Who made a key claim, as the user wrote it.
template <class Claim>
constexpr auto claimant_fs() {
  if constexpr (Claim::by == trait::claimant::causal)
    return fixed_string("causal<") + Claim::query + ", " + Claim::key + ">";
  else if constexpr (Claim::by == trait::claimant::key_padding_mask)
    return fixed_string("the key-padding mask");
  else if constexpr (Claim::by == trait::claimant::attention_mask)
    return fixed_string("the attention mask");
  else
    return fixed_string("the mods");
}

/// What softmax<Over> and logsumexp<Over> check of their scores T (the axis exists, the scores
/// are scaled, the masks agree on the key axis): the failure, or rows_ok{} when T passes.
struct rows_ok {};
template <fixed_string Name, template <auto> class Over, class T>
constexpr auto row_reduction_error() {
  using L = typename T::axis_list;
  using Tr = typename T::trait_type;
  constexpr auto over = family_name_fs<Over>;
  using WrongClaim = typename first_wrong_claim<over, typename claims_of<Tr>::type>::type;
  if constexpr (!has_family<L, Over> && is_unpaired_trait<Tr>::value) {
    return unpaired_error<Name, L, Tr, over>();
  } else if constexpr (!has_family<L, Over>) {
    return fail<Name + ": scores " + axes_fs<L>() + " have no axis `" + over + "`; fix: " + Name +
                " over the key axis of the scores">();
  } else if constexpr (is_raw_trait<Tr>::value) {
    using Dk = typename Tr::contracted;
    return fail<Name + ": scores " + axes_fs<L>() + " are raw Q*K^T, not scaled by 1/sqrt(" + Dk::name_fs + "=" +
                extent_fs<Dk>() + "); fix: " + Name + "<" + over +
                ">(scaled(scores)), or unscaled(scores) to opt out">();
  } else if constexpr (!std::is_void_v<WrongClaim>) {
    if constexpr (WrongClaim::by == trait::claimant::causal && scores_keys<Tr>() == WrongClaim::key) {
      // causal<Q, K> named both axes and the contraction agrees on K: the reduction is over the
      // wrong axis, not the mask (a mask's claim keeps its own message: it may be the mistake).
      return fail<Name + ": the key axis of the scores " + axes_fs<L>() + " is `" + WrongClaim::key +
                  "` (the axis k brought to the contraction, and " + claimant_fs<WrongClaim>() + " says so too), but " +
                  Name + " is over `" + over + "`; fix: " + Name + "<" + WrongClaim::key + ">(scores)">();
    } else {
      return claim_error<WrongClaim, L, over>();
    }
  } else {
    return rows_ok{};
  }
}
}  // namespace detail

/// softmax<Key>(scores): normalise over the named axis (max-subtracted; a row with no visible
/// entry gives zeros, not NaN). The result remembers the axis, so the weighted sum can check it.
/// Naming the axis makes it the key axis: what the masks and causal() said about the key axis
/// is checked here.
template <template <auto> class Over, class T>
auto softmax(const T& t) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else if constexpr (!std::is_same_v<decltype(detail::row_reduction_error<"softmax", Over, T>()), detail::rows_ok>) {
    return detail::row_reduction_error<"softmax", Over, T>();
  } else {
    using L = typename T::axis_list;
    constexpr auto over = family_name_fs<Over>;
    Node n = detail::unary_node(t, Op::softmax, t.node().axes);
    n.attr_axes = {std::string(family_name<Over>)};
    Graph& g = t.graph();
    return tensor<typename T::dtype, L, detail::softmax_t<typename T::trait_type, over>>(g, g.add(std::move(n)));
  }
}

/// logsumexp<Key>(scores): log of the sum of exp over the named axis, the statistic a softmax
/// normalises by (FlashAttention's `lse`): softmax<Key>(s) = exp(s - logsumexp<Key>(s)). A row
/// with no visible entry gives -inf. The result has the scores' axes without `Key`. It checks
/// what softmax checks; next to softmax<Key> of the same scores in an attention, the fused
/// kernel writes it as it goes (no second pass over the keys).
template <template <auto> class Over, class T>
auto logsumexp(const T& t) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else if constexpr (!std::is_same_v<decltype(detail::row_reduction_error<"logsumexp", Over, T>()),
                                       detail::rows_ok>) {
    return detail::row_reduction_error<"logsumexp", Over, T>();
  } else {
    using L = without<typename T::axis_list, axes<Over<dyn>>>;
    Node n;
    n.op = Op::logsumexp;
    n.inputs = std::vector<int>{t.id()};
    for (const auto& x : t.node().axes)
      if (x.name != family_name<Over>) n.axes.push_back(x);
    n.attr_axes = {std::string(family_name<Over>)};
    return detail::make<typename T::dtype, L, trait::plain>(t.graph(), std::move(n));
  }
}

/// masked(scores, mask): entries where the keep-mask is false take no part in the softmax.
/// The mask broadcasts by name, whatever the layout of the scores. A key-padding mask
/// [Batch, Key] or an attention mask [Query, Key] says which axis is the key axis; softmax<Key>
/// checks that by name (covering the query axis instead is the classic padding bug).
template <class S, class M>
auto masked(const S& s, const M& m) {
  if constexpr (any_poison<S, M>) {
    return poison{};
  } else if constexpr (!is_keep_mask<M>) {
    return fail<fixed_string("masked: the mask ") + detail::operand_fs<M>() +
                " is not a keep-mask; fix: declare it as KeepMask, KeyPaddingMask or AttnMask (bool, true = may "
                "attend), or use biased() for an additive float mask, causal<Q, K>() for a causal one">();
  } else if constexpr (is_unpaired_trait<typename S::trait_type>::value &&
                       detail::first_missing<typename S::axis_list, typename M::axis_list>() != M::axis_list::size) {
    return detail::unpaired_error<"masked", typename S::axis_list, typename S::trait_type,
                                  axis_at<typename M::axis_list, M::axis_list::size - 1>::name_fs>();
  } else {
    return detail::broadcast_binary<
        "masked", "a mask covers axes the scores have, at the same sizes", Op::keep_mask,
        detail::claimed_t<typename S::trait_type, typename detail::mask_claim<std::remove_cvref_t<M>>::type>>(s, m);
  }
}

/// biased(scores, bias): add a float bias (−inf allowed) that broadcasts by name. A bool mask is
/// not a bias (added as 0/1 it would exclude nothing): that is masked().
template <class S, class B>
auto biased(const S& s, const B& b) {
  if constexpr (any_poison<S, B>) {
    return poison{};
  } else if constexpr (!TensorType<B>) {
    return fail<fixed_string("biased: the bias ") + detail::operand_fs<B>() +
                " is not a tensor; fix: pass a float tensor over axes of the scores, or causal<Q, K>() for a causal "
                "mask">();
  } else if constexpr (is_keep_mask<B> || std::is_same_v<typename B::dtype, boolean>) {
    return fail<fixed_string("biased: ") + axes_fs<typename B::axis_list>() +
                " is a bool mask (true = may attend), not an additive float bias; fix: masked(scores, mask), with the "
                "mask declared as KeepMask, KeyPaddingMask or AttnMask">();
  } else {
    return detail::broadcast_binary<"biased", "a bias covers axes the scores have, at the same sizes", Op::bias,
                                    typename S::trait_type>(s, b);
  }
}

/// Alignment of a causal mask when there are L queries and S keys: top-left keeps key j for
/// query i when j <= i (PyTorch's is_causal); bottom-right when j <= i + S - L (FlashAttention
/// >= 2.1, the right one for decoding against a cache). They agree when L == S.
struct top_left_t {
  static constexpr CausalAlign value = CausalAlign::top_left;
};
struct bottom_right_t {
  static constexpr CausalAlign value = CausalAlign::bottom_right;
};
inline constexpr top_left_t top_left{};
inline constexpr bottom_right_t bottom_right{};

/// No alignment given: fine when L == S, a compile error (or ShapeError) otherwise.
struct unaligned_t {};

namespace detail {
/// Who the fix of an unaligned causal mask speaks to: the op's caller, or a building block's
/// (which passes `causal_mask`, `causal_top_left` or `causal_bottom_right`).
enum class causal_fix : std::uint8_t { op, block };

template <template <auto> class Q, template <auto> class K, causal_fix Fix, class T, class Align>
auto causal_checked(const T& t, Align /*align*/) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    using Tr = typename T::trait_type;
    if constexpr ((!has_family<L, Q> || !has_family<L, K>) && is_unpaired_trait<Tr>::value) {
      return unpaired_error<"causal", L, Tr, family_name_fs<K>>();
    } else if constexpr (!has_family<L, Q> || !has_family<L, K>) {
      return fail<fixed_string("causal: scores ") + axes_fs<L>() + " need the query axis `" + family_name_fs<Q> +
                  "` and the key axis `" + family_name_fs<K> + "`; fix: name the query and key axes of the scores">();
    } else {
      using XQ = find_family<L, Q>;
      using XK = find_family<L, K>;
      auto text = [](auto a, auto b) {
        constexpr auto fix = [] {
          if constexpr (Fix == causal_fix::op)
            return fixed_string("causal<") + XQ::name_fs + ", " + XK::name_fs +
                   ">(s, top_left) as in PyTorch is_causal, or bottom_right as in FlashAttention";
          else
            return fixed_string(
                "pass causal_top_left (as PyTorch is_causal) or causal_bottom_right (as "
                "FlashAttention) instead of causal_mask");
        }();
        return fixed_string("causal: `") + XQ::name_fs + "` (" + a + ") != `" + XK::name_fs + "` (" + b +
               "), so the alignment of the mask matters; fix: " + fix;
      };
      if constexpr (std::is_same_v<Align, unaligned_t> && XQ::is_static && XK::is_static && XQ::extent != XK::extent) {
        return fail<text(number<XQ::extent>(), number<XK::extent>())>();
      } else {
        Graph& g = t.graph();
        if constexpr (std::is_same_v<Align, unaligned_t>)
          defer_equal(g, ir_axis(t.node(), XQ::name).extent, ir_axis(t.node(), XK::name).extent, text);
        Node n = unary_node(t, Op::causal, t.node().axes);
        n.attr_axes = {std::string(XQ::name), std::string(XK::name)};
        if constexpr (!std::is_same_v<Align, unaligned_t>) n.align = Align::value;
        using Claim = trait::key_claim<trait::claimant::causal, XK::name_fs, XQ::name_fs>;
        return tensor<typename T::dtype, L, with_claim_t<Tr, Claim>>(g, g.add(std::move(n)));
      }
    }
  }
}
}  // namespace detail

/// causal<Seq, Key>(scores [, top_left | bottom_right]): the query axis first, then the key
/// axis (softmax<Key> checks that the second is the axis it normalises over).
template <template <auto> class Q, template <auto> class K, class T, class Align = unaligned_t>
auto causal(const T& t, Align align = {}) {
  return detail::causal_checked<Q, K, detail::causal_fix::op>(t, align);
}

/// dropout(weights, p, seed): zero each entry with probability p and rescale the rest by
/// 1/(1-p); which entries drop is a pure function of (seed, position), identical in every backend.
template <class T>
auto dropout(const T& t, double p, std::uint64_t seed) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    if (!(p >= 0.0 && p < 1.0)) throw std::invalid_argument("dropout: p must be in [0, 1)");
    Node n = detail::unary_node(t, Op::dropout, t.node().axes);
    n.scalar = p;
    n.seed = seed;
    Graph& g = t.graph();
    return tensor<typename T::dtype, typename T::axis_list, typename T::trait_type>(g, g.add(std::move(n)));
  }
}

template <class T>
auto relu(const T& t) {
  if constexpr (any_poison<T>)
    return poison{};
  else {
    Graph& g = t.graph();
    return tensor<typename T::dtype, typename T::axis_list, trait::plain>(
        g, g.add(detail::unary_node(t, Op::relu, t.node().axes)));
  }
}

/// The exact (erf) GELU, as torch.nn.functional.gelu's default.
template <class T>
auto gelu(const T& t) {
  if constexpr (any_poison<T>)
    return poison{};
  else {
    Graph& g = t.graph();
    return tensor<typename T::dtype, typename T::axis_list, trait::plain>(
        g, g.add(detail::unary_node(t, Op::gelu, t.node().axes)));
  }
}

namespace detail {
template <class DT>
inline constexpr bool is_float_dtype = std::is_same_v<DT, f32> || std::is_same_v<DT, f16> || std::is_same_v<DT, bf16>;
}  // namespace detail

/// The values of `t` stored as `DT` (f32, f16 or bf16): rounded to nearest, ties to even, when
/// narrower (as torch.Tensor.to(dtype)); the axes and the trait unchanged. A no-op when t already
/// is DT.
template <class DT, class T>
auto convert(const T& t) {
  if constexpr (any_poison<T>)
    return poison{};
  else if constexpr (!detail::is_float_dtype<DT>)
    return fail<fixed_string("convert: the target dtype ") + DT::name +
                " is not a floating type; fix: convert<f32>, convert<bf16> or convert<f16>">();
  else if constexpr (!detail::is_float_dtype<typename T::dtype>)
    return fail<fixed_string("convert: ") + axes_fs<typename T::axis_list>() + " is " + T::dtype::name +
                ", not a floating tensor; masks and ids are not converted">();
  else if constexpr (std::is_same_v<DT, typename T::dtype>)
    return t;
  else {
    Graph& g = t.graph();
    Node n = detail::unary_node(t, Op::convert, t.node().axes);
    n.dtype = DT::value;
    return tensor<DT, typename T::axis_list, typename T::trait_type>(g, g.add(std::move(n)));
  }
}

}  // namespace qkv
