// qkv/runtime/hf_checkpoint.hpp — Hugging Face decoder checkpoints on disk: a model folder with
// `config.json` and `model.safetensors`, or shards `model-0000k-of-0000n.safetensors` listed by
// `model.safetensors.index.json` ({"weight_map": {tensor name: shard file}}).
//
// read_hf_config reads the keys qkv needs for model_type llama, qwen2, mistral and gpt2, with the
// defaults and rules of transformers' LlamaConfig / Qwen2Config / MistralConfig / GPT2Config
// (docs/decoding.md lists them). HfCheckpoint opens the shards (memory-mapped), checks every
// weight's presence, shape and dtype against the config, and hands out f32 copies. Every failure
// is an IoError of one line that names the folder and the key, tensor or value.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <qkv/runtime/io/array.hpp>
#include <qkv/runtime/io/safetensors.hpp>
#include <qkv/runtime/quantize.hpp>

namespace qkv {

struct HfConfig {
  std::string model_type;  // llama | qwen2 | mistral | gpt2 (decoders) | bert (an encoder)
  // GPT-2's n_embd, n_inner (4 x n_embd when null), n_layer, n_head and n_positions land in
  // hidden_size, intermediate_size, num_hidden_layers, num_attention_heads and
  // max_position_embeddings (GPT2Config's attribute_map); its key/value heads are its heads.
  std::int64_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  std::int64_t vocab_size = 0, max_position_embeddings = 0;
  std::int64_t type_vocab_size = 0;  // bert: rows of the token-type table
  double norm_eps = 1e-6;  // rms_norm_eps (llama, qwen2, mistral), layer_norm_epsilon (gpt2), layer_norm_eps (bert)
  double rope_theta = 10000.0;
  struct Llama3Scaling {
    double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 8192.0;
  };
  std::optional<Llama3Scaling> rope_llama3;
  /// The MLP's activation as config.json names it: silu (the Llama family), gelu_new,
  /// gelu_pytorch_tanh, gelu or relu (gpt2's activation_function, bert's hidden_act).
  std::string activation = "silu";
  bool tie_word_embeddings = false;
  bool qkv_bias = false, o_bias = false;       // from attention_bias (llama) or the model type (qwen2)
  std::optional<std::int64_t> sliding_window;  // W (i − W < j ≤ i) of the layers in `windowed`
  std::vector<bool> windowed;                  // per layer

  /// GPT-2's architecture: learned positions, LayerNorm, Conv1D weights, fused q/k/v.
  [[nodiscard]] bool gpt2() const { return model_type == "gpt2"; }
  /// BERT: an encoder (`qkv run encoder-model`), not a decoder.
  [[nodiscard]] bool bert() const { return model_type == "bert"; }
};

/// Reads and checks `dir`/config.json.
HfConfig read_hf_config(const std::filesystem::path& dir);
/// Reads and checks the config file `path` (config.json under any name).
HfConfig read_hf_config_file(const std::filesystem::path& path);
/// The same from the file's text; `what` names it in messages.
HfConfig parse_hf_config(std::string_view text, const std::string& what);
/// model.safetensors.index.json's weight map (tensor name -> shard file name, a plain file name
/// inside the model folder), from the file's text.
std::map<std::string, std::string> parse_weight_map(std::string_view text, const std::string& what);

/// A weight by the name the model's graph gives it, and its shape.
struct WeightShape {
  std::string name;
  std::vector<std::int64_t> shape;
};
/// Every weight the config implies, in the graph's order (HfCheckpoint::names() when the
/// checkpoint is opened), with its shape; `pooler`: bert's pooler.dense.* too.
std::vector<WeightShape> hf_weight_shapes(const HfConfig& c, bool pooler = false);

class HfCheckpoint {
 public:
  /// Opens `dir` (config.json and the safetensors file or shards) and checks every weight the
  /// config implies: present, of the right shape, F32/BF16/F16; no tensor it does not use
  /// (rotary inv_freq buffers, GPT-2's attn.bias / attn.masked_bias buffers and a tied
  /// lm_head.weight are ignored, as transformers does). GPT-2's weights may carry the
  /// `transformer.` prefix (save_pretrained's) or not (the Hub's gpt2 files); BERT's the `bert.`
  /// prefix of BertFor* checkpoints, whose task heads (`cls.*`) are ignored, and the legacy
  /// LayerNorm names gamma/beta. BERT's pooler is optional (has_pooler()).
  ///
  /// A rank-2 weight may instead be stored quantized (what `qkv quantize` writes): `name.q8`, I8
  /// of the weight's shape, and `name.q8_scale`, F16 [rows, ceil(columns / 32)] (Q8_0's groups);
  /// or `name.q4`, I8 [rows, columns / 2] (two entries a byte), and `name.q4_scale`, F16
  /// [rows, columns / 32] (quantize.hpp).
  ///
  /// `windows`: load() maps large weights from the files (SafetensorsFile::open) rather than
  /// copying them.
  static HfCheckpoint open(const std::filesystem::path& dir, bool windows = true);

  [[nodiscard]] const HfConfig& config() const { return config_; }
  /// The names of the weights the model reads, in order, as the model's graph names them
  /// (GPT-2's without a `transformer.` prefix).
  [[nodiscard]] const std::vector<std::string>& names() const { return names_; }
  /// Weight `name` as stored (F32, BF16 or F16; the model's dtype decides what it becomes); a
  /// weight stored quantized, dequantized to f32.
  [[nodiscard]] NdArray load(const std::string& name) const;
  /// The dtype load(name) gives: as stored, f32 for a quantized weight (dequantized).
  [[nodiscard]] DType stored_dtype(const std::string& name) const;
  /// Weight `name` as dtype `as` (SafetensorsFile::load_as: an f32 weight read as f16 / bf16 is
  /// converted as it is read); a quantized one dequantized, then converted.
  [[nodiscard]] NdArray load_as(const std::string& name, DType as) const;
  /// Whether weight `name` is stored quantized (q8 or q4); any of them.
  [[nodiscard]] bool quantized(const std::string& name) const { return quant_.count(name) > 0; }
  [[nodiscard]] bool any_quantized() const { return !quant_.empty(); }
  /// The formats the quantized weights are stored in, each once.
  [[nodiscard]] std::set<Quant> formats() const {
    std::set<Quant> out;
    for (const auto& [name, f] : quant_) out.insert(f);
    return out;
  }
  /// A weight stored quantized, as stored (i8 q, f16 scales in groups of kQuantGroup).
  [[nodiscard]] QuantizedWeight load_quantized(const std::string& name) const;
  /// Every file open() read: config.json, then model.safetensors, or the index and its shards
  /// in the order the index first names them (a command's outputs may be none of these).
  [[nodiscard]] const std::vector<std::filesystem::path>& files() const { return paths_; }
  /// Whether the folder also has model.safetensors.index.json, which model.safetensors overrode.
  [[nodiscard]] bool ignored_index() const { return ignored_index_; }
  /// bert: whether the checkpoint has the pooler (pooler.dense.*); BertForMaskedLM's has none.
  [[nodiscard]] bool has_pooler() const { return has_pooler_; }
  /// The name weight `name` has in the files (a prefix, a legacy name; `name` itself mostly); a
  /// quantized one's tensors are that name with quant_suffix and quant_scale_suffix.
  [[nodiscard]] const std::string& stored(const std::string& name) const;
  /// Bytes of all weights once converted to f32.
  [[nodiscard]] std::uint64_t f32_bytes() const;

 private:
  std::string what_;
  HfConfig config_;
  std::vector<SafetensorsFile> files_;
  std::vector<std::filesystem::path> paths_;
  bool ignored_index_ = false;
  std::map<std::string, std::size_t> where_;   // weight name as stored -> file
  std::map<std::string, std::string> stored_;  // the graph's weight name -> as stored
  bool has_pooler_ = false;
  std::map<std::string, Quant> quant_;  // the graph's names of the weights stored quantized: how
  std::vector<std::string> names_;
};

}  // namespace qkv
