// The models the CLI runs, built with the DSL's building blocks (qkv::nn) with dynamic extents:
// batch and sequence lengths are bound from the inputs, d_model (and kdim, vdim, the
// feed-forward width) from the weights, the head count given on the command line.
//
// Masks reach the graph as: a key-padding keep-mask `key_keep` [Batch, Key] (PyTorch's
// key_padding_mask inverted), an additive bias `attn_bias` [Seq, Key] — or [Batch, Heads, Seq,
// Key] when the mask is per batch and head — into which the CLI folds attn_mask (bool -> 0 /
// -inf, float as given), and qkv's causal op with its alignment. The fused CPU kernel takes the
// first two forms directly. Graph inputs: see each builder.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <qkv/ir/graph.hpp>
#include <qkv/ir/train.hpp>
#include <qkv/runtime/hf_checkpoint.hpp>

namespace qkv::cli {

enum class Causal { none, top_left, bottom_right };

/// Which mask inputs a model's graph has.
struct Masks {
  bool key_padding = false;                                         // input `key_keep` [Batch, Key], true = may attend
  enum class Bias { none, query_key, per_head } bias = Bias::none;  // input `attn_bias`
  Causal causal = Causal::none;
};

/// Score and mask modifications of `qkv run sdpa` (qkv::mods built-ins), with their inputs:
/// `alibi_slopes` [Heads] or [Batch, Heads] (f32), `q_doc_ids` [Batch, Seq] and `kv_doc_ids`
/// [Batch, Key] (ints). Score mods apply before the masks above, mask mods after them.
struct Mods {
  std::optional<double> softcap;                                // c·tanh(s / c)
  int alibi_rank = 0;                                           // 0: none; 1: [Heads]; 2: [Batch, Heads]
  std::optional<std::pair<std::int64_t, std::int64_t>> window;  // (left, right), −1 = unbounded
  bool documents = false;
  std::optional<std::int64_t> prefix_len;
  /// How positions of queries and keys compare (unset: L must equal S).
  std::optional<CausalAlign> align;
  /// Whether some mod compares query and key positions (and so needs an alignment when L != S).
  [[nodiscard]] bool positional() const { return alibi_rank > 0 || window || prefix_len; }
};

struct MhaModel {
  std::int64_t heads = 1;
  bool cross = false;         // keys/values from `key`/`value` instead of the query
  bool separate_qkv = false;  // kdim/vdim != embed_dim: q/k/v_proj_weight
  bool bias = true;
  bool add_bias_kv = false;
  bool add_zero_attn = false;
  bool weights = true;                      // also output the attention weights (costs a second pass over the keys)
  bool static_k = false, static_v = false;  // PyTorch's static_k / static_v: inputs [B, H, S, head_dim]
  Masks masks;
  Mods mods;  // no documents; none with add_bias_kv / add_zero_attn (the appended keys have no position)
};
/// Inputs: query [B, L, E], key/value [B, S, kdim/vdim] (cross), static_k / static_v [B, H, S,
/// head_dim] (fused weights only), masks; params as PyTorch names them. Outputs: out [B, L, E],
/// weights [B, H, L, S'].
Graph build_mha(const MhaModel& m);

struct SdpaModel {
  Masks masks;
  Mods mods;
  /// Grouped-query attention when kv_heads > 0 and != heads: k and v have kv_heads heads, each
  /// shared by heads / kv_heads query heads (heads % kv_heads == 0; PyTorch's enable_gqa).
  std::int64_t heads = 0, kv_heads = 0;
  bool weights = true;          // also output the attention weights
  bool lse = false;             // also output `lse` [B, H, L]: ln Σ_j exp(score'), −inf for a row no key survives
  std::optional<double> scale;  // default 1/sqrt(D)
  double dropout = 0.0;
  std::uint64_t seed = 0;
};
/// Inputs q [B, H, L, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv], masks. Outputs out [B, H, L, Dv],
/// weights [B, H, L, S], lse [B, H, L].
Graph build_sdpa(const SdpaModel& m);

struct EncoderModel {
  std::int64_t heads = 1;
  std::int64_t layers = 1;  // 1 with prefix "" is nn.TransformerEncoderLayer; else layers.N.*
  bool stack = false;       // nn.TransformerEncoder: parameters under layers.N.
  bool final_norm = false;  // nn.TransformerEncoder(norm=...): norm.weight / norm.bias
  bool gelu = false;
  bool norm_first = false;
  double eps = 1e-5;
  Masks masks;
};
/// Input src [B, L, E], masks. Output out.
Graph build_encoder(const EncoderModel& m);

/// A Hugging Face decoder (llama, qwen2, mistral; gpt2) as its config.json describes it, built
/// with qkv::nn::CausalLm (qkv::nn::Gpt2LmHead). Inputs: tokens and positions [Batch, Seq] (i64),
/// the weights by their Hugging Face names (HfCheckpoint::names()). Output: logits [Batch, Seq, Vocab].
Graph build_causal_lm(const HfConfig& c);
/// The same model as one step against a KV cache (DecoderSession's graph,
/// qkv::nn::declare_cached_step): inputs also the size past_length and cache_k.{i} / cache_v.{i}
/// [Batch, KvHeads, Slot, HeadDim]; outputs logits of the step's last position [Batch, 1, Vocab]
/// (what generating reads) and present_k.{i} / present_v.{i}, the caches after the step.
/// left_padded: also the input first_key [Batch] (i64), for a batch of prompts of different
/// lengths left-padded to one (StepRows::left_padded).
Graph build_causal_lm_step(const HfConfig& c, bool left_padded = false);

/// How a decoder trains: the loss (cross-entropy over the vocabulary, the next token as the
/// target), the optimizer and what happens to the gradients first.
struct TrainSpec {
  bool sgd = false;  // SGD (with momentum) instead of AdamW
  AdamW adamw;
  Sgd sgd_options;
  StepOptions step;
  CrossEntropyOptions loss;
  /// f32, or bf16 / f16: the model computed in that dtype over f32 master weights (the loss and
  /// the optimizer in f32; with_compute_dtype).
  DType compute = DType::f32;
};
/// One training step of build_causal_lm's model as one graph (qkv/ir/train.hpp): inputs tokens,
/// positions, targets [Batch, Seq] (i64; targets equal to loss.ignore_index count for nothing),
/// the scalars lr and step, the weights and the optimizer state by name (TrainingStep); outputs
/// loss, grad_norm, the updated weights and state under the same names.
struct TrainGraph {
  Graph g;
  TrainingStep step;
};
TrainGraph build_training_step(const HfConfig& c, const TrainSpec& s);
/// The same step in two graphs, for gradient accumulation over `micro_batches`: `gradients`
/// (inputs tokens, positions, targets, the weights and the sums "grad.<p>"; outputs loss and
/// "grad.<p>" + ∂loss/∂p / micro_batches) and `update` (the optimizer step on the sums: inputs
/// the weights, "grad.<p>", the state, lr and step; outputs grad_norm, the weights and state).
struct AccumulatingTrainGraphs {
  Graph gradients, update;
  TrainingStep step;
};
AccumulatingTrainGraphs build_accumulating_training_step(const HfConfig& c, const TrainSpec& s,
                                                         std::int64_t micro_batches);
/// The loss alone (no gradients): inputs tokens, positions, targets and the weights; output loss.
Graph build_causal_lm_loss(const HfConfig& c, const CrossEntropyOptions& loss);

/// A Hugging Face encoder (bert) as its config.json describes it, built with qkv::nn::BertModel.
/// Inputs: tokens and token_type_ids [Batch, Seq] (i64); with padding_mask, key_keep [Batch, Key]
/// (bool, true = a real token: transformers' attention_mask); the weights by their names
/// (HfCheckpoint::names()). Outputs: last_hidden_state [Batch, Seq, Model] and, with pooled,
/// pooler_output [Batch, Model].
Graph build_encoder_model(const HfConfig& c, bool padding_mask, bool pooled);

}  // namespace qkv::cli
