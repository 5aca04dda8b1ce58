// qkv/nn/llama.hpp — the decoder blocks of Llama and its relatives (Qwen2, Mistral), written
// with the DSL's ops, parameters named as Hugging Face's checkpoints name them:
//
//   model.embed_tokens.weight                     [Vocab, Model]
//   model.layers.{i}.input_layernorm.weight       [Model]
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.*   q [QProj, Model], k/v [KvProj, Model], o [Model, QProj]
//   model.layers.{i}.post_attention_layernorm.weight
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight
//   model.norm.weight, lm_head.weight             (lm_head absent when the embeddings are tied)
//
// One layer:  h = x + attn(rms_norm(x));  out = h + mlp(rms_norm(h)),  mlp(x) = down(silu(gate(x)) · up(x)).
// Attention:  q, k rotated by RoPE at the tokens' positions; query heads grouped over the key/value
// heads (GQA: [KvHeads, Group]); causal, bottom-right aligned (a decode step's queries are the
// last positions of the keys); optionally a sliding window of W keys (i − W < j ≤ i, Mistral's).
// Head counts and the head width come from the config at make(): wrong ones are a ShapeError
// naming the axis when the weights are bound.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <qkv/nn/attention.hpp>

namespace qkv::nn {

QKV_AXIS(Vocab);   // token ids / logits
QKV_AXIS(QProj);   // the query projection's output, query heads x head width
QKV_AXIS(KvProj);  // the key / value projections' output, key/value heads x head width
QKV_AXIS(Past);    // the cached positions before a step's tokens (a run-time size)
QKV_AXIS(Slot);    // the positions a KV cache can hold (its capacity)

namespace detail {
/// The causal attention of a decoder's layer (Llama's, GPT-2's): rotated or plain queries qh
/// [Batch, Seq, KvHeads, Group, HeadDim] over keys kh and values vh [Batch, Key, KvHeads,
/// HeadDim] (the cache's and the step's), bottom-right aligned (a step's queries are the last
/// positions of the keys), a sliding window of `window` keys when it is > 0 (i − W < j ≤ i),
/// then `masks`; the heads merged into QProj and projected by o.
template <class Q, class K, class V, class O, class... M>
auto grouped_causal_attention(const Q& qh, const K& kh, const V& vh, std::int64_t window, const O& o,
                              const M&... masks) {
  auto qp = permute<Batch, KvHeads, Group, Seq, HeadDim>(qh);
  auto kp = permute<Batch, KvHeads, Key, HeadDim>(kh);
  auto vp = permute<Batch, KvHeads, Key, HeadDim>(vh);
  auto windowed = scores_fn([window](auto s) {
    if (window <= 0) return s;
    return decltype(s)(s.graph(), modded(s, mods::sliding_window(window - 1, 0, bottom_right)).id());
  });
  auto scores = apply_masks(scaled(contract<HeadDim>(qp, kp)), causal_bottom_right, windowed, masks...);
  auto out = contract<Key>(softmax<Key>(scores), vp);
  auto heads = merge<KvHeads, Group, Heads>(permute<Batch, Seq, KvHeads, Group, HeadDim>(out));
  return linear(merge<Heads, HeadDim, QProj>(heads), o);
}

/// A step's keys and values [Batch, Seq, KvHeads, HeadDim] written into the caches [Batch,
/// KvHeads, Slot, HeadDim] after their `past` filled positions (cache_append). Returns {cache_k',
/// cache_v', keys, values}: the caches after the write, and the Key = Past + Seq rows the
/// attention reads from them in place.
template <class CK, class CV, class KS, class VS>
auto append_to_cache(const CK& cache_k, const CV& cache_v, const KS& keys, const VS& values, const Size<Past>& past) {
  auto step = [](const auto& t) { return permute<Batch, KvHeads, Seq, HeadDim>(t); };
  auto [ck, kh] = cache_append<Slot, Seq, Key>(cache_k, step(keys), past);
  auto [cv, vh] = cache_append<Slot, Seq, Key>(cache_v, step(values), past);
  return std::tuple{ck, cv, kh, vh};
}

/// A decoder's layers run against their KV caches: layer i as step(layers[i], x, cache_k,
/// cache_v) -> {y, cache_k', cache_v'}. Returns x after the last layer and the caches after the
/// step; `who` names the model when the caches do not match the layers.
template <class X, class L, class C, class Step>
std::pair<X, std::vector<std::pair<C, C>>> cached_layers(const char* who, const std::vector<L>& layers, X x,
                                                         const std::vector<std::pair<C, C>>& caches, Step&& step) {
  if (caches.size() != layers.size())
    throw std::invalid_argument(std::string(who) + "::cached: " + std::to_string(caches.size()) +
                                " cache entries for " + std::to_string(layers.size()) + " layers");
  std::vector<std::pair<C, C>> updated;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    auto [y, keys, values] = step(layers[i], x, caches[i].first, caches[i].second);
    x = X(y);
    updated.emplace_back(keys, values);
  }
  return {x, std::move(updated)};
}
}  // namespace detail

/// Which positions of a step a decoder's `cached` computes logits for: every one (scoring a
/// text, checking a prefill against the whole model) or only the last (generating: the next
/// token's; the LM head — vocab × width multiply-adds per position, often the largest matrix of
/// the model — then runs on one row of the prefill instead of all of them).
enum class StepLogits { every_position, last_position };

/// How the rows of a step's batch sit in the KV cache (declare_cached_step): each from position 0,
/// or left-padded to one length.
enum class StepRows { aligned, left_padded };

namespace detail {
/// x [Batch, Seq, Model] as the LM head reads it for W: all of it, or its last position.
template <StepLogits W, class X>
auto logit_rows(const X& x) {
  if constexpr (W == StepLogits::last_position)
    return last<Seq>(x);
  else
    return x;
}
}  // namespace detail

/// What a Llama-family attention layer needs beside its weights (config.json's numbers).
struct LlamaAttentionConfig {
  std::int64_t heads = 0, kv_heads = 0, head_dim = 0;
  RopeConfig rope{};
  bool qkv_bias = false;                         // Qwen2 (always), Llama's attention_bias
  bool o_bias = false;                           // Llama's attention_bias (never Qwen2)
  std::optional<std::int64_t> sliding_window{};  // W: query i sees keys i − W < j ≤ i
};

template <auto E>
struct LlamaAttention {
  Linear<Model<E>, QProj<dyn>> q;
  Linear<Model<E>, KvProj<dyn>> k, v;
  Linear<QProj<dyn>, Model<E>> o;
  LlamaAttentionConfig cfg;

  static LlamaAttention make(Graph& g, const std::string& prefix, const LlamaAttentionConfig& cfg) {
    if (cfg.heads <= 0 || cfg.kv_heads <= 0 || cfg.head_dim <= 0)
      throw std::invalid_argument("LlamaAttention: heads, kv_heads and head_dim must be positive");
    if (cfg.heads % cfg.kv_heads != 0)
      throw ShapeError("LlamaAttention: query heads (" + std::to_string(cfg.heads) +
                       ") must be a multiple of key/value heads (" + std::to_string(cfg.kv_heads) +
                       "); fix: num_key_value_heads must divide num_attention_heads");
    if (cfg.sliding_window && *cfg.sliding_window <= 0)
      throw std::invalid_argument("LlamaAttention: the sliding window must be positive");
    return {linear_params<Model<E>, QProj<dyn>>(g, prefix + "q_proj", cfg.qkv_bias),
            linear_params<Model<E>, KvProj<dyn>>(g, prefix + "k_proj", cfg.qkv_bias),
            linear_params<Model<E>, KvProj<dyn>>(g, prefix + "v_proj", cfg.qkv_bias),
            linear_params<QProj<dyn>, Model<E>>(g, prefix + "o_proj", cfg.o_bias), cfg};
  }

  /// The rotated queries of x: [Batch, Seq, Model] -> [Batch, Seq, KvHeads, Group, HeadDim].
  template <class X, class P>
  auto queries(const X& x, const P& positions) const {
    return rope<HeadDim, Seq>(split<QProj, KvHeads<dyn>, Group<dyn>, HeadDim<dyn>>(
                                  linear(x, q), {cfg.kv_heads, cfg.heads / cfg.kv_heads, cfg.head_dim}),
                              positions, cfg.rope);
  }

  /// The rotated keys (or, unrotated, the values) of x: [Batch, Seq, Model] -> [Batch, Seq, KvHeads, HeadDim].
  template <class X>
  auto kv_heads_of(const X& x, const Linear<Model<E>, KvProj<dyn>>& w) const {
    return split<KvProj, KvHeads<dyn>, HeadDim<dyn>>(linear(x, w), {cfg.kv_heads, cfg.head_dim});
  }

  /// x [Batch, Seq, Model], positions [Batch, Seq] (i32/i64) -> [Batch, Seq, Model]. Extra
  /// masks (a key-padding mask, ...) apply after the causal mask and the window.
  template <class X, class P, class... M>
  auto operator()(const X& x, const P& positions, const M&... masks) const {
    auto xs = expect_axes<"llama_attention", Batch, Seq, Model>(x);
    auto qh = queries(xs, positions);
    auto kh = rename<Seq, Key>(rope<HeadDim, Seq>(kv_heads_of(xs, k), positions, cfg.rope));
    auto vh = rename<Seq, Key>(kv_heads_of(xs, v));
    return attend(qh, kh, vh, masks...);
  }

  /// With a KV cache: cache_k (rotated keys) and cache_v [Batch, KvHeads, Slot, HeadDim] hold
  /// the `past` positions before x's in their first rows. x's keys and values are written after
  /// them (cache_append) and the attention reads Key = Past + Seq rows of the caches in place.
  /// Returns {out, cache_k', cache_v'}: the caches after the write. Extra masks (over the
  /// cache's positions: mods::keys_from for a left-padded batch) apply after the causal one.
  template <class X, class P, class CK, class CV, class... M>
  auto cached(const X& x, const P& positions, const CK& cache_k, const CV& cache_v, const Size<Past>& past,
              const M&... masks) const {
    auto xs = expect_axes<"llama_attention", Batch, Seq, Model>(x);
    auto [ck, cv, kh, vh] = detail::append_to_cache(
        cache_k, cache_v, rope<HeadDim, Seq>(kv_heads_of(xs, k), positions, cfg.rope), kv_heads_of(xs, v), past);
    return std::tuple{attend(queries(xs, positions), kh, vh, masks...), ck, cv};
  }

  /// The attention of rotated queries qh [Batch, Seq, KvHeads, Group, HeadDim] over keys kh and
  /// values vh [Batch, Key, KvHeads, HeadDim] (the cache's and the step's), through o_proj.
  template <class Q, class K, class V, class... M>
  auto attend(const Q& qh, const K& kh, const V& vh, const M&... masks) const {
    return detail::grouped_causal_attention(qh, kh, vh, cfg.sliding_window.value_or(0), o, masks...);
  }
};

/// Llama's MLP: down(silu(gate(x)) · up(x)), no biases.
template <auto E>
struct SwiGluMlp {
  Linear<Model<E>, Hidden<dyn>> gate, up;
  Linear<Hidden<dyn>, Model<E>> down;

  static SwiGluMlp make(Graph& g, const std::string& prefix) {
    return {linear_params<Model<E>, Hidden<dyn>>(g, prefix + "gate_proj", false),
            linear_params<Model<E>, Hidden<dyn>>(g, prefix + "up_proj", false),
            linear_params<Hidden<dyn>, Model<E>>(g, prefix + "down_proj", false)};
  }
  template <class X>
  auto operator()(const X& x) const {
    auto g = silu(linear(x, gate));
    auto u = linear(x, up);
    return linear(mul(g, u), down);
  }
};

template <auto E>
struct LlamaDecoderLayer {
  RmsNorm<Model<E>> input_layernorm, post_attention_layernorm;
  LlamaAttention<E> self_attn;
  SwiGluMlp<E> mlp;

  static LlamaDecoderLayer make(Graph& g, const std::string& prefix, const LlamaAttentionConfig& cfg, double eps) {
    return {rms_norm_params<Model<E>>(g, prefix + "input_layernorm", eps),
            rms_norm_params<Model<E>>(g, prefix + "post_attention_layernorm", eps),
            LlamaAttention<E>::make(g, prefix + "self_attn.", cfg), SwiGluMlp<E>::make(g, prefix + "mlp.")};
  }

  /// x [Batch, Seq, Model], positions [Batch, Seq] -> [Batch, Seq, Model].
  template <class X, class P, class... M>
  auto operator()(const X& x, const P& positions, const M&... masks) const {
    return residuals(x, self_attn(rms_norm(x, input_layernorm), positions, masks...));
  }

  /// With a KV cache (LlamaAttention::cached): {out, cache_k', cache_v'}.
  template <class X, class P, class CK, class CV, class... M>
  auto cached(const X& x, const P& positions, const CK& cache_k, const CV& cache_v, const Size<Past>& past,
              const M&... masks) const {
    auto [a, keys, values] =
        self_attn.cached(rms_norm(x, input_layernorm), positions, cache_k, cache_v, past, masks...);
    return std::tuple{residuals(x, a), keys, values};
  }

 private:
  /// h = x + attention, then h + mlp(norm(h)).
  template <class X, class A>
  auto residuals(const X& x, const A& attention) const {
    using Out = tensor<typename X::dtype, typename X::axis_list, trait::plain>;
    auto h = Out(add(x, attention));
    return Out(add(h, mlp(rms_norm(h, post_attention_layernorm))));
  }
};

/// The whole model's numbers (config.json's).
struct LlamaConfig {
  std::int64_t layers = 0;
  LlamaAttentionConfig attention{};  // sliding_window: the window of the layers that have one
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  /// The layers with a sliding window (Qwen2: from max_window_layers on; Mistral: all); empty: all
  /// when attention.sliding_window is set.
  std::vector<bool> windowed{};
};

/// embedding -> N decoder layers -> RMSNorm -> lm_head (Hugging Face's *ForCausalLM).
template <auto E>
struct CausalLm {
  Embedding<Vocab<dyn>, Model<E>> embed_tokens;
  std::vector<LlamaDecoderLayer<E>> layers;
  RmsNorm<Model<E>> norm;
  Linear<Model<E>, Vocab<dyn>> lm_head;

  static CausalLm make(Graph& g, const LlamaConfig& cfg) {
    CausalLm m{embedding_params<Vocab<dyn>, Model<E>>(g, "model.embed_tokens"), {}, {}, {}};
    for (std::int64_t i = 0; i < cfg.layers; ++i) {
      LlamaAttentionConfig a = cfg.attention;
      const auto at = static_cast<std::size_t>(i);
      if (!cfg.windowed.empty() && (at >= cfg.windowed.size() || !cfg.windowed[at])) a.sliding_window.reset();
      m.layers.push_back(LlamaDecoderLayer<E>::make(g, "model.layers." + std::to_string(i) + ".", a, cfg.rms_norm_eps));
    }
    m.norm = rms_norm_params<Model<E>>(g, "model.norm", cfg.rms_norm_eps);
    m.lm_head = cfg.tie_word_embeddings ? tied_linear(m.embed_tokens)
                                        : linear_params<Model<E>, Vocab<dyn>>(g, "lm_head", false);
    return m;
  }

  /// tokens and positions [Batch, Seq] (i32/i64) -> logits [Batch, Seq, Vocab].
  template <class T, class P, class... M>
  auto operator()(const T& tokens, const P& positions, const M&... masks) const {
    using X = Tensor<f32, Batch<dyn>, Seq<dyn>, Model<E>>;
    X x = X(embedding(embed_tokens, tokens));
    for (const auto& layer : layers) x = X(layer(x, positions, masks...));
    return linear(rms_norm(x, norm), lm_head);
  }

  /// A step against a KV cache: tokens and positions [Batch, Seq]; caches[i] = {keys, values}
  /// of layer i [Batch, KvHeads, Slot, HeadDim], whose first `past` positions are filled.
  /// Returns {logits, caches'}: the caches with this step's keys and values written after them;
  /// the logits [Batch, Seq, Vocab], or [Batch, Seq = 1, Vocab] with StepLogits::last_position.
  /// Extra masks apply in every layer (LlamaAttention::cached).
  template <StepLogits W = StepLogits::every_position, class T, class P, class C, class... M>
  auto cached(const T& tokens, const P& positions, const std::vector<std::pair<C, C>>& caches, const Size<Past>& past,
              const M&... masks) const {
    using X = Tensor<f32, Batch<dyn>, Seq<dyn>, Model<E>>;
    auto [x, updated] = detail::cached_layers("CausalLm", layers, X(embedding(embed_tokens, tokens)), caches,
                                              [&](const auto& layer, const X& y, const C& ck, const C& cv) {
                                                return layer.cached(y, positions, ck, cv, past, masks...);
                                              });
    return std::pair{linear(rms_norm(detail::logit_rows<W>(x), norm), lm_head), std::move(updated)};
  }
};

/// A layer's KV cache as the step graph takes it: [Batch, KvHeads, Slot, HeadDim].
using KvCache = Tensor<f32, Batch<dyn>, KvHeads<dyn>, Slot<dyn>, HeadDim<dyn>>;

/// Declares in g the step graph qkv::DecoderSession runs for `model` (a CausalLm, a Gpt2LmHead:
/// a decoder with `layers` and `cached(tokens, positions, caches, past)`; its parameters are in
/// g): inputs `tokens` and `positions` [Batch, Seq] (i64), the size `past_length` (Past: the
/// positions the caches hold), `cache_k.{i}` / `cache_v.{i}` (KvCache); outputs `logits` and
/// `present_k.{i}` / `present_v.{i}`, the caches after the step (fed the caches' own buffers,
/// the CPU backend writes only the step's rows). W: logits for every position of the step, or
/// only for the last ([Batch, 1, Vocab]: what generating reads). R: every row of the batch holds
/// its sequence from cache position 0, or (left_padded) the input `first_key` [Batch] (i64) says
/// where row b's begins: the positions before it are padding no query sees (mods::keys_from), so
/// that one step serves sequences of different lengths.
template <StepLogits W = StepLogits::every_position, StepRows R = StepRows::aligned, class Decoder>
void declare_cached_step(Graph& g, const Decoder& model) {
  auto tokens = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "tokens");
  auto positions = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "positions");
  const auto past = size_input<Past>(g, "past_length");
  std::vector<std::pair<KvCache, KvCache>> caches;
  for (std::size_t i = 0; i < model.layers.size(); ++i)
    caches.emplace_back(input<KvCache>(g, "cache_k." + std::to_string(i)),
                        input<KvCache>(g, "cache_v." + std::to_string(i)));
  auto [logits, present] = [&] {
    if constexpr (R == StepRows::left_padded)
      return model.template cached<W>(tokens, positions, caches, past,
                                      mods::keys_from(input<Tensor<i64, Batch<dyn>>>(g, "first_key")));
    else
      return model.template cached<W>(tokens, positions, caches, past);
  }();
  output(logits, "logits");
  for (std::size_t i = 0; i < present.size(); ++i) {
    output(present[i].first, "present_k." + std::to_string(i));
    output(present[i].second, "present_v." + std::to_string(i));
  }
}

}  // namespace qkv::nn
