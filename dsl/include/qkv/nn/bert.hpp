// qkv/nn/bert.hpp — BERT (Hugging Face's BertModel), written with the DSL's ops, its parameters
// named as BertModel's state dict names them (a checkpoint of BertFor*'s `bert.` prefix and the
// legacy LayerNorm gamma/beta names are the checkpoint reader's business):
//
//   embeddings.{word,position,token_type}_embeddings.weight    [Vocab | Position | TokenType, Model]
//   embeddings.LayerNorm.{weight,bias}
//   encoder.layer.{i}.attention.self.{query,key,value}.{weight,bias}   [Model, Model] (torch.nn.Linear)
//   encoder.layer.{i}.attention.output.dense.*, .attention.output.LayerNorm.*
//   encoder.layer.{i}.intermediate.dense.* [Hidden, Model], .output.dense.* [Model, Hidden], .output.LayerNorm.*
//   pooler.dense.{weight,bias}                                  (absent in BertForMaskedLM's checkpoints)
//
// Embeddings: LayerNorm(word[ids] + position[0 .. L-1] + token_type[types]). One layer (post-norm):
// a = LayerNorm(x + dense(attention(x))); out = LayerNorm(a + dense(act(intermediate(a)))), with
// act the exact (erf) GELU by default; the attention: heads of head_dim, scores · head_dim^-½,
// the padding mask over the keys, softmax. The pooled output is tanh(dense(hidden[:, 0])): the
// [CLS] row.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <qkv/nn/gpt2.hpp>

namespace qkv::nn {

QKV_AXIS(TokenType);  // rows of the token-type (segment) table

/// The whole model's numbers (config.json's).
struct BertConfig {
  std::int64_t layers = 0, heads = 0, head_dim = 0;
  double eps = 1e-12;                            // layer_norm_eps
  HfActivation activation = HfActivation::gelu;  // hidden_act: gelu (erf), gelu_new, relu
};

template <auto E>
struct BertLayer {
  Linear<Model<E>, QProj<dyn>> query, key, value;
  Linear<QProj<dyn>, Model<E>> attention_out;
  LayerNorm<Model<E>> attention_norm;
  Linear<Model<E>, Hidden<dyn>> intermediate;
  Linear<Hidden<dyn>, Model<E>> output;
  LayerNorm<Model<E>> output_norm;
  std::int64_t heads = 0, head_dim = 0;
  HfActivation activation = HfActivation::gelu;

  static BertLayer make(Graph& g, const std::string& prefix, const BertConfig& cfg) {
    if (cfg.heads <= 0 || cfg.head_dim <= 0)
      throw std::invalid_argument("BertLayer: heads and head_dim must be positive");
    const std::string a = prefix + "attention.";
    return {linear_params<Model<E>, QProj<dyn>>(g, a + "self.query"),
            linear_params<Model<E>, QProj<dyn>>(g, a + "self.key"),
            linear_params<Model<E>, QProj<dyn>>(g, a + "self.value"),
            linear_params<QProj<dyn>, Model<E>>(g, a + "output.dense"),
            layer_norm_params<Model<E>>(g, a + "output.LayerNorm", cfg.eps),
            linear_params<Model<E>, Hidden<dyn>>(g, prefix + "intermediate.dense"),
            linear_params<Hidden<dyn>, Model<E>>(g, prefix + "output.dense"),
            layer_norm_params<Model<E>>(g, prefix + "output.LayerNorm", cfg.eps),
            cfg.heads,
            cfg.head_dim,
            cfg.activation};
  }

  /// x [Batch, Seq, Model] -> [Batch, Seq, Model]; masks (a KeyPaddingMask<Batch, Key>, ...)
  /// apply to the scaled scores [Batch, Heads, Seq, Key].
  template <class X, class... M>
  auto operator()(const X& x, const M&... masks) const {
    using Out = tensor<typename X::dtype, typename X::axis_list, trait::plain>;
    auto xs = expect_axes<"bert_layer", Batch, Seq, Model>(x);
    auto heads_of = [&](const auto& w) {
      return permute<Batch, Heads, Seq, HeadDim>(
          split<QProj, Heads<dyn>, HeadDim<dyn>>(linear(xs, w), {heads, head_dim}));
    };
    auto q = heads_of(query);
    auto k = rename<Seq, Key>(heads_of(key));
    auto v = rename<Seq, Key>(heads_of(value));
    auto scores = detail::apply_masks(scaled(contract<HeadDim>(q, k)), masks...);
    auto context = contract<Key>(softmax<Key>(scores), v);
    auto merged = merge<Heads, HeadDim, QProj>(permute<Batch, Seq, Heads, HeadDim>(context));
    auto a = Out(layer_norm(add(x, linear(merged, attention_out)), attention_norm));
    auto h = linear(a, intermediate);
    return Out(layer_norm(add(a, linear(activated(h, activation), output)), output_norm));
  }
};

/// BertModel: embeddings -> layers -> {last hidden state, pooled [CLS] row}.
template <auto E>
struct BertModel {
  Embedding<Vocab<dyn>, Model<E>> word_embeddings;
  Embedding<Position<dyn>, Model<E>> position_embeddings;
  Embedding<TokenType<dyn>, Model<E>> token_type_embeddings;
  LayerNorm<Model<E>> embeddings_norm;
  std::vector<BertLayer<E>> layers;
  std::optional<Linear<Model<E>, Model<E>>> pooler;

  static BertModel make(Graph& g, const BertConfig& cfg, bool pooler) {
    BertModel m{embedding_params<Vocab<dyn>, Model<E>>(g, "embeddings.word_embeddings"),
                embedding_params<Position<dyn>, Model<E>>(g, "embeddings.position_embeddings"),
                embedding_params<TokenType<dyn>, Model<E>>(g, "embeddings.token_type_embeddings"),
                layer_norm_params<Model<E>>(g, "embeddings.LayerNorm", cfg.eps),
                {},
                {}};
    for (std::int64_t i = 0; i < cfg.layers; ++i)
      m.layers.push_back(BertLayer<E>::make(g, "encoder.layer." + std::to_string(i) + ".", cfg));
    if (pooler) m.pooler = linear_params<Model<E>, Model<E>>(g, "pooler.dense");
    return m;
  }

  using State = Tensor<f32, Batch<dyn>, Seq<dyn>, Model<E>>;

  /// The last hidden state [Batch, Seq, Model] of token ids and token types [Batch, Seq]
  /// (integers); positions are 0 .. Seq − 1.
  template <class T, class Ty, class... M>
  State operator()(const T& ids, const Ty& types, const M&... masks) const {
    // In statements: one node order whatever the compiler (argument order is unspecified).
    auto positions = embedding(position_embeddings, arange<Seq>(ids));
    auto words = embedding(word_embeddings, ids);
    auto segments = embedding(token_type_embeddings, types);
    State x = State(layer_norm(add(add(words, segments), positions), embeddings_norm));
    for (const auto& layer : layers) x = State(layer(x, masks...));
    return x;
  }

  /// The pooled output [Batch, Model]: tanh(pooler(hidden[:, 0])).
  auto pooled(const State& hidden) const {
    if (!pooler) throw std::invalid_argument("BertModel::pooled: the model was made without a pooler");
    return tanh(linear(select<Seq, 0>(hidden), *pooler));
  }
};

}  // namespace qkv::nn
