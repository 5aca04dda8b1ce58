// qkv/dsl/ops_math.hpp — ops that compute: contract (einsum over named axes), linear, add/mul
// with by-name broadcasting, scaling, softmax, masks and biases, causal masks, dropout, layer
// norm, relu/gelu.
//
// Catalogue entries checked here: 2 (padding mask on the query axis), 3 (softmax over one axis,
// weighted sum over another), 4/10 (contraction sizes), 8 (projection/residual widths),
// 12 (causal alignment on L != S), 13 (softmax over unscaled scores).
#pragma once

#include <cmath>
#include <optional>

#include <qkv/dsl/ops_structure.hpp>

namespace qkv {

namespace detail {

/// The first axis of L1 that L2 also has, with a different static extent (L1::size if none).
template <class L1, class L2>
constexpr std::size_t first_shared_mismatch() {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    auto bad = []<class X>() {
      if constexpr (!has_axis_named<L2, X>)
        return false;
      else {
        using Y = find_named<L2, X>;
        return X::is_static && Y::is_static && X::extent != Y::extent;
      }
    };
    constexpr bool differ[] = { bad.template operator()<axis_at<L1, I>>()..., true };
    std::size_t i = 0;
    while (!differ[i]) ++i;
    return i;
  }(std::make_index_sequence<L1::size>{});
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
template <fixed_string Op, class X, fixed_string Fix>
constexpr auto equal_text(auto a, auto b) {
  return Op + ": `" + X::name_fs + "` of lhs (" + a + ") must equal `" + X::name_fs + "` of rhs (" + b +
         "); fix: " + Fix;
}

/// Defers the check of every shared axis whose extents involve a dynamic size.
template <fixed_string Op, fixed_string Fix, class L1>
void defer_shared(Graph& g, const Node& a, const Node& b) {
  hana::for_each(L1::types, [&](auto t) {
    using X = typename decltype(t)::type;
    for (const auto& y : b.axes)
      if (y.name == X::name)
        defer_equal(g, ir_axis(a, X::name).extent, y.extent,
                    [](auto sa, auto sb) { return equal_text<Op, X, Fix>(sa, sb); });
  });
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

/// True for a key-padding mask whose key axis is not the scores' key axis K.
template <class Tr, class LM, class K>
inline constexpr bool pads_the_wrong_axis = false;
template <class LM, class K>
  requires(LM::size == 2)
inline constexpr bool pads_the_wrong_axis<trait::mask<MaskKind::key_padding>, LM, K> = !same_name<axis_at<LM, 1>, K>;

/// True when Tr marks softmax weights normalised over an axis that is not contracted in CA.
template <class Tr, class CA>
inline constexpr bool normalised_elsewhere = false;
template <fixed_string Over, class CA>
inline constexpr bool normalised_elsewhere<trait::weights<Over>, CA> = !has_axis_named<CA, axis<Over, dyn>>;

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
    constexpr auto fix = fixed_string(
        "contracted axes must have one size (Q*K^T: the same d_k; P*V: keys and values from one sequence)");
    if constexpr (constexpr auto i = detail::first_missing<LA, CA>(); i != CA::size) {
      return fail<fixed_string("contract: lhs ") + axes_fs<LA>() + " has no axis `" + axis_at<CA, i>::name_fs +
                  "` to contract over; fix: contract over an axis both operands have">();
    } else if constexpr (constexpr auto j = detail::first_missing<LB, CA>(); j != CA::size) {
      return fail<fixed_string("contract: rhs ") + axes_fs<LB>() + " has no axis `" + axis_at<CA, j>::name_fs +
                  "` to contract over; fix: rename the matching axis of rhs to `" + axis_at<CA, j>::name_fs + "`">();
    } else if constexpr (detail::normalised_elsewhere<typename A::trait_type, CA>) {
      return fail<fixed_string("contract: weights are normalised over `") + A::trait_type::over +
                  "` but contracted over `" + axis_at<CA, 0>::name_fs + "`; fix: softmax<" + axis_at<CA, 0>::name_fs +
                  ">(scores)">();
    } else if constexpr (detail::normalised_elsewhere<typename B::trait_type, CA>) {
      return fail<fixed_string("contract: weights are normalised over `") + B::trait_type::over +
                  "` but contracted over `" + axis_at<CA, 0>::name_fs + "`; fix: softmax<" + axis_at<CA, 0>::name_fs +
                  ">(scores)">();
    } else if constexpr (constexpr auto k = detail::first_shared_mismatch<LA, LB>(); k != LA::size) {
      using X = axis_at<LA, k>;
      return fail<detail::equal_text<"contract", X, fix>(number<X::extent>(), number<find_named<LB, X>::extent>())>();
    } else {
      using Out = concat_axes<without<LA, CA>, without<without<LB, CA>, LA>>;
      constexpr bool scores = std::is_same_v<typename A::trait_type, trait::plain> &&
                              std::is_same_v<typename B::trait_type, trait::plain> && without<LA, LB>::size > 0 &&
                              without<LB, LA>::size > 0;
      using Tr = std::conditional_t<scores, trait::raw_scores<find_family<LA, C0>>, trait::plain>;
      Graph& g = a.graph();
      detail::defer_shared<"contract", fix, LA>(g, a.node(), b.node());
      Node n;
      n.op = Op::contract;
      n.inputs = std::vector<int>{a.id(), b.id()};
      n.attr_axes = {std::string(family_name<C0>), std::string(family_name<Cs>)...};
      for (const auto& x : a.node().axes)
        if (!detail::has_name(n.attr_axes, x.name)) n.axes.push_back(x);
      for (const auto& x : b.node().axes)
        if (!detail::has_name(n.attr_axes, x.name) && !detail::has_name_in(n.axes, x.name)) n.axes.push_back(x);
      return detail::make<typename A::dtype, Out, Tr>(g, std::move(n));
    }
  }
}

namespace detail {
/// Elementwise with by-name broadcasting: every axis of rhs must be an axis of lhs (of the same
/// size); the result has lhs's axes. Used by add, mul and bias.
template <fixed_string OpName, fixed_string Fix, Op IrOp, class A, class B>
auto broadcast_binary(const A& a, const B& b) {
  using LA = typename A::axis_list;
  using LB = typename B::axis_list;
  if constexpr (constexpr auto i = first_missing<LA, LB>(); i != LB::size) {
    return fail<OpName + ": `" + axis_at<LB, i>::name_fs + "` of rhs " + axes_fs<LB>() + " is not an axis of lhs " +
                axes_fs<LA>() + "; fix: " + Fix>();
  } else if constexpr (constexpr auto k = first_shared_mismatch<LA, LB>(); k != LA::size) {
    using X = axis_at<LA, k>;
    return fail<equal_text<OpName, X, Fix>(number<X::extent>(), number<find_named<LB, X>::extent>())>();
  } else {
    Graph& g = a.graph();
    defer_shared<OpName, Fix, LA>(g, a.node(), b.node());
    Node n;
    n.op = IrOp;
    n.inputs = std::vector<int>{a.id(), b.id()};
    n.axes = a.node().axes;
    if constexpr (is_mask_trait<typename B::trait_type>::value) n.mask = B::trait_type::kind;  // masked()
    return make<typename A::dtype, LA, typename A::trait_type>(g, std::move(n));
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
        Op::add>(a, b);
}

/// a * b, rhs broadcast into lhs by axis name.
template <class A, class B>
auto mul(const A& a, const B& b) {
  if constexpr (any_poison<A, B>)
    return poison{};
  else
    return detail::broadcast_binary<"mul", "both operands need the same size on shared axes", Op::mul>(a, b);
}

/// x * factor.
template <class T>
auto scale(const T& t, double factor) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    Node n = detail::unary_node(t, Op::scale, t.node().axes);
    n.scalar = factor;
    Graph& g = t.graph();
    return tensor<typename T::dtype, typename T::axis_list, typename T::trait_type>(g, g.add(std::move(n)));
  }
}

/// scaled(contract<HeadDim>(q, k)): Q·Kᵀ / sqrt(d_k), with d_k the size of the contracted axis
/// (taken from the type, or bound at run time). `scaled(s, factor)` uses a custom factor;
/// `unscaled(s)` says explicitly that the scores are meant to stay as they are.
template <class T>
auto scaled(const T& t, std::optional<double> factor = std::nullopt) {
  if constexpr (any_poison<T>) {
    return poison{};
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
    return tensor<typename T::dtype, typename T::axis_list, trait::scores>(g, g.add(std::move(n)));
  }
}

/// Opt out of the 1/sqrt(d_k) scale on purpose (e.g. the scale was folded into W_q).
template <class T>
auto unscaled(const T& t) {
  if constexpr (any_poison<T>)
    return poison{};
  else
    return tensor<typename T::dtype, typename T::axis_list, trait::scores>(t.graph(), t.id());
}

/// softmax<Key>(scores): normalise over the named axis (max-subtracted; a row with no visible
/// entry gives zeros, not NaN). The result remembers the axis, so the weighted sum can check it.
template <template <auto> class Over, class T>
auto softmax(const T& t) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_family<L, Over>) {
      return fail<fixed_string("softmax: scores ") + axes_fs<L>() + " have no axis `" + family_name_fs<Over> +
                  "`; fix: softmax over the key axis of the scores">();
    } else if constexpr (is_raw_trait<typename T::trait_type>::value) {
      using Dk = typename T::trait_type::contracted;
      return fail<fixed_string("softmax: scores ") + axes_fs<L>() + " are raw Q*K^T, not scaled by 1/sqrt(" +
                  Dk::name_fs + "=" + extent_fs<Dk>() + "); fix: softmax<" + family_name_fs<Over> +
                  ">(scaled(scores)), or unscaled(scores) to opt out">();
    } else {
      Node n = detail::unary_node(t, Op::softmax, t.node().axes);
      n.attr_axes = {std::string(family_name<Over>)};
      Graph& g = t.graph();
      return tensor<typename T::dtype, L, trait::weights<family_name_fs<Over>>>(g, g.add(std::move(n)));
    }
  }
}

/// masked(scores, mask): entries where the keep-mask is false take no part in the softmax.
/// The mask broadcasts by name. A key-padding mask [Batch, Key] must cover the scores' key axis
/// (their last axis, as contract() builds them): covering the query axis instead is the classic
/// padding bug.
template <class S, class M>
auto masked(const S& s, const M& m) {
  if constexpr (any_poison<S, M>) {
    return poison{};
  } else if constexpr (!is_mask_trait<typename M::trait_type>::value) {
    return fail<
        fixed_string("masked: the mask ") + axes_fs<typename M::axis_list>() +
        " is not a keep-mask; fix: declare it as KeepMask, KeyPaddingMask or AttnMask (bool, true = may attend), "
        "or use biased() for an additive float mask">();
  } else {
    using LS = typename S::axis_list;
    using LM = typename M::axis_list;
    using KeyOfScores = axis_at<LS, LS::size - 1>;
    if constexpr (detail::pads_the_wrong_axis<typename M::trait_type, LM, KeyOfScores>) {
      using P = axis_at<LM, 1>;
      return fail<fixed_string("masked: the key-padding mask covers `") + P::name_fs + "` (" + extent_fs<P>() +
                  "), not the key axis `" + KeyOfScores::name_fs + "` of the scores " + axes_fs<LS>() +
                  "; fix: build the mask over the keys, e.g. rename<" + P::name_fs + ", " + KeyOfScores::name_fs +
                  ">(mask)">();
    } else {
      return detail::broadcast_binary<"masked", "a mask covers axes the scores have, at the same sizes", Op::keep_mask>(
          s, m);
    }
  }
}

/// biased(scores, bias): add a float bias (−inf allowed) that broadcasts by name.
template <class S, class B>
auto biased(const S& s, const B& b) {
  if constexpr (any_poison<S, B>)
    return poison{};
  else
    return detail::broadcast_binary<"biased", "a bias covers axes the scores have, at the same sizes", Op::bias>(s, b);
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

/// causal<Seq, Key>(scores [, top_left | bottom_right]).
template <template <auto> class Q, template <auto> class K, class T, class Align = unaligned_t>
auto causal(const T& t, Align = {}) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_family<L, Q> || !has_family<L, K>) {
      return fail<fixed_string("causal: scores ") + axes_fs<L>() + " need the query axis `" + family_name_fs<Q> +
                  "` and the key axis `" + family_name_fs<K> + "`; fix: name the scores' query and key axes">();
    } else {
      using XQ = find_family<L, Q>;
      using XK = find_family<L, K>;
      auto text = [](auto a, auto b) {
        return fixed_string("causal: `") + XQ::name_fs + "` (" + a + ") != `" + XK::name_fs + "` (" + b +
               "), so the alignment of the mask matters; fix: causal<" + XQ::name_fs + ", " + XK::name_fs +
               ">(s, top_left) as in PyTorch is_causal, or bottom_right as in FlashAttention";
      };
      if constexpr (std::is_same_v<Align, unaligned_t> && XQ::is_static && XK::is_static && XQ::extent != XK::extent) {
        return fail<text(number<XQ::extent>(), number<XK::extent>())>();
      } else {
        Graph& g = t.graph();
        if constexpr (std::is_same_v<Align, unaligned_t>)
          defer_equal(g, ir_axis(t.node(), XQ::name).extent, ir_axis(t.node(), XK::name).extent, text);
        Node n = detail::unary_node(t, Op::causal, t.node().axes);
        n.attr_axes = {std::string(XQ::name), std::string(XK::name)};
        if constexpr (!std::is_same_v<Align, unaligned_t>) n.align = Align::value;
        return tensor<typename T::dtype, L, typename T::trait_type>(g, g.add(std::move(n)));
      }
    }
  }
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

}  // namespace qkv
