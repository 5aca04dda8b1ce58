// The models the CLI runs, built with the DSL's building blocks (qkv::nn) with dynamic extents:
// batch and sequence lengths are bound from the inputs, d_model (and kdim, vdim, the
// feed-forward width) from the weights, the head count given on the command line.
//
// Masks reach the graph in two forms: a causal mask (qkv's causal op, with its alignment) and
// one additive float bias [Batch, Heads, Seq, Key] into which the CLI folds PyTorch's
// key_padding_mask and attn_mask (bool -> 0 / -inf, float as given) — as PyTorch itself does
// inside nn.MultiheadAttention. Graph inputs: see each builder.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <qkv/ir/graph.hpp>

namespace qkv::cli {

enum class Causal { none, top_left, bottom_right };

struct MhaModel {
  std::int64_t heads = 1;
  bool cross = false;         // keys/values from `key`/`value` instead of the query
  bool separate_qkv = false;  // kdim/vdim != embed_dim: q/k/v_proj_weight
  bool bias = true;
  bool add_bias_kv = false;
  bool add_zero_attn = false;
  bool attn_bias = false;  // an input `attn_bias` [Batch, Heads, Seq, Key]
  Causal causal = Causal::none;
};
/// Inputs: query [B, L, E], key/value [B, S, kdim/vdim] (cross), attn_bias; params as PyTorch
/// names them. Outputs: out [B, L, E], weights [B, H, L, S'].
Graph build_mha(const MhaModel& m);

struct SdpaModel {
  bool attn_bias = false;  // an input `attn_bias` [B, H, L, S]
  Causal causal = Causal::none;
  std::optional<double> scale;  // default 1/sqrt(D)
  double dropout = 0.0;
  std::uint64_t seed = 0;
};
/// Inputs q [B, H, L, D], k [B, H, S, D], v [B, H, S, Dv], attn_bias. Outputs out, weights.
Graph build_sdpa(const SdpaModel& m);

struct EncoderModel {
  std::int64_t heads = 1;
  std::int64_t layers = 1;  // 1 with prefix "" is nn.TransformerEncoderLayer; else layers.N.*
  bool stack = false;       // nn.TransformerEncoder: parameters under layers.N.
  bool final_norm = false;  // nn.TransformerEncoder(norm=...): norm.weight / norm.bias
  bool gelu = false;
  bool norm_first = false;
  double eps = 1e-5;
  bool attn_bias = false;  // [B, H, L, L]
  Causal causal = Causal::none;
};
/// Input src [B, L, E], attn_bias. Output out.
Graph build_encoder(const EncoderModel& m);

}  // namespace qkv::cli
