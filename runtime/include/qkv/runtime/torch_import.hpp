// qkv/runtime/torch_import.hpp — PyTorch state dicts (as saved to safetensors) in, feeds for the
// qkv::nn building blocks out.
//
// The blocks name their parameters as PyTorch does, so importing is: infer the module's
// hyper-parameters from the tensors' shapes (as nn.MultiheadAttention and
// nn.TransformerEncoderLayer would have been constructed), check every tensor the block needs
// is there with the right shape, and adapt the two layouts that differ (bias_k/bias_v are
// [1, 1, E] in PyTorch, [1, E] in qkv). Errors name the key and both shapes. Bias sets are all
// or nothing, as PyTorch's `bias=` switches make them (in_proj_bias with out_proj.bias; bias_k
// with bias_v; in an encoder layer every bias or none).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/io/safetensors.hpp>

namespace qkv {

/// A state dict that does not fit the module it is loaded into.
class StateDictError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// nn.MultiheadAttention's constructor arguments, as far as the state dict determines them.
struct MhaConfig {
  std::int64_t embed_dim = 0;
  std::int64_t num_heads = 0;  // not in the state dict: given by the caller
  std::int64_t kdim = 0;
  std::int64_t vdim = 0;
  bool bias = true;
  bool add_bias_kv = false;
  bool separate_qkv = false;  // q_proj_weight/k_proj_weight/v_proj_weight instead of in_proj_weight
  [[nodiscard]] std::int64_t head_dim() const { return num_heads ? embed_dim / num_heads : 0; }
};

/// Infers the configuration of the nn.MultiheadAttention stored under `prefix` (e.g.
/// "self_attn."). Throws StateDictError naming a missing or mis-shaped key, or when
/// num_heads does not divide embed_dim.
MhaConfig infer_mha_config(const SafetensorsFile& sd, std::int64_t num_heads, const std::string& prefix = "");

/// The feeds for qkv::nn::MultiHeadAttention / CrossAttention made with the same prefix.
Feeds import_mha(const SafetensorsFile& sd, const MhaConfig& cfg, const std::string& prefix = "");

struct EncoderLayerConfig {
  MhaConfig self_attn;
  std::int64_t dim_feedforward = 0;
};

/// nn.TransformerEncoderLayer under `prefix` (e.g. "layers.0."): self_attn.*, linear1.*,
/// linear2.*, norm1.*, norm2.*. Every bias, or none (bias=False: they are fed as zeros).
EncoderLayerConfig infer_encoder_layer_config(const SafetensorsFile& sd, std::int64_t num_heads,
                                              const std::string& prefix = "");
Feeds import_encoder_layer(const SafetensorsFile& sd, const EncoderLayerConfig& cfg, const std::string& prefix = "");

/// nn.LayerNorm `name` (e.g. "norm" for nn.TransformerEncoder's final norm): name.weight and
/// name.bias, both [dim] (no bias: LayerNorm(bias=False), a zero shift).
Feeds import_layer_norm(const SafetensorsFile& sd, const std::string& name, std::int64_t dim);

/// nn.TransformerEncoder: how many layers the state dict holds under layers.N. — the indices
/// must be 0, 1, ..., N-1 (StateDictError naming the first one missing, or when there is none).
std::int64_t encoder_layer_count(const SafetensorsFile& sd);

/// Throws StateDictError naming a key of `sd` that is none of `used` (the tensors the model
/// takes), as PyTorch's load_state_dict(strict=True) does; `module` names the model.
void check_no_unexpected_keys(const SafetensorsFile& sd, const Feeds& used, const std::string& module);

}  // namespace qkv
