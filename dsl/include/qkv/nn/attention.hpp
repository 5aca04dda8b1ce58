// qkv/nn/attention.hpp — attention building blocks written with the DSL's ops, as readable as
// the tutorials' PyTorch modules: the scaled-dot-product core, single-head self-attention,
// heads as separate modules, multi-head attention (fused QKV weight, as PyTorch stores it),
// cross-attention (separate q/k/v weights, kdim/vdim) and grouped-query attention.
//
// Parameters are named as torch.nn.MultiheadAttention's state dict names them, under a prefix:
// `in_proj_weight`/`in_proj_bias` (fused), `q_proj_weight`/`k_proj_weight`/`v_proj_weight`
// (separate), `out_proj.weight`/`out_proj.bias`.
#pragma once

#include <array>
#include <string>
#include <tuple>
#include <utility>

#include <qkv/nn/axes.hpp>

namespace qkv::nn {

/// A causal mask as an argument to the blocks: `causal_mask` (L == S), or with an explicit
/// alignment for L != S.
template <class Align = unaligned_t>
struct Causal {
  using align = Align;
};
inline constexpr Causal<> causal_mask{};
inline constexpr Causal<top_left_t> causal_top_left{};
inline constexpr Causal<bottom_right_t> causal_bottom_right{};

template <class T>
struct is_causal_arg : std::false_type {};
template <class A>
struct is_causal_arg<Causal<A>> : std::true_type {};

/// A function of the scores as a mask argument of the attention blocks:
///   block(x, scores_fn([&](auto s) { return decltype(s)(g, modded(s, mod).id()); }), masks...)
/// calls f on the block's scaled scores (all keys, appended ones included) where the argument
/// stands and goes on with what it returns, which must have the scores' type. It is for
/// modifications chosen at run time, e.g. by a command line's flags, without one instantiation
/// of the block per combination; a program that knows its mods passes them directly.
template <class F>
struct ScoresFn {
  F f;
};
template <class F>
ScoresFn<F> scores_fn(F f) {
  return {std::move(f)};
}

namespace detail {
template <class M>
inline constexpr bool is_scores_fn = false;
template <class F>
inline constexpr bool is_scores_fn<ScoresFn<F>> = true;

/// One mask argument of a block applied to the scores: a scores_fn, a causal mask, a keep-mask,
/// a score or mask mod (qkv::mods, score_mod, mask_mod: modded()), or else an additive float
/// mask (biased() refuses what is not one, and passes poison on silently). Pass score mods before
/// masks: a score mod after a mask keeps the attention unfused (the mask's −inf would reach it).
template <class S, class M>
auto apply_mask(const S& s, const M& m) {
  if constexpr (is_scores_fn<M>)
    return m.f(s);
  else if constexpr (is_causal_arg<M>::value)
    return qkv::detail::causal_checked<Seq, Key, qkv::detail::causal_fix::block>(s, typename M::align{});
  else if constexpr (is_score_mod<M> || is_mask_mod<M>)
    return modded(s, m);
  else if constexpr (is_keep_mask<M>)
    return masked(s, m);
  else
    return biased(s, m);
}
template <class S>
auto apply_masks(const S& s) {
  return s;
}
template <class S, class M, class... R>
auto apply_masks(const S& s, const M& m, const R&... rest) {
  return apply_masks(apply_mask(s, m), rest...);
}

inline std::string join(const std::string& prefix, const std::string& name) { return prefix + name; }

/// Rows [part*n, (part+1)*n) of parameter `id` (its first axis is "out"), as a slice node.
inline int slice_rows(Graph& g, int id, int part, std::vector<Axis> axes) {
  Node n;
  n.op = Op::slice;
  n.inputs = std::vector<int>{id};
  n.axes = std::move(axes);
  n.attr_axes = {"out", "out"};
  n.offset = part;
  return g.add(std::move(n));
}

/// One third (or any part) of a fused projection: the matching rows of W and of b.
template <AxisType In, AxisType Part, AxisType Whole>
Linear<In, Part> slice_linear(const Linear<In, Whole>& w, int part) {
  Graph& g = *w.graph;
  Linear<In, Part> l{&g, -1, -1, w.prefix + "[" + std::to_string(part) + "]"};
  l.weight = slice_rows(g, w.weight, part, {Axis{"out", ir_extent<Part>()}, Axis{"in", ir_extent<In>()}});
  if (w.bias >= 0) l.bias = slice_rows(g, w.bias, part, {Axis{"out", ir_extent<Part>()}});
  return l;
}
}  // namespace detail

/// softmax(mask(Q·Kᵀ / sqrt(d_k))) · V on per-head tensors:
///   q [..., Seq, HeadDim], k [..., Key, HeadDim], v [..., Key, D_v]  ->  {out [..., Seq, D_v], weights [..., Seq,
///   Key]}
/// Masks: KeyPaddingMask / AttnMask / KeepMask (true = may attend), float biases, `causal_mask`.
template <class Q, class K, class V, class... M>
auto attention(const Q& q, const K& k, const V& v, const M&... masks) {
  auto p = softmax<Key>(detail::apply_masks(scaled(contract<HeadDim>(q, k)), masks...));
  return std::pair{contract<Key>(p, v), p};
}

/// One attention head's projections: Model<E> -> HeadDim<Dk> (q, k) and -> ValueDim<Dv> (v).
template <int E, int Dk, int Dv = Dk>
struct Head {
  Linear<Model<E>, HeadDim<Dk>> q;
  Linear<Model<E>, HeadDim<Dk>> k;
  Linear<Model<E>, ValueDim<Dv>> v;

  static Head make(Graph& g, const std::string& prefix, bool bias = true) {
    return {linear_params<Model<E>, HeadDim<Dk>>(g, prefix + "q_proj", bias),
            linear_params<Model<E>, HeadDim<Dk>>(g, prefix + "k_proj", bias),
            linear_params<Model<E>, ValueDim<Dv>>(g, prefix + "v_proj", bias)};
  }

  /// x [Batch, Seq, Model] -> {[Batch, Seq, ValueDim], weights [Batch, Seq, Key]}
  template <class X, class... M>
  auto operator()(const X& x, const M&... masks) const {
    // Named steps, not nested calls: argument evaluation order is unspecified, and the graph
    // (and its hash) must not depend on the compiler.
    auto xs = expect_axes<"attention head", Batch, Seq, Model>(x);
    auto qs = linear(xs, q);
    auto ks = rename<Seq, Key>(linear(xs, k));
    auto vs = rename<Seq, Key>(linear(xs, v));
    return attention(qs, ks, vs, masks...);
  }
};

/// Single-head self-attention with an output projection (the tutorials' first module).
template <int E, int Dk = E, int Dv = Dk>
struct SelfAttention {
  Head<E, Dk, Dv> head;
  Linear<ValueDim<Dv>, Model<E>> o;

  static SelfAttention make(Graph& g, const std::string& prefix = "", bool bias = true) {
    auto head = Head<E, Dk, Dv>::make(g, prefix, bias);
    return {head, linear_params<ValueDim<Dv>, Model<E>>(g, prefix + "out_proj", bias)};
  }
  template <class X, class... M>
  auto operator()(const X& x, const M&... masks) const {
    auto [out, weights] = head(x, masks...);
    return std::pair{linear(out, o), weights};
  }
};

/// Multi-head attention as H separate heads whose outputs are concatenated, then W_o.
template <int E, int H>
struct HeadsAsModules {
  static constexpr int D = E / H;
  std::array<Head<E, D, D>, H> heads;
  Linear<Model<D * H>, Model<E>> o;

  static HeadsAsModules make(Graph& g, const std::string& prefix = "", bool bias = true) {
    HeadsAsModules m{};
    for (int h = 0; h < H; ++h) m.heads[h] = Head<E, D, D>::make(g, prefix + "heads." + std::to_string(h) + ".", bias);
    m.o = linear_params<Model<D * H>, Model<E>>(g, prefix + "out_proj", bias);
    return m;
  }
  template <class X, class... M>
  auto operator()(const X& x, const M&... masks) const {
    auto outs = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::array{heads[I](x, masks...).first...};
    }(std::make_index_sequence<H>{});
    return linear(concat<ValueDim, Model>(outs), o);
  }
};

/// Keys or values already projected and split into heads, [Batch, Heads, Key, HeadDim]: PyTorch's
/// static_k / static_v ([B·H, S, head_dim], the same memory seen as [B, H, S, head_dim]). Given to
/// MultiHeadAttention::cross or CrossAttention in place of a key or value source, they skip that
/// projection (add_zero_attn still appends its zero row; add_bias_kv is refused, as PyTorch
/// refuses it).
template <class T>
struct Projected {
  T heads;
};
template <TensorType T>
Projected<T> projected(const T& heads) {
  return {heads};
}

/// PyTorch's add_bias_kv (a learned key and value appended to every sequence) and
/// add_zero_attn (a zero key and value appended after the heads are split).
struct MhaOptions {
  bool add_bias_kv = false;
  bool add_zero_attn = false;
  [[nodiscard]] constexpr int extra_keys() const { return (add_bias_kv ? 1 : 0) + (add_zero_attn ? 1 : 0); }
};

namespace detail {
/// A mask over the keys, extended over N appended keys the way PyTorch does: appended keys are
/// visible (keep-masks get `true`, additive masks 0).
template <int N, class M>
auto extend_over_extra_keys(const M& m) {
  if constexpr (N == 0 || is_scores_fn<M>) {
    return m;
  } else if constexpr (is_causal_arg<M>::value) {
    return fail<fixed_string("multi_head_attention: a causal mask with add_bias_kv/add_zero_attn is ambiguous (the ") +
                number<N>() + " appended keys have no position); fix: pass an explicit attention mask">();
  } else if constexpr (is_keep_mask<M>) {
    return pad<Key, N>(m, 1.0);
  } else {
    return pad<Key, N>(m, 0.0);
  }
}

/// Whether the third argument of MultiHeadAttention::cross is the values of PyTorch's
/// cross(x, key, value, masks...) rather than the first mask of cross(x, memory, masks...):
/// values carry features (`Model`); masks and biases are over the scores' axes, which never
/// include `Model`.
template <class T>
inline constexpr bool is_projected = false;
template <class T>
inline constexpr bool is_projected<Projected<T>> = true;

template <class T>
consteval bool values_arg() {
  if constexpr (is_projected<T>)
    return true;
  else if constexpr (TensorType<T> && !is_keep_mask<T>)
    return has_family<typename T::axis_list, Model>;
  else
    return false;
}
template <class T>
inline constexpr bool is_values_arg = values_arg<T>();

/// add_bias_kv: the learned row `row` ([Key = 1, Model]) appended to projected keys or values
/// [Batch, Key, Model] (before the heads are split, as PyTorch appends them).
template <MhaOptions Opt, auto E, class P>
auto with_bias_row(Graph& g, const P& projected, int row) {
  if constexpr (Opt.add_bias_kv)
    return append<Key>(projected, Tensor<f32, Key<1>, Model<E>>(g, row));
  else
    return projected;
}
/// add_zero_attn: a zero key / value appended after the heads are split.
template <MhaOptions Opt, class P>
auto with_zero_key(const P& heads) {
  if constexpr (Opt.add_zero_attn)
    return pad<Key, 1>(heads, 0.0);
  else
    return heads;
}
/// The key (or value) heads [Batch, Heads, Key, HeadDim] of one source: `project` maps a source
/// [Batch, Key, features] to its projected [Batch, Key, Model] and `split` that to the heads, with
/// add_bias_kv's row `row` and add_zero_attn's zero row as Opt says; a Projected source is used
/// as it is (but for the zero row).
template <MhaOptions Opt, auto E, class S, class P, class Split>
auto kv_heads(Graph& g, const S& source, P&& project, Split&& split, int row) {
  if constexpr (is_projected<S>) {
    static_assert(!Opt.add_bias_kv,
                  "static_k / static_v with add_bias_kv: PyTorch refuses the pair (bias_k is "
                  "appended to projected keys only)");
    return with_zero_key<Opt>(expect_axes<"static_k/static_v", Batch, Heads, Key, HeadDim>(source.heads));
  } else {
    return with_zero_key<Opt>(split(with_bias_row<Opt, E>(g, project(source), row)));
  }
}

/// add_bias_kv's two rows, `<prefix>bias_k` and `<prefix>bias_v` (PyTorch stores them [1, 1, E];
/// the importer passes them as [1, E]), or {-1, -1}.
template <MhaOptions Opt, auto E>
std::pair<int, int> bias_kv_params(Graph& g, const std::string& prefix) {
  if constexpr (Opt.add_bias_kv)
    return {param<Tensor<f32, Key<1>, Model<E>>>(g, prefix + "bias_k").id(),
            param<Tensor<f32, Key<1>, Model<E>>>(g, prefix + "bias_v").id()};
  else
    return {-1, -1};
}
template <class... M>
inline constexpr bool starts_with_values = false;
template <class V, class... M>
inline constexpr bool starts_with_values<V, M...> = is_values_arg<V>;
}  // namespace detail

/// torch.nn.MultiheadAttention (batch_first=True): one fused in-projection [3E, E] cut in three,
/// split Model -> Heads x HeadDim, attend per head, permute back, merge, out-projection.
///
/// E and H are numbers (checked at compile time) or `dyn` (the CLI builds models from a state
/// dict: E is bound from the weights at run time, H is given to make()).
template <auto E, auto H, MhaOptions Opt = MhaOptions{}>
struct MultiHeadAttention {
  static constexpr auto D = extent_div<E, H>();
  Linear<Model<E>, Model<E>> q, k, v;
  Linear<Model<E>, Model<E>> o;
  int bias_k = -1, bias_v = -1;  // add_bias_kv's [1, E] rows (PyTorch stores them as [1, 1, E])
  std::int64_t heads = 0;

  /// `num_heads` is needed only when H is dyn (and must equal H otherwise).
  static MultiHeadAttention make(Graph& g, const std::string& prefix = "", bool bias = true,
                                 std::int64_t num_heads = 0) {
    if constexpr (is_dyn<H>) {
      if (num_heads <= 0) throw std::invalid_argument("MultiHeadAttention<E, dyn>::make needs num_heads > 0");
    } else {
      if (num_heads != 0 && num_heads != H) throw std::invalid_argument("MultiHeadAttention: num_heads differs from H");
      num_heads = H;
    }
    auto in_proj = linear_params_named<Model<E>, Proj<extent_mul<3, E>()>>(g, prefix + "in_proj_weight",
                                                                           bias ? prefix + "in_proj_bias" : "");
    MultiHeadAttention m{detail::slice_linear<Model<E>, Model<E>>(in_proj, 0),
                         detail::slice_linear<Model<E>, Model<E>>(in_proj, 1),
                         detail::slice_linear<Model<E>, Model<E>>(in_proj, 2),
                         linear_params<Model<E>, Model<E>>(g, prefix + "out_proj", bias)};
    m.heads = num_heads;
    std::tie(m.bias_k, m.bias_v) = detail::bias_kv_params<Opt, E>(g, prefix);
    return m;
  }

  /// [Batch, S, Model] -> [Batch, S, Heads, HeadDim] (S is Seq or Key)
  auto split_model(const auto& t) const {
    if constexpr (is_dyn<H> || is_dyn<E>)
      return split<Model, Heads<H>, HeadDim<D>>(t, {heads, 0});
    else
      return split<Model, Heads<H>, HeadDim<D>>(t);
  }
  /// [Batch, Seq, Model] -> [Batch, Heads, Seq, HeadDim]
  auto split_heads(const auto& t) const { return permute<Batch, Heads, Seq, HeadDim>(split_model(t)); }
  /// [Batch, Key, Model] -> [Batch, Heads, Key, HeadDim]
  auto split_heads_kv(const auto& t) const { return permute<Batch, Heads, Key, HeadDim>(split_model(t)); }
  /// [Batch, Heads, Seq, HeadDim] -> [Batch, Seq, Heads, HeadDim] -> [Batch, Seq, Model]
  static auto merge_heads(const auto& t) {
    return merge<Heads, HeadDim, Model>(permute<Batch, Seq, Heads, HeadDim>(t));
  }

  /// Self-attention: x [Batch, Seq, Model] -> {out [Batch, Seq, Model], weights [Batch, Heads, Seq, Key]}.
  template <class X, class... M>
  auto operator()(const X& x, const M&... masks) const {
    auto xs = expect_axes<"multi_head_attention", Batch, Seq, Model>(x);
    auto keys = rename<Seq, Key>(xs);
    return attend(xs, keys, keys, masks...);
  }

  /// Cross-attention: queries x [Batch, Seq, Model], keys/values from memory [Batch, Mem, Model].
  template <class X, class Mm, class... M>
    requires(!detail::starts_with_values<M...>)
  auto cross(const X& x, const Mm& memory, const M&... masks) const {
    auto xs = expect_axes<"cross_attention", Batch, Seq, Model>(x);
    auto ms = rename<Mem, Key>(expect_axes<"cross_attention memory", Batch, Mem, Model>(memory));
    return attend(xs, ms, ms, masks...);
  }

  /// PyTorch's general call: keys and values from two tensors [Batch, Mem, Model] of one length,
  /// either of them possibly projected(heads) (static_k / static_v). (The third argument is the
  /// values when it has a `Model` axis or is projected; masks are neither.)
  template <class X, class Km, class Vm, class... M>
    requires(detail::is_values_arg<Vm>)
  auto cross(const X& x, const Km& key, const Vm& value, const M&... masks) const {
    auto xs = expect_axes<"cross_attention", Batch, Seq, Model>(x);
    auto source = [](const auto& t) {
      if constexpr (detail::is_projected<std::remove_cvref_t<decltype(t)>>)
        return t;
      else
        return rename<Mem, Key>(expect_axes<"cross_attention key/value", Batch, Mem, Model>(t));
    };
    return attend(xs, source(key), source(value), masks...);
  }

 private:
  template <class X, class KV, class VV, class... M>
  auto attend(const X& x, const KV& key_src, const VV& value_src, const M&... masks) const {
    Graph& g = *o.graph;
    auto qh = split_heads(linear(x, q));
    auto split = [&](const auto& t) { return split_heads_kv(t); };
    auto kh = detail::kv_heads<Opt, E>(g, key_src, [&](const auto& t) { return linear(t, k); }, split, bias_k);
    auto vh = detail::kv_heads<Opt, E>(g, value_src, [&](const auto& t) { return linear(t, v); }, split, bias_v);
    auto [out, weights] = attention(qh, kh, vh, detail::extend_over_extra_keys<Opt.extra_keys()>(masks)...);
    return std::pair{linear(merge_heads(out), o), weights};
  }
};

/// Cross-attention with separate projections and kdim/vdim != E (PyTorch's q_proj_weight,
/// k_proj_weight, v_proj_weight): keys come from [Batch, Mem, Hidden<KDim>], values from
/// [Batch, Mem, ValueDim<VDim>]. Sizes may be `dyn` (then make() takes the head count).
/// Opt: add_bias_kv / add_zero_attn, as for MultiHeadAttention (the rows are E wide: PyTorch
/// appends them after the projections).
template <auto E, auto H, auto KDim, auto VDim, MhaOptions Opt = MhaOptions{}>
struct CrossAttention {
  static constexpr auto D = extent_div<E, H>();
  Linear<Model<E>, Model<E>> q;
  Linear<Hidden<KDim>, Model<E>> k;
  Linear<ValueDim<VDim>, Model<E>> v;
  Linear<Model<E>, Model<E>> o;
  std::int64_t heads = 0;
  int bias_k = -1, bias_v = -1;

  static CrossAttention make(Graph& g, const std::string& prefix = "", bool bias = true, std::int64_t num_heads = 0) {
    if constexpr (is_dyn<H>) {
      if (num_heads <= 0) throw std::invalid_argument("CrossAttention<E, dyn, ...>::make needs num_heads > 0");
    } else {
      num_heads = H;
    }
    CrossAttention c{linear_params_named<Model<E>, Model<E>>(g, prefix + "q_proj_weight", ""),
                     linear_params_named<Hidden<KDim>, Model<E>>(g, prefix + "k_proj_weight", ""),
                     linear_params_named<ValueDim<VDim>, Model<E>>(g, prefix + "v_proj_weight", ""),
                     linear_params<Model<E>, Model<E>>(g, prefix + "out_proj", bias), num_heads};
    if (bias) {  // PyTorch keeps one in_proj_bias [3E] even when the weights are separate
      Node b;
      b.op = Op::param;
      b.name = prefix + "in_proj_bias";
      b.axes = {Axis{"out", ir_extent<Model<E>>().times(3)}};
      const int fused = g.add(std::move(b));
      c.q.bias = detail::slice_rows(g, fused, 0, {Axis{"out", ir_extent<Model<E>>()}});
      c.k.bias = detail::slice_rows(g, fused, 1, {Axis{"out", ir_extent<Model<E>>()}});
      c.v.bias = detail::slice_rows(g, fused, 2, {Axis{"out", ir_extent<Model<E>>()}});
    }
    std::tie(c.bias_k, c.bias_v) = detail::bias_kv_params<Opt, E>(g, prefix);
    return c;
  }

  /// x [Batch, Seq, Model<E>], key [Batch, Mem, Hidden<KDim>], value [Batch, Mem, ValueDim<VDim>]
  /// (either may be projected(heads): PyTorch's static_k / static_v).
  template <class X, class K, class V, class... M>
  auto operator()(const X& x, const K& key, const V& value, const M&... masks) const {
    Graph& g = *o.graph;
    auto split = [&](const auto& t) { return permute<Batch, Heads, Key, HeadDim>(split_model(t)); };
    auto qh = permute<Batch, Heads, Seq, HeadDim>(split_model(linear(x, q)));
    auto kh =
        detail::kv_heads<Opt, E>(g, key, [&](const auto& t) { return rename<Mem, Key>(linear(t, k)); }, split, bias_k);
    auto vh = detail::kv_heads<Opt, E>(
        g, value, [&](const auto& t) { return rename<Mem, Key>(linear(t, v)); }, split, bias_v);
    auto [out, weights] = attention(qh, kh, vh, detail::extend_over_extra_keys<Opt.extra_keys()>(masks)...);
    return std::pair{linear(merge<Heads, HeadDim, Model>(permute<Batch, Seq, Heads, HeadDim>(out)), o), weights};
  }

 private:
  auto split_model(const auto& t) const {
    if constexpr (is_dyn<H> || is_dyn<E>)
      return split<Model, Heads<H>, HeadDim<D>>(t, {heads, 0});
    else
      return split<Model, Heads<H>, HeadDim<D>>(t);
  }
};

/// Grouped-query attention: Hq query heads share Hkv key/value heads (Hq % Hkv == 0), each
/// key/value head serving a group of Hq / Hkv query heads. MQA is Hkv = 1.
template <int E, int Hq, int Hkv>
struct GroupedQueryAttention {
  static constexpr int D = E / Hq;
  static constexpr int G = Hkv > 0 && Hq % Hkv == 0 ? Hq / Hkv : 1;
  Linear<Model<E>, Model<E>> q;
  Linear<Model<E>, Proj<Hkv * D>> k, v;
  Linear<Model<E>, Model<E>> o;

  static auto make(Graph& g, const std::string& prefix = "", bool bias = true) {
    if constexpr (Hkv <= 0 || Hq % Hkv != 0) {
      return fail<fixed_string("grouped_query_attention: query heads (") + number<Hq>() +
                  ") must be a multiple of key/value heads (" + number<Hkv>() +
                  "); fix: choose a number of key/value heads that divides the query heads">();
    } else {
      return GroupedQueryAttention{linear_params<Model<E>, Model<E>>(g, prefix + "q_proj", bias),
                                   linear_params<Model<E>, Proj<Hkv * D>>(g, prefix + "k_proj", bias),
                                   linear_params<Model<E>, Proj<Hkv * D>>(g, prefix + "v_proj", bias),
                                   linear_params<Model<E>, Model<E>>(g, prefix + "o_proj", bias)};
    }
  }

  /// x [Batch, Seq, Model] -> {out [Batch, Seq, Model], weights [Batch, KvHeads, Group, Seq, Key]}
  template <class X, class... M>
  auto operator()(const X& x, const M&... masks) const {
    auto xs = expect_axes<"grouped_query_attention", Batch, Seq, Model>(x);
    auto qh =
        permute<Batch, KvHeads, Group, Seq, HeadDim>(split<Model, KvHeads<Hkv>, Group<G>, HeadDim<D>>(linear(xs, q)));
    auto kv = [](const auto& t) {
      return permute<Batch, KvHeads, Key, HeadDim>(split<Proj, KvHeads<Hkv>, HeadDim<D>>(rename<Seq, Key>(t)));
    };
    auto kh = kv(linear(xs, k));
    auto vh = kv(linear(xs, v));
    auto [out, weights] = attention(qh, kh, vh, masks...);
    auto heads = merge<KvHeads, Group, Heads>(permute<Batch, Seq, KvHeads, Group, HeadDim>(out));
    return std::pair{linear(merge<Heads, HeadDim, Model>(heads), o), weights};
  }
};

}  // namespace qkv::nn
