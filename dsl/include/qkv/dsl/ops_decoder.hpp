// qkv/dsl/ops_decoder.hpp — the ops today's decoder LLMs are made of, beside attention: RMSNorm,
// SiLU, rotary position embeddings (RoPE), token embeddings and argmax. Hugging Face Llama's
// conventions throughout (docs/semantics.md pins them).
//
//   auto h = rms_norm(x, norm);                          // x·rsqrt(mean(x²) + ε)·w over Model
//   auto q = rope<HeadDim, Seq>(q_heads, positions, {.theta = 500000.0});
//   auto x = embedding(embed, tokens);                   // [Batch, Seq] ids -> [Batch, Seq, Model]
//   auto next = argmax<Vocab>(logits);                   // [Batch, Seq] i64
//
// Checked here: RoPE over an axis that is not the features, or with positions of another axis
// (the positions of the keys applied to the queries), an odd feature count, an embedding
// indexed by floats, norms and tables sized unlike the features they meet.
#pragma once

#include <qkv/dsl/params.hpp>
#include <qkv/ir/rope.hpp>

namespace qkv {

/// x·sigmoid(x) (SiLU, "swish"), as torch.nn.functional.silu.
template <class T>
auto silu(const T& t) {
  if constexpr (any_poison<T>)
    return poison{};
  else {
    Graph& g = t.graph();
    return tensor<typename T::dtype, typename T::axis_list, trait::plain>(
        g, g.add(detail::unary_node(t, Op::silu, t.node().axes)));
  }
}

/// RMSNorm's learned gain `<prefix>.weight` [Over] and its ε (Llama's LlamaRMSNorm).
template <AxisType Over>
struct RmsNorm {
  Graph* graph = nullptr;
  int weight = -1;
  double eps = 1e-6;
  std::string prefix;
};

template <AxisType Over>
RmsNorm<Over> rms_norm_params(Graph& g, std::string prefix, double eps = 1e-6) {
  Node p;
  p.op = Op::param;
  p.name = prefix + ".weight";
  p.axes = {Axis{std::string(Over::name), ir_extent<Over>()}};
  const int w = g.add(std::move(p));
  return RmsNorm<Over>{&g, w, eps, std::move(prefix)};
}

/// rms_norm(x, norm): x / sqrt(mean over `Over` of x² + ε) · weight, accumulated in at least fp32.
template <class T, class Over>
auto rms_norm(const T& x, const RmsNorm<Over>& norm) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_axis_named<L, Over>) {
      return fail<fixed_string("rms_norm: x ") + axes_fs<L>() + " has no axis `" + Over::name_fs +
                  "`; fix: normalise over the feature axis">();
    } else if constexpr (find_named<L, Over>::is_static && Over::is_static &&
                         find_named<L, Over>::extent != Over::extent) {
      using X = find_named<L, Over>;
      return fail<fixed_string("rms_norm: `") + Over::name_fs + "` of x (" + number<X::extent>() +
                  ") must equal the width of the norm (" + number<Over::extent>() +
                  "); fix: size the norm like the features">();
    } else {
      Graph& g = x.graph();
      defer_equal(g, ir_axis(x.node(), Over::name).extent, ir_extent<Over>(), [](auto a, auto b) {
        return fixed_string("rms_norm: `") + Over::name_fs + "` of x (" + a + ") must equal the width of the norm (" +
               b + "); fix: size the norm like the features";
      });
      Node n;
      n.op = Op::rms_norm;
      n.inputs = std::vector<int>{x.id(), norm.weight};
      n.axes = x.node().axes;
      n.attr_axes = {std::string(Over::name)};
      n.scalar = norm.eps;
      n.name = norm.prefix;
      return detail::make<typename T::dtype, L, trait::plain>(g, std::move(n));
    }
  }
}

/// Llama 3's rescaling of the rotary frequencies (config.json's rope_scaling with
/// "rope_type": "llama3").
struct Llama3RopeScaling {
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
};

/// The rotary embedding's base and optional scaling (config.json's rope_theta, rope_scaling).
struct RopeConfig {
  double theta = 10000.0;
  std::optional<Llama3RopeScaling> llama3 = std::nullopt;
  [[nodiscard]] RopeAttrs attrs() const {
    RopeAttrs r;
    r.theta = theta;
    if (llama3) {
      r.llama3 = true;
      r.factor = llama3->factor;
      r.low_freq_factor = llama3->low_freq_factor;
      r.high_freq_factor = llama3->high_freq_factor;
      r.original_max_positions = llama3->original_max_position_embeddings;
    }
    return r;
  }
};

namespace detail {
template <class DT>
inline constexpr bool is_integer_dtype = std::is_same_v<DT, i32> || std::is_same_v<DT, i64>;
}  // namespace detail

/// rope<Features, Pos>(x, positions, config): rotate each pair (i, i + D/2) of the `Features`
/// axis (D even) by position·inv_freq[i] (Hugging Face Llama's rotate-half RoPE; qkv/ir/rope.hpp).
/// `positions` (i32 or i64) holds the position of every index of x's `Pos` axis, over `Pos` and
/// any of x's other axes (e.g. [Batch, Seq]): a decode step passes its own position. Positions
/// over an axis x lacks — the keys' positions for the queries — are a compile error.
template <template <auto> class Features, template <auto> class Pos, class T, class P>
auto rope(const T& x, const P& positions, const RopeConfig& config = {}) {
  if constexpr (any_poison<T, P>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    using LP = typename P::axis_list;
    constexpr auto features = family_name_fs<Features>;
    constexpr auto pos = family_name_fs<Pos>;
    if constexpr (!has_family<L, Features>) {
      return fail<fixed_string("rope: x ") + axes_fs<L>() + " has no axis `" + features +
                  "` to rotate; fix: apply rope to per-head queries and keys, over their features">();
    } else if constexpr (find_family<L, Features>::is_static && find_family<L, Features>::extent % 2 != 0) {
      return fail<fixed_string("rope: `") + features + "` (" + number<find_family<L, Features>::extent>() +
                  ") is odd; rotate-half pairs feature i with i + " + features +
                  "/2; fix: rope over an even number of features">();
    } else if constexpr (!has_family<L, Pos>) {
      return fail<fixed_string("rope: x ") + axes_fs<L>() + " has no position axis `" + pos + "`; fix: rope<" +
                  features + ", Seq>(queries) or rope<" + features + ", Key>(keys)">();
    } else if constexpr (!detail::is_integer_dtype<typename P::dtype>) {
      return fail<fixed_string("rope: positions ") + axes_fs<LP>() + " are " + P::dtype::name +
                  ", not token positions; fix: declare them i32 or i64">();
    } else if constexpr (!has_family<LP, Pos>) {
      return fail<fixed_string("rope: positions ") + axes_fs<LP>() + " have no axis `" + pos +
                  "`, so they are not the positions of the tokens along `" + pos + "`; fix: positions over `" + pos +
                  "` (e.g. [Batch, " + pos + "])">();
    } else if constexpr (constexpr auto i = detail::first_missing<L, LP>(); i != LP::size) {
      return fail<fixed_string("rope: positions ") + axes_fs<LP>() + " index `" + axis_at<LP, i>::name_fs +
                  "`, which x " + axes_fs<L>() +
                  " does not have (the positions of another sequence); fix: the positions of the tokens along `" + pos +
                  "`">();
    } else if constexpr (constexpr auto k = detail::first_shared_mismatch<L, LP>(); k != L::size) {
      using X = axis_at<L, k>;
      return fail<fixed_string("rope: `") + X::name_fs + "` of x (" + number<X::extent>() + ") must equal `" +
                  X::name_fs + "` of the positions (" + number<find_named<LP, X>::extent>() +
                  "); fix: one position per token">();
    } else {
      Graph& g = x.graph();
      detail::defer_shared<"rope", L>(g, x.node(), positions.node(),
                                      [](auto) { return fixed_string("one position per token"); });
      const Extent d = ir_axis(x.node(), find_family<L, Features>::name).extent;
      if (d.is_dynamic())
        g.require(Constraint{Constraint::Kind::divisible, d, Extent::fixed(2),
                             "rope: `" + std::string(features.view()) +
                                 "` ({a}) is odd; rotate-half pairs feature i with i + D/2; fix: rope over an even "
                                 "number of features"});
      Node n = detail::unary_node(x, Op::rope, x.node().axes);
      n.inputs.push_back(positions.id());
      n.attr_axes = {std::string(find_family<L, Features>::name), std::string(find_family<L, Pos>::name)};
      n.rope = config.attrs();
      return tensor<typename T::dtype, L, trait::plain>(g, g.add(std::move(n)));
    }
  }
}

/// A token embedding table `<prefix>.weight` [Rows, Features] (torch.nn.Embedding's layout).
template <AxisType Rows, AxisType Features>
struct Embedding {
  Graph* graph = nullptr;
  int weight = -1;
  std::string prefix;
};

template <AxisType Rows, AxisType Features>
Embedding<Rows, Features> embedding_params(Graph& g, std::string prefix) {
  const int w = detail::add_param(g, prefix + ".weight",
                                  {detail::ir_axis_of(Rows::name, Rows::is_static, Rows::extent),
                                   detail::ir_axis_of(Features::name, Features::is_static, Features::extent)});
  return Embedding<Rows, Features>{&g, w, std::move(prefix)};
}

/// The same table seen as a projection Features -> Rows (tied input and output embeddings:
/// logits = x·Eᵀ, as Hugging Face's tie_word_embeddings).
template <AxisType Rows, AxisType Features>
Linear<Features, Rows> tied_linear(const Embedding<Rows, Features>& e) {
  return Linear<Features, Rows>{e.graph, e.weight, -1, e.prefix};
}

/// embedding(table, ids): row ids[...] of the table for every id; the result has the ids' axes,
/// then `Features`. An id outside [0, Rows) is a run-time error naming it.
template <class Rows, class Features, class I>
auto embedding(const Embedding<Rows, Features>& table, const I& ids) {
  if constexpr (any_poison<I>) {
    return poison{};
  } else {
    using LI = typename I::axis_list;
    if constexpr (!detail::is_integer_dtype<typename I::dtype>) {
      return fail<fixed_string("embedding: ids ") + axes_fs<LI>() + " are " + I::dtype::name +
                  ", not token ids; fix: declare them i32 or i64">();
    } else if constexpr (has_axis_named<LI, Features> || has_axis_named<LI, Rows>) {
      return fail<fixed_string("embedding: ids ") + axes_fs<LI>() +
                  " already have an axis named like the table axis `" + Rows::name_fs + "` or `" + Features::name_fs +
                  "`; fix: ids over token axes (e.g. [Batch, Seq])">();
    } else {
      Graph& g = *table.graph;
      return tensor<f32, concat_axes<LI, axes<Features>>, trait::plain>(
          g, detail::add_embedding(g, table.weight, ids.id(), Rows::name,
                                   detail::ir_axis_of(Features::name, Features::is_static, Features::extent),
                                   table.prefix));
    }
  }
}

/// A run-time size fed by value: an i64 scalar input whose value is the extent of `A` (e.g. the
/// positions a KV cache holds before a step). Axes of extent `A<dyn>` elsewhere are that size.
template <template <auto> class A>
struct Size {
  Graph* graph = nullptr;
  int id = -1;
};

template <template <auto> class A>
Size<A> size_input(Graph& g, std::string name) {
  Node n;
  n.op = Op::input;
  n.name = std::move(name);
  n.dtype = DType::i64;
  n.dim = Extent::dynamic(std::string(family_name_fs<A>.view()));
  return {&g, g.add(std::move(n))};
}

/// cache_append<Slot, Seq, Key>(cache, rows, start): a KV cache's append, the way FlashAttention's
/// flash_attn_with_kvcache does it. `rows` — the cache's axes with `Seq` in place of `Slot` —
/// are written at positions [start, start + n) of the cache's `Slot` axis (its capacity).
/// Returns {cache', keys}: cache' the cache after the write (the cache's type), keys its first
/// start + n positions along `Key`, what the attention reads. A backend writes in place when
/// cache' is fed the cache's own buffer (DecoderSession does); the attention kernels read keys
/// out of the cache's rows, no copy. start + n beyond the capacity is a ShapeError at run time.
template <template <auto> class Slot, template <auto> class Seq, template <auto> class Key, class C, class R,
          template <auto> class S>
auto cache_append(const C& cache, const R& rows, const Size<S>& start) {
  using Pair = std::pair<poison, poison>;
  if constexpr (any_poison<C, R>) {
    return Pair{};
  } else {
    using LC = typename C::axis_list;
    using LR = typename R::axis_list;
    if constexpr (!has_family<LC, Slot>) {
      fail<fixed_string("cache_append: the cache ") + axes_fs<LC>() + " has no axis `" + family_name_fs<Slot> +
           "` of positions; fix: a cache [Batch, KvHeads, " + family_name_fs<Slot> + ", HeadDim]">();
      return Pair{};
    } else if constexpr (!has_family<LR, Seq>) {
      fail<fixed_string("cache_append: the rows ") + axes_fs<LR>() + " have no axis `" + family_name_fs<Seq> +
           "`; fix: append the step's keys or values along their positions">();
      return Pair{};
    } else if constexpr (!std::is_same_v<typename C::dtype, typename R::dtype>) {
      fail<fixed_string("cache_append: the cache is ") + C::dtype::name + " but the rows are " + R::dtype::name +
           "; fix: store the rows as the cache does">();
      return Pair{};
    } else if constexpr (!detail::same_names<detail::replace_t<LC, find_family<LC, Slot>, axes<find_family<LR, Seq>>>,
                                             LR>) {
      using Want = detail::replace_t<LC, find_family<LC, Slot>, axes<find_family<LR, Seq>>>;
      fail<fixed_string("cache_append: the rows are ") + axes_fs<LR>() + " but must be laid out as the cache " +
           axes_fs<LC>() + " with `" + family_name_fs<Seq> + "` for `" + family_name_fs<Slot> +
           "`; fix: " + permute_fix<Want>()>();
      return Pair{};
    } else {
      using A = find_family<LC, Slot>;
      using Out = tensor<typename C::dtype, LC, trait::plain>;
      using Keys = tensor<typename C::dtype, detail::replace_t<LC, A, axes<Key<dyn>>>, trait::plain>;
      Graph& g = cache.graph();
      const std::string slot(A::name), seq(find_family<LR, Seq>::name), key(family_name_fs<Key>.view());
      for (const auto& ra : rows.node().axes)
        if (ra.name != seq)
          defer_equal(g, ir_axis(cache.node(), ra.name).extent, ra.extent, [](auto sa, auto sb) {
            return fixed_string("cache_append: the rows and the cache differ off the positions (") + sa + " vs " + sb +
                   "); fix: append rows of the cache's batch, heads and head width";
          });
      Node u = detail::unary_node(cache, Op::update_slice, cache.node().axes);
      u.inputs.push_back(rows.id());
      u.inputs.push_back(start.id);
      u.attr_axes = {slot, seq};
      u.dim = Extent::dynamic(std::string(family_name_fs<S>.view()));
      const Out updated(g, g.add(std::move(u)));
      Node k = detail::unary_node(updated, Op::slice,
                                  detail::ir_replace(updated.node().axes, slot, {Axis{key, Extent::dynamic(key)}}));
      k.attr_axes = {slot, key};
      k.offset = 0;  // the first start + n positions (bound when start and the rows are)
      return std::pair{updated, Keys(g, g.add(std::move(k)))};
    }
  }
}

/// argmax<Over>(x): the index of the first largest entry along `Over` (a NaN counts as the
/// largest, as torch.argmax); the result has x's other axes, as i64.
template <template <auto> class Over, class T>
auto argmax(const T& t) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_family<L, Over>) {
      return fail<fixed_string("argmax: x ") + axes_fs<L>() + " has no axis `" + family_name_fs<Over> +
                  "`; fix: argmax over an axis of x">();
    } else {
      using X = find_family<L, Over>;
      Node n;
      n.op = Op::argmax;
      n.inputs = std::vector<int>{t.id()};
      for (const auto& a : t.node().axes)
        if (a.name != X::name) n.axes.push_back(a);
      n.attr_axes = {std::string(X::name)};
      return detail::make<i64, without<L, axes<X>>, trait::plain>(t.graph(), std::move(n));
    }
  }
}

}  // namespace qkv
