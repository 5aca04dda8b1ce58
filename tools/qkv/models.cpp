#include "models.hpp"

#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/dsl/train.hpp>
#include <qkv/qkv.hpp>

namespace qkv::cli {

using namespace qkv::nn;

namespace {

using QueryKeyBias = Tensor<f32, Seq<dyn>, Key<dyn>>;
using PerHeadBias = Tensor<f32, Batch<dyn>, Heads<dyn>, Seq<dyn>, Key<dyn>>;

/// Calls f with the masks the model asks for, as DSL arguments (declaring their inputs). With
/// AllowCausal false the causal variants are not instantiated (the caller rejected --causal);
/// with AllowPerHead false neither is the per-(batch, head) bias (grouped-query attention has no
/// single `Heads` axis for it to broadcast over; the caller rejected it).
template <bool AllowCausal = true, bool AllowPerHead = true, class F>
auto with_masks(Graph& g, const Masks& spec, F&& f) {
  auto with_causal = [&](auto... masks) {
    if constexpr (AllowCausal) {
      switch (spec.causal) {
        case Causal::top_left:
          return f(masks..., causal_top_left);
        case Causal::bottom_right:
          return f(masks..., causal_bottom_right);
        case Causal::none:
          break;
      }
    }
    return f(masks...);
  };
  auto with_bias = [&](auto... masks) {
    switch (spec.bias) {
      case Masks::Bias::query_key:
        return with_causal(masks..., input<QueryKeyBias>(g, "attn_bias"));
      case Masks::Bias::per_head:
        if constexpr (AllowPerHead) return with_causal(masks..., input<PerHeadBias>(g, "attn_bias"));
        break;
      case Masks::Bias::none:
        break;
    }
    return with_causal(masks...);
  };
  if (spec.key_padding) return with_bias(input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "key_keep"));
  return with_bias();
}

/// Calls f(align) with the mods' alignment as the DSL's tag type.
template <class F>
auto with_alignment(const Mods& m, F&& f) {
  if (!m.align) return f(unaligned_t{});
  if (*m.align == CausalAlign::bottom_right) return f(bottom_right);
  return f(top_left);
}

/// Each requested qkv::mods built-in by its own modded() (the fuse pass folds them into one
/// expression); the scores keep their declared type. `heads` adapts a [Heads]-indexed input to
/// the scores' head axes (GQA: [KvHeads, Group]).
template <class S, class Heads>
S score_mods(Graph& g, S s, const Mods& m, Heads&& heads) {
  return with_alignment(m, [&](auto align) {
    if (m.softcap) s = S(g, modded(s, mods::softcap(*m.softcap)).id());
    if (m.alibi_rank == 1)
      s = S(g, modded(s, mods::alibi(heads(input<Tensor<f32, nn::Heads<dyn>>>(g, "alibi_slopes")), align)).id());
    if (m.alibi_rank == 2)
      s = S(
          g,
          modded(s, mods::alibi(heads(input<Tensor<f32, Batch<dyn>, nn::Heads<dyn>>>(g, "alibi_slopes")), align)).id());
    return s;
  });
}

template <class S>
S mask_mods(Graph& g, S s, const Mods& m) {
  return with_alignment(m, [&](auto align) {
    if (m.window) s = S(g, modded(s, mods::sliding_window(m.window->first, m.window->second, align)).id());
    if (m.documents) {
      // f32: what the compiled code stores ids as (exact below 2^24), so an AOT header takes floats.
      auto q_ids = input<Tensor<f32, Batch<dyn>, Seq<dyn>>>(g, "q_doc_ids");
      auto kv_ids = input<Tensor<f32, Batch<dyn>, Key<dyn>>>(g, "kv_doc_ids");
      s = S(g, modded(s, mods::document_mask(q_ids, kv_ids)).id());
    }
    if (m.prefix_len) s = S(g, modded(s, mods::prefix_lm(*m.prefix_len, align)).id());
    return s;
  });
}

template <MhaOptions Opt>
Graph mha_graph(const MhaModel& m) {
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<dyn>>>(g, "query");
  auto mark = [&m](const auto& result) {
    output(result.first, "out");
    if (m.weights) output(result.second, "weights");
    return 0;
  };
  // The mods, first among the block's masks (score mods must come before any mask): one
  // scores_fn whatever the flags, so the flags add no instantiations. Not with appended keys.
  auto mods = scores_fn(
      [&](auto s) { return mask_mods(g, score_mods(g, s, m.mods, [](const auto& t) { return t; }), m.mods); });
  if (m.separate_qkv) {
    auto key = input<Tensor<f32, Batch<dyn>, Mem<dyn>, Hidden<dyn>>>(g, "key");
    auto value = input<Tensor<f32, Batch<dyn>, Mem<dyn>, ValueDim<dyn>>>(g, "value");
    auto block = CrossAttention<dyn, dyn, dyn, dyn, Opt>::make(g, "", m.bias, m.heads);
    with_masks<Opt.extra_keys() == 0>(g, m.masks, [&](auto... masks) {
      if constexpr (Opt.extra_keys() == 0)
        return mark(block(x, key, value, mods, masks...));
      else
        return mark(block(x, key, value, masks...));
    });
  } else if (m.static_k || m.static_v) {
    // Keys and values given as heads, or projected here from their source (the query's, or
    // key / value's); add_bias_kv was refused with them.
    if constexpr (!Opt.add_bias_kv) {
      auto block = MultiHeadAttention<dyn, dyn, Opt>::make(g, "", m.bias, m.heads);
      using Heads4 = Tensor<f32, Batch<dyn>, Heads<dyn>, Key<dyn>, HeadDim<dyn>>;
      using Source = Tensor<f32, Batch<dyn>, Key<dyn>, Model<dyn>>;
      auto source = [&](const char* name) {
        return m.cross ? Source(rename<Mem, Key>(input<Tensor<f32, Batch<dyn>, Mem<dyn>, Model<dyn>>>(g, name)))
                       : Source(rename<Seq, Key>(x));
      };
      auto heads = [&](bool given, const char* name, const char* src, const auto& w) {
        return given ? input<Heads4>(g, name) : Heads4(block.split_heads_kv(linear(source(src), w)));
      };
      auto kh = heads(m.static_k, "static_k", "key", block.k);
      auto vh = heads(m.static_v, "static_v", "value", block.v);
      with_masks<Opt.extra_keys() == 0>(g, m.masks, [&](auto... masks) {
        if constexpr (Opt.extra_keys() == 0)
          return mark(block.cross(x, projected(kh), projected(vh), mods, masks...));
        else
          return mark(block.cross(x, projected(kh), projected(vh), masks...));
      });
    }
  } else {
    auto block = MultiHeadAttention<dyn, dyn, Opt>::make(g, "", m.bias, m.heads);
    if (m.cross) {
      auto key = input<Tensor<f32, Batch<dyn>, Mem<dyn>, Model<dyn>>>(g, "key");
      auto value = input<Tensor<f32, Batch<dyn>, Mem<dyn>, Model<dyn>>>(g, "value");
      with_masks<Opt.extra_keys() == 0>(g, m.masks, [&](auto... masks) {
        if constexpr (Opt.extra_keys() == 0)
          return mark(block.cross(x, key, value, mods, masks...));
        else
          return mark(block.cross(x, key, value, masks...));
      });
    } else {
      with_masks<Opt.extra_keys() == 0>(g, m.masks, [&](auto... masks) {
        if constexpr (Opt.extra_keys() == 0)
          return mark(block(x, mods, masks...));
        else
          return mark(block(x, masks...));
      });
    }
  }
  return g;
}

}  // namespace

Graph build_mha(const MhaModel& m) {
  if (m.add_bias_kv && m.add_zero_attn) return mha_graph<MhaOptions{.add_bias_kv = true, .add_zero_attn = true}>(m);
  if (m.add_bias_kv) return mha_graph<MhaOptions{.add_bias_kv = true}>(m);
  if (m.add_zero_attn) return mha_graph<MhaOptions{.add_zero_attn = true}>(m);
  return mha_graph<MhaOptions{}>(m);
}

namespace {

/// A per-(batch, head) bias [Batch, Heads, Seq, Key] seen as [Batch, KvHeads, Group, Seq, Key]
/// under GQA; every other mask as it is.
template <class G, class M>
auto groups_of_mask(G&& groups, const M& mask) {
  if constexpr (std::is_same_v<M, PerHeadBias>)
    return groups(mask);
  else
    return mask;
}

/// Grouped-query SDPA: q [B, Heads = KvHeads·Group, L, D] viewed as [B, KvHeads, Group, L, D]
/// against k/v [B, KvHeads, S, D]; query head h reads key/value head h / Group.
Graph gqa_sdpa(const SdpaModel& m) {
  Graph g;
  auto q = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Seq<dyn>, HeadDim<dyn>>>(g, "q");
  auto k = input<Tensor<f32, Batch<dyn>, KvHeads<dyn>, Key<dyn>, HeadDim<dyn>>>(g, "k");
  auto v = input<Tensor<f32, Batch<dyn>, KvHeads<dyn>, Key<dyn>, ValueDim<dyn>>>(g, "v");
  // Query head h = kv_head · Group + g: a [.., Heads, ..] input is the same memory as [.., KvHeads, Group, ..].
  auto groups = [&](const auto& t) {
    return split<Heads, KvHeads<dyn>, Group<dyn>>(t, {m.kv_heads, m.heads / m.kv_heads});
  };
  auto qg = groups(q);
  with_masks(g, m.masks, [&](auto... masks) {
    auto scores = score_mods(g, scaled(contract<HeadDim>(qg, k), m.scale), m.mods, groups);
    auto s = mask_mods(g, qkv::nn::detail::apply_masks(scores, groups_of_mask(groups, masks)...), m.mods);
    auto p = softmax<Key>(s);
    if (m.weights) output(merge<KvHeads, Group, Heads>(p), "weights");
    if (m.lse) output(merge<KvHeads, Group, Heads>(logsumexp<Key>(s)), "lse");
    auto o = m.dropout > 0.0 ? contract<Key>(dropout(p, m.dropout, m.seed), v) : contract<Key>(p, v);
    output(merge<KvHeads, Group, Heads>(o), "out");
    return 0;
  });
  return g;
}
}  // namespace

Graph build_sdpa(const SdpaModel& m) {
  if (m.kv_heads > 0 && m.kv_heads != m.heads) return gqa_sdpa(m);
  Graph g;
  auto q = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Seq<dyn>, HeadDim<dyn>>>(g, "q");
  auto k = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Key<dyn>, HeadDim<dyn>>>(g, "k");
  auto v = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Key<dyn>, ValueDim<dyn>>>(g, "v");
  with_masks(g, m.masks, [&](auto... masks) {
    auto scores = score_mods(g, scaled(contract<HeadDim>(q, k), m.scale), m.mods, [](const auto& t) { return t; });
    auto s = mask_mods(g, qkv::nn::detail::apply_masks(scores, masks...), m.mods);
    auto p = softmax<Key>(s);
    if (m.weights) output(p, "weights");
    if (m.lse) output(logsumexp<Key>(s), "lse");
    if (m.dropout > 0.0)
      output(contract<Key>(dropout(p, m.dropout, m.seed), v), "out");
    else
      output(contract<Key>(p, v), "out");
    return 0;
  });
  return g;
}

namespace {
template <Activation Act>
Graph encoder_graph(const EncoderModel& m) {
  Graph g;
  using X = Tensor<f32, Batch<dyn>, Seq<dyn>, Model<dyn>>;
  X x = input<X>(g, "src");
  const auto placement = m.norm_first ? NormPlacement::pre : NormPlacement::post;
  // The masks are declared once and shared by every layer.
  x = with_masks(g, m.masks, [&](auto... masks) {
    X y = x;
    for (std::int64_t i = 0; i < m.layers; ++i) {
      const std::string prefix = m.stack ? "layers." + std::to_string(i) + "." : "";
      y = EncoderLayer<dyn, dyn, dyn, Act>::make(g, prefix, placement, m.eps, m.heads)(y, masks...);
    }
    return y;
  });
  if (m.final_norm) x = layer_norm(x, layer_norm_params<Model<dyn>>(g, "norm", m.eps));
  output(x, "out");
  return g;
}
}  // namespace

namespace {
LlamaConfig llama_config(const HfConfig& c) {
  LlamaConfig cfg;
  cfg.layers = c.num_hidden_layers;
  cfg.rms_norm_eps = c.norm_eps;
  cfg.tie_word_embeddings = c.tie_word_embeddings;
  cfg.windowed = c.windowed;
  LlamaAttentionConfig& a = cfg.attention;
  a.heads = c.num_attention_heads;
  a.kv_heads = c.num_key_value_heads;
  a.head_dim = c.head_dim;
  a.qkv_bias = c.qkv_bias;
  a.o_bias = c.o_bias;
  a.sliding_window = c.sliding_window;
  a.rope.theta = c.rope_theta;
  if (c.rope_llama3)
    a.rope.llama3 = Llama3RopeScaling{c.rope_llama3->factor, c.rope_llama3->low_freq_factor,
                                      c.rope_llama3->high_freq_factor, c.rope_llama3->original_max_position_embeddings};
  return cfg;
}

HfActivation hf_activation(const std::string& name) {
  // read_hf_config accepted only these.
  if (name == "gelu") return HfActivation::gelu;
  if (name == "relu") return HfActivation::relu;
  return HfActivation::gelu_tanh;  // gelu_new, gelu_pytorch_tanh
}

Gpt2Config gpt2_config(const HfConfig& c) {
  Gpt2Config cfg;
  cfg.layers = c.num_hidden_layers;
  cfg.heads = c.num_attention_heads;
  cfg.head_dim = c.head_dim;
  cfg.eps = c.norm_eps;
  cfg.tie_word_embeddings = c.tie_word_embeddings;
  cfg.activation = hf_activation(c.activation);
  return cfg;
}

/// f(g, model) with the decoder config.json describes, its parameters declared in g.
template <class F>
Graph with_decoder(const HfConfig& c, F&& f) {
  Graph g;
  if (c.gpt2())
    f(g, Gpt2LmHead<dyn>::make(g, gpt2_config(c)));
  else
    f(g, CausalLm<dyn>::make(g, llama_config(c)));
  return g;
}
}  // namespace

Graph build_causal_lm(const HfConfig& c) {
  return with_decoder(c, [](Graph& g, const auto& model) {
    auto tokens = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "tokens");
    auto positions = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "positions");
    output(model(tokens, positions), "logits");
  });
}

namespace {
/// The model's loss on (tokens, positions, targets), built in g.
template <class Model>
/// `*logits` (if given): the id of the logits node; the loss's nodes come after it.
int causal_lm_loss(Graph& g, const Model& model, const CrossEntropyOptions& o, int* logits = nullptr) {
  auto tokens = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "tokens");
  auto positions = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "positions");
  auto targets = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "targets");
  const auto y = model(tokens, positions);
  if (logits) *logits = y.id();
  return cross_entropy<Vocab>(y, targets, o).id();
}
}  // namespace

namespace {
/// The model's loss graph, computed in s.compute (over f32 weights; the loss in f32), its
/// attentions fused before it is differentiated (the fused backward).
codegen::ForwardForGradients loss_for_gradients(const HfConfig& c, const TrainSpec& s) {
  int loss = -1, logits = -1;
  Graph g = with_decoder(c, [&](Graph& gg, const auto& model) { loss = causal_lm_loss(gg, model, s.loss, &logits); });
  if (s.compute != DType::f32) {
    ComputeDtype m = with_compute_dtype(g, s.compute, logits + 1);
    loss = m.id[static_cast<std::size_t>(loss)];
    g = std::move(m.graph);
  }
  return codegen::fuse_for_gradients(g, loss);
}
}  // namespace

TrainGraph build_training_step(const HfConfig& c, const TrainSpec& s) {
  auto [g, loss] = loss_for_gradients(c, s);
  TrainGraph t;
  t.step =
      s.sgd ? append_training_step(g, loss, s.sgd_options, s.step) : append_training_step(g, loss, s.adamw, s.step);
  t.g = std::move(g);
  return t;
}

AccumulatingTrainGraphs build_accumulating_training_step(const HfConfig& c, const TrainSpec& s,
                                                         std::int64_t micro_batches) {
  auto [g, loss] = loss_for_gradients(c, s);
  AccumulatingTrainGraphs t;
  const std::vector<int> params = append_gradient_accumulation(g, loss, 1.0 / static_cast<double>(micro_batches));
  t.gradients = std::move(g);
  t.step = s.sgd ? append_training_step_on_gradients(t.update, t.gradients, params, s.sgd_options, s.step)
                 : append_training_step_on_gradients(t.update, t.gradients, params, s.adamw, s.step);
  return t;
}

Graph build_causal_lm_loss(const HfConfig& c, const CrossEntropyOptions& loss) {
  return with_decoder(c, [&](Graph& g, const auto& model) { g.mark_output(causal_lm_loss(g, model, loss), "loss"); });
}

Graph build_causal_lm_step(const HfConfig& c, bool left_padded) {
  return with_decoder(c, [left_padded](Graph& g, const auto& model) {
    if (left_padded)
      declare_cached_step<StepLogits::last_position, StepRows::left_padded>(g, model);
    else
      declare_cached_step<StepLogits::last_position>(g, model);
  });
}

Graph build_encoder_model(const HfConfig& c, bool padding_mask, bool pooled) {
  Graph g;
  const BertConfig cfg{.layers = c.num_hidden_layers,
                       .heads = c.num_attention_heads,
                       .head_dim = c.head_dim,
                       .eps = c.norm_eps,
                       .activation = hf_activation(c.activation)};
  const auto model = BertModel<dyn>::make(g, cfg, pooled);
  auto tokens = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "tokens");
  auto types = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "token_type_ids");
  auto hidden = padding_mask ? model(tokens, types, input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "key_keep"))
                             : model(tokens, types);
  output(hidden, "last_hidden_state");
  if (pooled) output(model.pooled(hidden), "pooler_output");
  return g;
}

Graph build_encoder(const EncoderModel& m) {
  return m.gelu ? encoder_graph<Activation::gelu>(m) : encoder_graph<Activation::relu>(m);
}

}  // namespace qkv::cli
