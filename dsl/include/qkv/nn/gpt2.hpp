// qkv/nn/gpt2.hpp — GPT-2 (Hugging Face's GPT2LMHeadModel), written with the DSL's ops, its
// parameters named as the checkpoints on the Hub name them (the `transformer.` prefix that
// save_pretrained adds is the checkpoint reader's business):
//
//   wte.weight [Vocab, Model], wpe.weight [Position, Model]    token and learned position embeddings
//   h.{i}.ln_1.{weight,bias}, h.{i}.ln_2.{weight,bias}           LayerNorms (with a bias, unlike Llama's RMSNorm)
//   h.{i}.attn.c_attn.{weight,bias}   [Model, 3·Model]           q, k and v in one Conv1D ([in, out] weights)
//   h.{i}.attn.c_proj.{weight,bias}   [Model, Model]
//   h.{i}.mlp.c_fc.{weight,bias}      [Model, Hidden], h.{i}.mlp.c_proj [Hidden, Model]
//   ln_f.{weight,bias}; lm_head.weight only when the head is not tied to wte (it is by default)
//
// One block:  h = x + c_proj(attn(ln_1(x)));  out = h + mlp(ln_2(h)),  mlp(x) = c_proj(act(c_fc(x)))
// with act gelu_new (GELU's tanh form) by default. Attention: every head its own key/value head,
// causal, scores · head_dim^-½ (scale_attn_weights). The model: wte[tokens] + wpe[positions] ->
// blocks -> ln_f -> logits through wte (tied). It shares Llama's attention core and KV cache
// layout (nn/llama.hpp), so qkv::DecoderSession and the CLI's `generate` run it unchanged.
#pragma once

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <qkv/nn/llama.hpp>

namespace qkv::nn {

QKV_AXIS(QkvProj);   // GPT-2's c_attn output: q, k and v side by side (3 x Model)
QKV_AXIS(Position);  // rows of the learned position table (n_positions)

/// The MLP activations Hugging Face configs name (GPT-2's activation_function, BERT's hidden_act).
enum class HfActivation {
  gelu_tanh,  // gelu_new, gelu_pytorch_tanh: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
  gelu,       // the exact (erf) GELU
  relu,
};

/// act(x) for the activations GPT-2's and BERT's configs name.
template <class X>
X activated(const X& x, HfActivation act) {
  switch (act) {
    case HfActivation::gelu_tanh:
      return X(gelu_tanh(x));
    case HfActivation::gelu:
      return X(gelu(x));
    case HfActivation::relu:
      return X(relu(x));
  }
  throw std::invalid_argument("activated: unknown activation");
}

/// The whole model's numbers (config.json's n_layer, n_head, layer_norm_epsilon, ...).
struct Gpt2Config {
  std::int64_t layers = 0, heads = 0, head_dim = 0;
  double eps = 1e-5;
  HfActivation activation = HfActivation::gelu_tanh;
  bool tie_word_embeddings = true;
};

template <auto E>
struct Gpt2Attention {
  Linear<Model<E>, QkvProj<dyn>> c_attn;
  Linear<QProj<dyn>, Model<E>> c_proj;
  std::int64_t heads = 0, head_dim = 0;

  static Gpt2Attention make(Graph& g, const std::string& prefix, const Gpt2Config& cfg) {
    if (cfg.heads <= 0 || cfg.head_dim <= 0)
      throw std::invalid_argument("Gpt2Attention: heads and head_dim must be positive");
    return {conv1d_params<Model<E>, QkvProj<dyn>>(g, prefix + "c_attn"),
            conv1d_params<QProj<dyn>, Model<E>>(g, prefix + "c_proj"), cfg.heads, cfg.head_dim};
  }

  /// x [Batch, Seq, Model] -> {queries [Batch, Seq, KvHeads, Group = 1, HeadDim], keys, values
  /// [Batch, Seq, KvHeads, HeadDim]}: c_attn's output cut in three, each split into the heads.
  template <class X>
  auto projections(const X& x) const {
    auto [q, k, v] = chunk<QkvProj, 3, QProj>(linear(expect_axes<"gpt2_attention", Batch, Seq, Model>(x), c_attn));
    auto heads_of = [&](const auto& t) { return split<QProj, KvHeads<dyn>, HeadDim<dyn>>(t, {heads, head_dim}); };
    return std::tuple{split<QProj, KvHeads<dyn>, Group<dyn>, HeadDim<dyn>>(q, {heads, 1, head_dim}), heads_of(k),
                      heads_of(v)};
  }

  /// x [Batch, Seq, Model] -> [Batch, Seq, Model]; extra masks apply after the causal one.
  template <class X, class... M>
  auto operator()(const X& x, const M&... masks) const {
    auto [qh, kh, vh] = projections(x);
    return detail::grouped_causal_attention(qh, rename<Seq, Key>(kh), rename<Seq, Key>(vh), 0, c_proj, masks...);
  }

  /// With a KV cache [Batch, KvHeads, Slot, HeadDim] holding `past` positions (as
  /// LlamaAttention::cached): {out, cache_k', cache_v'}.
  template <class X, class CK, class CV, class... M>
  auto cached(const X& x, const CK& cache_k, const CV& cache_v, const Size<Past>& past, const M&... masks) const {
    auto [qh, keys, values] = projections(x);
    auto [ck, cv, kh, vh] = detail::append_to_cache(cache_k, cache_v, keys, values, past);
    return std::tuple{detail::grouped_causal_attention(qh, kh, vh, 0, c_proj, masks...), ck, cv};
  }
};

template <auto E>
struct Gpt2Mlp {
  Linear<Model<E>, Hidden<dyn>> c_fc;
  Linear<Hidden<dyn>, Model<E>> c_proj;
  HfActivation activation = HfActivation::gelu_tanh;

  static Gpt2Mlp make(Graph& g, const std::string& prefix, HfActivation activation) {
    return {conv1d_params<Model<E>, Hidden<dyn>>(g, prefix + "c_fc"),
            conv1d_params<Hidden<dyn>, Model<E>>(g, prefix + "c_proj"), activation};
  }
  template <class X>
  auto operator()(const X& x) const {
    return linear(activated(linear(x, c_fc), activation), c_proj);
  }
};

template <auto E>
struct Gpt2Block {
  LayerNorm<Model<E>> ln_1, ln_2;
  Gpt2Attention<E> attn;
  Gpt2Mlp<E> mlp;

  static Gpt2Block make(Graph& g, const std::string& prefix, const Gpt2Config& cfg) {
    return {layer_norm_params<Model<E>>(g, prefix + "ln_1", cfg.eps),
            layer_norm_params<Model<E>>(g, prefix + "ln_2", cfg.eps), Gpt2Attention<E>::make(g, prefix + "attn.", cfg),
            Gpt2Mlp<E>::make(g, prefix + "mlp.", cfg.activation)};
  }

  /// x [Batch, Seq, Model] -> [Batch, Seq, Model].
  template <class X, class... M>
  auto operator()(const X& x, const M&... masks) const {
    return residuals(x, attn(layer_norm(x, ln_1), masks...));
  }

  /// With a KV cache (Gpt2Attention::cached): {out, cache_k', cache_v'}.
  template <class X, class CK, class CV, class... M>
  auto cached(const X& x, const CK& cache_k, const CV& cache_v, const Size<Past>& past, const M&... masks) const {
    auto [a, keys, values] = attn.cached(layer_norm(x, ln_1), cache_k, cache_v, past, masks...);
    return std::tuple{residuals(x, a), keys, values};
  }

 private:
  template <class X, class A>
  auto residuals(const X& x, const A& attention) const {
    using Out = tensor<typename X::dtype, typename X::axis_list, trait::plain>;
    auto h = Out(add(x, attention));
    return Out(add(h, mlp(layer_norm(h, ln_2))));
  }
};

/// GPT2LMHeadModel: wte[tokens] + wpe[positions] -> blocks -> ln_f -> lm_head (wte when tied).
template <auto E>
struct Gpt2LmHead {
  Embedding<Vocab<dyn>, Model<E>> wte;
  Embedding<Position<dyn>, Model<E>> wpe;
  std::vector<Gpt2Block<E>> layers;
  LayerNorm<Model<E>> ln_f;
  Linear<Model<E>, Vocab<dyn>> lm_head;

  static Gpt2LmHead make(Graph& g, const Gpt2Config& cfg) {
    Gpt2LmHead m{embedding_params<Vocab<dyn>, Model<E>>(g, "wte"),
                 embedding_params<Position<dyn>, Model<E>>(g, "wpe"),
                 {},
                 {},
                 {}};
    for (std::int64_t i = 0; i < cfg.layers; ++i)
      m.layers.push_back(Gpt2Block<E>::make(g, "h." + std::to_string(i) + ".", cfg));
    m.ln_f = layer_norm_params<Model<E>>(g, "ln_f", cfg.eps);
    m.lm_head = cfg.tie_word_embeddings ? tied_linear(m.wte) : linear_params<Model<E>, Vocab<dyn>>(g, "lm_head", false);
    return m;
  }

  /// tokens and positions [Batch, Seq] (i32/i64) -> logits [Batch, Seq, Vocab].
  template <class T, class P, class... M>
  auto operator()(const T& tokens, const P& positions, const M&... masks) const {
    X x = embed(tokens, positions);
    for (const auto& layer : layers) x = X(layer(x, masks...));
    return linear(layer_norm(x, ln_f), lm_head);
  }

  /// A step against a KV cache, as CausalLm::cached: {logits, caches'}.
  template <StepLogits W = StepLogits::every_position, class T, class P, class C, class... M>
  auto cached(const T& tokens, const P& positions, const std::vector<std::pair<C, C>>& caches, const Size<Past>& past,
              const M&... masks) const {
    auto [x, updated] = detail::cached_layers("Gpt2LmHead", layers, embed(tokens, positions), caches,
                                              [&](const auto& layer, const X& y, const C& ck, const C& cv) {
                                                return layer.cached(y, ck, cv, past, masks...);
                                              });
    return std::pair{linear(layer_norm(detail::logit_rows<W>(x), ln_f), lm_head), std::move(updated)};
  }

 private:
  using X = Tensor<f32, Batch<dyn>, Seq<dyn>, Model<E>>;
  template <class T, class P>
  X embed(const T& tokens, const P& positions) const {
    auto words = embedding(wte, tokens);  // in statements: one node order whatever the compiler
    auto places = embedding(wpe, positions);
    return X(add(words, places));
  }
};

}  // namespace qkv::nn
