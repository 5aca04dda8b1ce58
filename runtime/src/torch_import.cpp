#include <qkv/runtime/torch_import.hpp>

#include <cctype>
#include <set>
#include <vector>

#include <qkv/runtime/io/array.hpp>

namespace qkv {

namespace {

using Shape = std::vector<std::int64_t>;

std::string where(const SafetensorsFile& sd) { return "state dict " + sd.what() + ": "; }

/// The tensor `key`, which must exist and have `want` as its shape.
NdArray take(const SafetensorsFile& sd, const std::string& key, const Shape& want, const std::string& why) {
  if (!sd.contains(key)) throw StateDictError(where(sd) + "missing key '" + key + "' (" + why + ")");
  NdArray a = sd.load(key);
  if (a.shape != want)
    throw StateDictError(where(sd) + "'" + key + "' has shape " + shape_to_string(a.shape) + ", expected " +
                         shape_to_string(want) + " (" + why + ")");
  // f16 / bf16 stay as stored (the command converts them to the model's dtype, with a note);
  // f64 becomes f32.
  if (a.dtype != DType::f32 && a.dtype != DType::f16 && a.dtype != DType::bf16)
    a = NdArray::from_f32(a.to_f32(), a.shape);
  return a;
}

Shape shape_of(const SafetensorsFile& sd, const std::string& key, std::size_t rank, const std::string& why) {
  if (!sd.contains(key)) throw StateDictError(where(sd) + "missing key '" + key + "' (" + why + ")");
  Shape s = sd.get(key).shape;
  if (s.size() != rank)
    throw StateDictError(where(sd) + "'" + key + "' has shape " + shape_to_string(s) + ", expected " +
                         std::to_string(rank) + " axes (" + why + ")");
  return s;
}

/// Bias sets are all or nothing, as PyTorch's `bias=` switch makes them: every key in `keys`
/// present, or none. Throws naming one that is there and one that is not.
void all_or_nothing(const SafetensorsFile& sd, const std::vector<std::string>& keys, const std::string& why) {
  const std::string* present = nullptr;
  const std::string* missing = nullptr;
  for (const auto& k : keys) {
    const std::string*& first = sd.contains(k) ? present : missing;
    if (!first) first = &k;
  }
  if (present && missing)
    throw StateDictError(where(sd) + "missing key '" + *missing + "' (there is '" + *present + "', and " + why + ")");
}

}  // namespace

MhaConfig infer_mha_config(const SafetensorsFile& sd, std::int64_t num_heads, const std::string& prefix) {
  MhaConfig c;
  c.num_heads = num_heads;
  const std::string p = prefix;
  // embed_dim: out_proj maps E -> E (nn.MultiheadAttention.__init__ builds it from embed_dim).
  const Shape out = shape_of(sd, p + "out_proj.weight", 2, "the output projection of nn.MultiheadAttention");
  c.embed_dim = out[0];
  if (num_heads <= 0 || c.embed_dim % num_heads != 0)
    throw StateDictError(where(sd) + "embed_dim " + std::to_string(c.embed_dim) + " (from '" + p +
                         "out_proj.weight') is not divisible by num_heads " + std::to_string(num_heads));
  c.separate_qkv = !sd.contains(p + "in_proj_weight") && sd.contains(p + "q_proj_weight");
  c.kdim = c.vdim = c.embed_dim;
  if (c.separate_qkv) {
    c.kdim = shape_of(sd, p + "k_proj_weight", 2, "kdim != embed_dim stores separate projections")[1];
    c.vdim = shape_of(sd, p + "v_proj_weight", 2, "kdim != embed_dim stores separate projections")[1];
  } else if (!sd.contains(p + "in_proj_weight")) {
    throw StateDictError(where(sd) + "missing key '" + p +
                         "in_proj_weight' (nn.MultiheadAttention stores in_proj_weight, or "
                         "q_proj_weight/k_proj_weight/v_proj_weight when kdim or vdim differ from embed_dim)");
  }
  all_or_nothing(sd, {p + "in_proj_bias", p + "out_proj.bias"},
                 "nn.MultiheadAttention(bias=...) makes both biases or neither");
  all_or_nothing(sd, {p + "bias_k", p + "bias_v"}, "nn.MultiheadAttention(add_bias_kv=True) makes both");
  c.bias = sd.contains(p + "in_proj_bias");
  c.add_bias_kv = sd.contains(p + "bias_k");
  return c;
}

Feeds import_mha(const SafetensorsFile& sd, const MhaConfig& c, const std::string& p) {
  const std::int64_t E = c.embed_dim;
  Feeds f;
  if (c.separate_qkv) {
    f[p + "q_proj_weight"] = take(sd, p + "q_proj_weight", {E, E}, "query projection [embed_dim, embed_dim]");
    f[p + "k_proj_weight"] = take(sd, p + "k_proj_weight", {E, c.kdim}, "key projection [embed_dim, kdim]");
    f[p + "v_proj_weight"] = take(sd, p + "v_proj_weight", {E, c.vdim}, "value projection [embed_dim, vdim]");
  } else {
    f[p + "in_proj_weight"] =
        take(sd, p + "in_proj_weight", {3 * E, E}, "fused q/k/v projection [3*embed_dim, embed_dim]");
  }
  if (c.bias) {
    f[p + "in_proj_bias"] = take(sd, p + "in_proj_bias", {3 * E}, "fused q/k/v bias [3*embed_dim]");
    f[p + "out_proj.bias"] = take(sd, p + "out_proj.bias", {E}, "bias=True");
  }
  f[p + "out_proj.weight"] = take(sd, p + "out_proj.weight", {E, E}, "output projection [embed_dim, embed_dim]");
  if (c.add_bias_kv) {
    for (const char* name : {"bias_k", "bias_v"}) {
      NdArray b = take(sd, p + name, {1, 1, E}, "add_bias_kv=True");
      b.shape = {1, E};  // qkv's [Key=1, Model] row
      f[p + name] = std::move(b);
    }
  }
  return f;
}

EncoderLayerConfig infer_encoder_layer_config(const SafetensorsFile& sd, std::int64_t num_heads, const std::string& p) {
  EncoderLayerConfig c;
  c.self_attn = infer_mha_config(sd, num_heads, p + "self_attn.");
  c.dim_feedforward =
      shape_of(sd, p + "linear1.weight", 2, "the first feed-forward layer [dim_feedforward, d_model]")[0];
  return c;
}

Feeds import_encoder_layer(const SafetensorsFile& sd, const EncoderLayerConfig& c, const std::string& p) {
  if (c.self_attn.separate_qkv || c.self_attn.add_bias_kv)
    throw StateDictError(where(sd) +
                         "nn.TransformerEncoderLayer's self-attention has neither kdim/vdim nor add_bias_kv");
  all_or_nothing(sd,
                 {p + "self_attn.in_proj_bias", p + "self_attn.out_proj.bias", p + "linear1.bias", p + "linear2.bias",
                  p + "norm1.bias", p + "norm2.bias"},
                 "nn.TransformerEncoderLayer(bias=...) makes every bias or none");
  Feeds f = import_mha(sd, c.self_attn, p + "self_attn.");
  const std::int64_t E = c.self_attn.embed_dim, F = c.dim_feedforward;
  // bias=False (PyTorch 2.1 on): no Linear, attention or LayerNorm bias at all — the same function
  // as zero biases, which the graph is fed.
  const bool bias = sd.contains(p + "linear1.bias");
  auto bias_of = [&](const std::string& name, std::int64_t n, const std::string& what) {
    return bias ? take(sd, name, {n}, what) : NdArray::zeros(DType::f32, {n});
  };
  if (!bias) {
    f[p + "self_attn.in_proj_bias"] = NdArray::zeros(DType::f32, {3 * E});
    f[p + "self_attn.out_proj.bias"] = NdArray::zeros(DType::f32, {E});
  }
  f[p + "linear1.weight"] = take(sd, p + "linear1.weight", {F, E}, "[dim_feedforward, d_model]");
  f[p + "linear1.bias"] = bias_of(p + "linear1.bias", F, "[dim_feedforward]");
  f[p + "linear2.weight"] = take(sd, p + "linear2.weight", {E, F}, "[d_model, dim_feedforward]");
  f[p + "linear2.bias"] = bias_of(p + "linear2.bias", E, "[d_model]");
  for (const char* norm : {"norm1", "norm2"}) f.merge(import_layer_norm(sd, p + norm, E));
  return f;
}

Feeds import_layer_norm(const SafetensorsFile& sd, const std::string& name, std::int64_t dim) {
  Feeds f;
  f[name + ".weight"] = take(sd, name + ".weight", {dim}, "layer norm gain [d_model]");
  // LayerNorm(bias=False) (PyTorch 2.1 on) has a gain only: a zero shift.
  f[name + ".bias"] = sd.contains(name + ".bias") ? take(sd, name + ".bias", {dim}, "layer norm shift [d_model]")
                                                  : NdArray::zeros(DType::f32, {dim});
  return f;
}

std::int64_t encoder_layer_count(const SafetensorsFile& sd) {
  std::set<std::int64_t> seen;
  for (const std::string& name : sd.names()) {
    if (name.rfind("layers.", 0) != 0) continue;
    std::int64_t i = 0;
    std::size_t k = 7;
    for (; k < name.size() && std::isdigit(static_cast<unsigned char>(name[k])) && i < (1LL << 40); ++k)
      i = i * 10 + (name[k] - '0');
    if (k > 7 && k < name.size() && name[k] == '.') seen.insert(i);
  }
  if (seen.empty()) throw StateDictError(where(sd) + "no 'layers.0.*' keys (nn.TransformerEncoder)");
  std::int64_t expected = 0;
  for (std::int64_t i : seen) {
    if (i != expected)
      throw StateDictError(where(sd) + "has 'layers." + std::to_string(i) + ".*' but no 'layers." +
                           std::to_string(expected) +
                           ".*' (nn.TransformerEncoder numbers its layers 0, 1, ... without gaps)");
    ++expected;
  }
  return expected;
}

void check_no_unexpected_keys(const SafetensorsFile& sd, const Feeds& used, const std::string& module) {
  for (const std::string& name : sd.names())
    if (!used.contains(name))
      throw StateDictError(where(sd) + "unexpected key '" + name + "': " + module +
                           " has no such parameter (PyTorch's load_state_dict refuses it too)");
}

}  // namespace qkv
