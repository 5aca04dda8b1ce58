// hf_checkpoint.cpp — config.json and the safetensors weights of a Hugging Face decoder
// (qkv/runtime/hf_checkpoint.hpp).
#include <qkv/runtime/hf_checkpoint.hpp>

#include <nlohmann/json.hpp>

#include <qkv/runtime/io/files.hpp>
#include <qkv/runtime/io/quote.hpp>

#include "io/json_text.hpp"

#include <algorithm>
#include <optional>
#include <set>
#include <sstream>

namespace qkv {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& what, const std::string& problem) { throw IoError(what + ": " + problem); }

std::string read_text(const std::filesystem::path& path) {
  const std::vector<std::byte> bytes = InputFile::open(path).read_all(64u << 20, "a JSON file of the model");
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

json parse_json(std::string_view text, const std::string& what) {
  if (const auto at = json_text::too_deep(text))
    fail(what, "nests arrays or objects deeper than " + std::to_string(json_text::kMaxDepth) + " levels (at byte " +
                   std::to_string(*at) + ")");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(what, "not valid JSON (" + std::string(e.what()) + ")");
  }
}

/// config.json's key `key`: absent or null gives nullopt.
const json* find(const json& c, const char* key) {
  const auto it = c.find(key);
  return it == c.end() || it->is_null() ? nullptr : &*it;
}

std::int64_t positive_int(const json& c, const char* key, const std::string& what,
                          std::optional<std::int64_t> def = {}) {
  const json* v = find(c, key);
  if (!v) {
    if (def) return *def;
    fail(what, "has no `" + std::string(key) + "`");
  }
  if (!v->is_number_integer() || v->get<std::int64_t>() <= 0)
    fail(what, "`" + std::string(key) + "` must be a positive integer, is " + json_text::excerpt(*v));
  return v->get<std::int64_t>();
}

double positive_number(const json& c, const char* key, const std::string& what, double def) {
  const json* v = find(c, key);
  if (!v) return def;
  if (!v->is_number() || !(v->get<double>() > 0))
    fail(what, "`" + std::string(key) + "` must be a positive number, is " + json_text::excerpt(*v));
  return v->get<double>();
}

bool flag(const json& c, const char* key, const std::string& what, bool def) {
  const json* v = find(c, key);
  if (!v) return def;
  if (!v->is_boolean()) fail(what, "`" + std::string(key) + "` must be true or false, is " + json_text::excerpt(*v));
  return v->get<bool>();
}

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

HfConfig read_hf_config(const std::filesystem::path& dir) { return read_hf_config_file(dir / "config.json"); }

HfConfig read_hf_config_file(const std::filesystem::path& path) {
  return parse_hf_config(read_text(path), path.string());
}

std::map<std::string, std::string> parse_weight_map(std::string_view text, const std::string& what) {
  const json j = parse_json(text, what);
  const json* wm = j.is_object() ? find(j, "weight_map") : nullptr;
  if (!wm || !wm->is_object()) fail(what, "has no `weight_map` object");
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string()) fail(what, "the shard of " + quote_text(name) + " is not a file name");
    const std::string f = file.get<std::string>();
    const bool control = std::any_of(f.begin(), f.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; });
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == ".." || control)
      fail(what, "the shard " + quote_text(f) + " of " + quote_text(name) + " is not a file of the model folder");
    out[name] = f;
  }
  return out;
}

namespace {
/// The MLP activation under `key` (GPT-2's activation_function, BERT's hidden_act): one of the
/// forms qkv runs (HfActivation), `def` when absent.
std::string mlp_activation(const json& c, const char* key, const std::string& what, const std::string& model,
                           const std::string& def) {
  std::vector<std::string> known{def};  // the default first in the message
  for (const char* a : {"gelu_new", "gelu_pytorch_tanh", "gelu", "relu"})
    if (a != def) known.push_back(a);
  const json* act = find(c, key);
  if (!act) return def;
  if (!act->is_string() || std::find(known.begin(), known.end(), act->get<std::string>()) == known.end()) {
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    fail(what,
         std::string(key) + " " + json_text::excerpt(*act) + " is not one qkv runs for " + model + " (" + list + ")");
  }
  return act->get<std::string>();
}

/// The head width of a model whose heads split the hidden size (`hidden_key` / `heads_key` name
/// them in the message).
std::int64_t split_heads(const HfConfig& h, const std::string& what, const char* hidden_key, const char* heads_key) {
  if (h.hidden_size % h.num_attention_heads != 0)
    fail(what, std::string(hidden_key) + " (" + std::to_string(h.hidden_size) + ") is not a multiple of " + heads_key +
                   " (" + std::to_string(h.num_attention_heads) + ")");
  return h.hidden_size / h.num_attention_heads;
}

/// GPT2Config's keys (n_embd, n_layer, ...; the attribute_map's names are not what config.json holds).
void read_gpt2(const json& c, const std::string& what, HfConfig& h) {
  h.activation = mlp_activation(c, "activation_function", what, "gpt2", "gelu_new");
  h.hidden_size = positive_int(c, "n_embd", what, 768);
  h.num_hidden_layers = positive_int(c, "n_layer", what, 12);
  h.num_attention_heads = h.num_key_value_heads = positive_int(c, "n_head", what, 12);
  h.vocab_size = positive_int(c, "vocab_size", what, 50257);
  h.max_position_embeddings = positive_int(c, "n_positions", what, 1024);
  h.intermediate_size = positive_int(c, "n_inner", what, 4 * h.hidden_size);
  h.head_dim = split_heads(h, what, "n_embd", "n_head");
  h.norm_eps = positive_number(c, "layer_norm_epsilon", what, 1e-5);
  h.tie_word_embeddings = flag(c, "tie_word_embeddings", what, true);
  h.windowed.assign(static_cast<std::size_t>(h.num_hidden_layers), false);
  // Variants qkv does not implement are refused by name rather than run differently.
  if (!flag(c, "scale_attn_weights", what, true))
    fail(what, "scale_attn_weights is false; qkv runs GPT-2 with its scores scaled by head_dim^-0.5 only");
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "add_cross_attention"})
    if (flag(c, key, what, false)) fail(what, "`" + std::string(key) + "` is true; qkv does not implement it for gpt2");
}
/// BertConfig's keys.
void read_bert(const json& c, const std::string& what, HfConfig& h) {
  h.activation = mlp_activation(c, "hidden_act", what, "bert", "gelu");
  h.hidden_size = positive_int(c, "hidden_size", what, 768);
  h.num_hidden_layers = positive_int(c, "num_hidden_layers", what, 12);
  h.num_attention_heads = h.num_key_value_heads = positive_int(c, "num_attention_heads", what, 12);
  h.intermediate_size = positive_int(c, "intermediate_size", what, 3072);
  h.vocab_size = positive_int(c, "vocab_size", what, 30522);
  h.max_position_embeddings = positive_int(c, "max_position_embeddings", what, 512);
  h.type_vocab_size = positive_int(c, "type_vocab_size", what, 2);
  h.head_dim = split_heads(h, what, "hidden_size", "num_attention_heads");
  h.norm_eps = positive_number(c, "layer_norm_eps", what, 1e-12);
  h.windowed.assign(static_cast<std::size_t>(h.num_hidden_layers), false);
  if (const json* pe = find(c, "position_embedding_type"); pe && (!pe->is_string() || *pe != "absolute"))
    fail(what, "position_embedding_type " + json_text::excerpt(*pe) + " is not \"absolute\", the only one qkv runs");
  for (const char* key : {"is_decoder", "add_cross_attention"})
    if (flag(c, key, what, false)) fail(what, "`" + std::string(key) + "` is true; qkv runs bert as an encoder only");
}
}  // namespace

HfConfig parse_hf_config(std::string_view text, const std::string& what) {
  const json c = parse_json(text, what);
  if (!c.is_object()) fail(what, "is not a JSON object");
  HfConfig h;
  const json* type = find(c, "model_type");
  if (!type || !type->is_string()) fail(what, "has no `model_type` string");
  h.model_type = type->get<std::string>();
  if (h.model_type == "gpt2") {
    read_gpt2(c, what, h);
    return h;
  }
  if (h.model_type == "bert") {
    read_bert(c, what, h);
    return h;
  }
  if (h.model_type != "llama" && h.model_type != "qwen2" && h.model_type != "mistral")
    fail(what, "model_type " + quote_text(h.model_type) + " is not one qkv runs (llama, qwen2, mistral, gpt2, bert)");
  if (const json* act = find(c, "hidden_act"); act && (!act->is_string() || act->get<std::string>() != "silu"))
    fail(what,
         "hidden_act " + json_text::excerpt(*act) + " is not \"silu\", the only activation of these models qkv runs");
  h.hidden_size = positive_int(c, "hidden_size", what);
  h.intermediate_size = positive_int(c, "intermediate_size", what);
  h.num_hidden_layers = positive_int(c, "num_hidden_layers", what);
  h.num_attention_heads = positive_int(c, "num_attention_heads", what);
  h.num_key_value_heads = positive_int(c, "num_key_value_heads", what, h.num_attention_heads);
  h.vocab_size = positive_int(c, "vocab_size", what);
  h.max_position_embeddings = positive_int(c, "max_position_embeddings", what, 2048);
  if (h.hidden_size % h.num_attention_heads != 0 && !find(c, "head_dim"))
    fail(what, "hidden_size (" + std::to_string(h.hidden_size) + ") is not a multiple of num_attention_heads (" +
                   std::to_string(h.num_attention_heads) + ") and there is no head_dim");
  h.head_dim = positive_int(c, "head_dim", what, h.hidden_size / h.num_attention_heads);
  if (h.head_dim % 2 != 0) fail(what, "head_dim " + std::to_string(h.head_dim) + " is odd; RoPE needs it even");
  if (h.num_attention_heads % h.num_key_value_heads != 0)
    fail(what, "num_attention_heads (" + std::to_string(h.num_attention_heads) +
                   ") is not a multiple of num_key_value_heads (" + std::to_string(h.num_key_value_heads) + ")");
  h.norm_eps = positive_number(c, "rms_norm_eps", what, 1e-6);
  h.rope_theta = positive_number(c, "rope_theta", what, 10000.0);
  h.tie_word_embeddings = flag(c, "tie_word_embeddings", what, false);
  if (const json* rs = find(c, "rope_scaling")) {
    if (!rs->is_object()) fail(what, "`rope_scaling` must be an object or null, is " + json_text::excerpt(*rs));
    const json* t = find(*rs, "rope_type");
    if (!t) t = find(*rs, "type");
    const std::string kind = t && t->is_string() ? t->get<std::string>() : "?";
    if (kind == "llama3") {
      const std::string w = what + " rope_scaling";
      HfConfig::Llama3Scaling s;
      s.factor = positive_number(*rs, "factor", w, s.factor);
      s.low_freq_factor = positive_number(*rs, "low_freq_factor", w, s.low_freq_factor);
      s.high_freq_factor = positive_number(*rs, "high_freq_factor", w, s.high_freq_factor);
      s.original_max_position_embeddings =
          positive_number(*rs, "original_max_position_embeddings", w, s.original_max_position_embeddings);
      if (!(s.high_freq_factor > s.low_freq_factor)) fail(w, "high_freq_factor must exceed low_freq_factor");
      h.rope_llama3 = s;
    } else if (kind != "default") {
      fail(what, "rope_scaling type " + quote_text(kind) + " is not supported (qkv implements llama3 and default)");
    }
  }
  // Biases: Llama's attention_bias puts them on q, k, v and o; Qwen2 always has q/k/v biases.
  if (h.model_type == "qwen2") {
    h.qkv_bias = true;
  } else if (h.model_type == "llama") {
    h.qkv_bias = h.o_bias = flag(c, "attention_bias", what, false);
  }
  // Sliding windows: Mistral's applies to every layer; Qwen2's only with use_sliding_window, from
  // layer max_window_layers on; Llama has none.
  h.windowed.assign(static_cast<std::size_t>(h.num_hidden_layers), false);
  if (h.model_type == "mistral" && find(c, "sliding_window")) {
    h.sliding_window = positive_int(c, "sliding_window", what);
    h.windowed.assign(h.windowed.size(), true);
  } else if (h.model_type == "qwen2" && flag(c, "use_sliding_window", what, false) && find(c, "sliding_window")) {
    h.sliding_window = positive_int(c, "sliding_window", what);
    const std::int64_t from = find(c, "max_window_layers") ? positive_int(c, "max_window_layers", what) : 28;
    for (std::int64_t i = from; i < h.num_hidden_layers; ++i) h.windowed[static_cast<std::size_t>(i)] = true;
  }
  return h;
}

std::vector<WeightShape> hf_weight_shapes(const HfConfig& h, bool pooler) {
  const std::int64_t E = h.hidden_size, I = h.intermediate_size, V = h.vocab_size;
  const std::int64_t Q = h.num_attention_heads * h.head_dim, KV = h.num_key_value_heads * h.head_dim;
  std::vector<WeightShape> want;
  auto layer_norm = [&](const std::string& p) {
    want.push_back({p + ".weight", {E}});
    want.push_back({p + ".bias", {E}});
  };
  auto linear = [&](const std::string& p, std::int64_t in, std::int64_t out) {
    want.push_back({p + ".weight", {out, in}});  // torch.nn.Linear: [out, in]
    want.push_back({p + ".bias", {out}});
  };
  if (h.bert()) {
    want.push_back({"embeddings.word_embeddings.weight", {V, E}});
    want.push_back({"embeddings.position_embeddings.weight", {h.max_position_embeddings, E}});
    want.push_back({"embeddings.token_type_embeddings.weight", {h.type_vocab_size, E}});
    layer_norm("embeddings.LayerNorm");
    for (std::int64_t i = 0; i < h.num_hidden_layers; ++i) {
      const std::string p = "encoder.layer." + std::to_string(i) + ".";
      for (const char* w : {"query", "key", "value"}) linear(p + "attention.self." + w, E, E);
      linear(p + "attention.output.dense", E, E);
      layer_norm(p + "attention.output.LayerNorm");
      linear(p + "intermediate.dense", E, I);
      linear(p + "output.dense", I, E);
      layer_norm(p + "output.LayerNorm");
    }
    if (pooler) linear("pooler.dense", E, E);
  } else if (h.gpt2()) {
    auto conv1d = [&](const std::string& p, std::int64_t in, std::int64_t out) {
      want.push_back({p + ".weight", {in, out}});  // Conv1D: [in, out]
      want.push_back({p + ".bias", {out}});
    };
    want.push_back({"wte.weight", {V, E}});
    want.push_back({"wpe.weight", {h.max_position_embeddings, E}});
    for (std::int64_t i = 0; i < h.num_hidden_layers; ++i) {
      const std::string p = "h." + std::to_string(i) + ".";
      layer_norm(p + "ln_1");
      conv1d(p + "attn.c_attn", E, 3 * E);
      conv1d(p + "attn.c_proj", E, E);
      layer_norm(p + "ln_2");
      conv1d(p + "mlp.c_fc", E, I);
      conv1d(p + "mlp.c_proj", I, E);
    }
    layer_norm("ln_f");
  } else {
    want.push_back({"model.embed_tokens.weight", {V, E}});
    for (std::int64_t i = 0; i < h.num_hidden_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      want.push_back({p + "input_layernorm.weight", {E}});
      want.push_back({p + "self_attn.q_proj.weight", {Q, E}});
      want.push_back({p + "self_attn.k_proj.weight", {KV, E}});
      want.push_back({p + "self_attn.v_proj.weight", {KV, E}});
      if (h.qkv_bias) {
        want.push_back({p + "self_attn.q_proj.bias", {Q}});
        want.push_back({p + "self_attn.k_proj.bias", {KV}});
        want.push_back({p + "self_attn.v_proj.bias", {KV}});
      }
      want.push_back({p + "self_attn.o_proj.weight", {E, Q}});
      if (h.o_bias) want.push_back({p + "self_attn.o_proj.bias", {E}});
      want.push_back({p + "post_attention_layernorm.weight", {E}});
      want.push_back({p + "mlp.gate_proj.weight", {I, E}});
      want.push_back({p + "mlp.up_proj.weight", {I, E}});
      want.push_back({p + "mlp.down_proj.weight", {E, I}});
    }
    want.push_back({"model.norm.weight", {E}});
  }
  if (!h.tie_word_embeddings && !h.bert()) want.push_back({"lm_head.weight", {V, E}});

  return want;
}

HfCheckpoint HfCheckpoint::open(const std::filesystem::path& dir, bool windows) {
  HfCheckpoint ck;
  ck.what_ = "model " + dir.string();
  ck.config_ = read_hf_config(dir);
  const HfConfig& h = ck.config_;
  // The shards.
  const auto single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  // transformers' precedence: model.safetensors when it exists, else the index and its shards.
  std::map<std::string, std::string> weight_map;  // name -> file
  ck.paths_.push_back(dir / "config.json");
  if (std::filesystem::exists(single)) {
    ck.files_.push_back(SafetensorsFile::open(single, windows));
    ck.paths_.push_back(single);
    ck.ignored_index_ = std::filesystem::exists(index);
    for (const auto& name : ck.files_[0].names()) weight_map[name] = "model.safetensors";
  } else if (std::filesystem::exists(index)) {
    weight_map = parse_weight_map(read_text(index), index.string());
    ck.paths_.push_back(index);
  } else {
    fail(ck.what_, "has neither model.safetensors nor model.safetensors.index.json");
  }
  std::map<std::string, std::size_t> file_index;
  if (ck.files_.size() == 1) file_index["model.safetensors"] = 0;
  for (const auto& [name, f] : weight_map) {
    if (!file_index.count(f)) {
      file_index[f] = ck.files_.size();
      ck.files_.push_back(SafetensorsFile::open(dir / f, windows));
      ck.paths_.push_back(dir / f);
    }
    const std::size_t k = file_index[f];
    if (!ck.files_[k].contains(name))
      fail((dir / f).string(), "has no " + quote_text(name, 80, '`') + ", which the index puts there");
    ck.where_[name] = k;
  }
  for (const auto& file : ck.files_)
    for (const auto& name : file.names())
      if (!ck.where_.count(name)) ck.where_[name] = static_cast<std::size_t>(&file - ck.files_.data());

  // The prefix before the names the graph uses: GPT2LMHeadModel.save_pretrained writes
  // `transformer.`, BertFor* `bert.`; the Hub's gpt2 files and BertModel's have none.
  // transformers loads either.
  std::string prefix;
  auto prefixed = [&](const std::string& first, const std::string& p) {
    if (!ck.where_.count(first) && ck.where_.count(p + first)) prefix = p;
  };
  if (h.bert()) {
    prefixed("embeddings.word_embeddings.weight", "bert.");
    ck.has_pooler_ = ck.where_.count(prefix + "pooler.dense.weight") > 0;
  } else if (h.gpt2()) {
    prefixed("wte.weight", "transformer.");
  }
  const std::string heads_note =
      h.bert() || h.gpt2()
          ? std::string()
          : " (num_attention_heads x head_dim = " + std::to_string(h.num_attention_heads * h.head_dim) + ")";
  const std::vector<WeightShape> want = hf_weight_shapes(h, ck.has_pooler_);

  std::set<std::string> used;
  for (const auto& [name, shape] : want) {
    std::string s = name == "lm_head.weight" ? name : prefix + name;
    // Old BERT checkpoints name a LayerNorm's weight and bias gamma and beta (transformers renames them).
    if (h.bert() && !ck.where_.count(s) && name.find("LayerNorm.") != std::string::npos) {
      const std::string legacy = s.substr(0, s.rfind('.')) + (name.ends_with(".weight") ? ".gamma" : ".beta");
      if (ck.where_.count(legacy)) s = legacy;
    }
    ck.stored_[name] = s;
    // Stored quantized: q8 of the weight's shape (or q4's half of it), and its scales (groups of 32).
    std::optional<Quant> format;
    for (const Quant f : {Quant::q8, Quant::q4})
      if (ck.where_.count(s + quant_suffix(f)) || ck.where_.count(s + quant_scale_suffix(f))) format = f;
    if (!ck.where_.count(s) && shape.size() == 2 && format) {
      const std::string q = s + quant_suffix(*format), qs = s + quant_scale_suffix(*format);
      auto expect = [&](const std::string& t_name, DType dtype, const std::vector<std::int64_t>& t_shape) {
        const auto at = ck.where_.find(t_name);
        if (at == ck.where_.end())
          fail(ck.what_, "the checkpoint has `" + (t_name == q ? qs : q) + "` but no `" + t_name + "`");
        const TensorView t = ck.files_[at->second].get(t_name);
        if (t.dtype != dtype || t.shape != t_shape)
          fail(ck.what_, "`" + t_name + "` is " + std::string(dtype_name(t.dtype)) + " " + shape_text(t.shape) +
                             ", a " + std::string(quant_name(*format)) + " weight of shape " + shape_text(shape) +
                             " needs " + std::string(dtype_name(dtype)) + " " + shape_text(t_shape));
        used.insert(t_name);
      };
      if (!quantizable(*format, shape[1], kQuantGroup))
        fail(ck.what_, "`" + q + "` stores a weight of " + std::to_string(shape[1]) + " columns, not a multiple of " +
                           std::to_string(kQuantGroup) + " that " + std::string(quant_name(*format)) + " needs");
      expect(q, DType::i8, quant_q_shape(*format, shape[0], shape[1]));
      expect(qs, DType::f16, quant_scale_shape(shape[0], shape[1], kQuantGroup));
      ck.quant_[name] = *format;
      ck.names_.push_back(name);
      continue;
    }
    const auto it = ck.where_.find(s);
    if (it == ck.where_.end()) fail(ck.what_, "the checkpoint has no `" + s + "`");
    const TensorView t = ck.files_[it->second].get(s);
    if (t.dtype != DType::f32 && t.dtype != DType::bf16 && t.dtype != DType::f16)
      fail(ck.what_, "`" + s + "` is " + std::string(dtype_name(t.dtype)) + "; qkv reads F32, BF16 and F16 weights");
    if (t.shape != shape)
      fail(ck.what_,
           "`" + s + "` is " + shape_text(t.shape) + ", config.json makes it " + shape_text(shape) +
               (name.find("q_proj") != std::string::npos || name.find("o_proj") != std::string::npos ? heads_note
                                                                                                     : std::string()));
    ck.names_.push_back(name);
    used.insert(s);
  }
  for (const auto& [name, k] : ck.where_) {
    if (used.count(name)) continue;
    // Buffers transformers recomputes: rotary inv_freq, GPT-2's causal-mask `attn.bias` and
    // `attn.masked_bias` (in older checkpoints); and a head tied to the embeddings.
    const bool inv_freq = name.size() > 9 && name.ends_with("inv_freq");
    const bool mask_buffer = h.gpt2() && (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"));
    const bool tied_head = name == "lm_head.weight" && h.tie_word_embeddings;
    // BertFor*'s task heads (BertModel's weights are what qkv runs) and position_ids buffers.
    const bool bert_extra = h.bert() && (name.starts_with("cls.") || name.ends_with("position_ids"));
    if (!inv_freq && !mask_buffer && !tied_head && !bert_extra)
      fail(ck.what_, "the checkpoint has " + quote_text(name, 80, '`') + ", which a " + h.model_type +
                         " model with this config.json does not use");
  }
  return ck;
}

const std::string& HfCheckpoint::stored(const std::string& name) const {
  const auto it = stored_.find(name);
  if (it == stored_.end()) fail(what_, "the model reads no weight `" + name + "`");
  return it->second;
}

NdArray HfCheckpoint::load(const std::string& name) const {
  const std::string& s = stored(name);
  if (quantized(name)) return dequantize_weight(load_quantized(name), kQuantGroup);
  return files_[where_.at(s)].load(s);
}

DType HfCheckpoint::stored_dtype(const std::string& name) const {
  if (quantized(name)) return DType::f32;
  const std::string& s = stored(name);
  return files_[where_.at(s)].get(s).dtype;
}

NdArray HfCheckpoint::load_as(const std::string& name, DType as) const {
  if (quantized(name)) return load(name).converted(as);
  const std::string& s = stored(name);
  return files_[where_.at(s)].load_as(s, as);
}

QuantizedWeight HfCheckpoint::load_quantized(const std::string& name) const {
  const auto it = quant_.find(name);
  if (it == quant_.end()) fail(what_, "`" + stored(name) + "` is not stored quantized");
  const std::string q = stored(name) + quant_suffix(it->second), qs = stored(name) + quant_scale_suffix(it->second);
  return {files_[where_.at(q)].load(q), files_[where_.at(qs)].load(qs), it->second};
}

std::uint64_t HfCheckpoint::f32_bytes() const {
  std::uint64_t total = 0;
  for (const auto& n : names_) {
    const auto q = quant_.find(n);
    const std::string s = q != quant_.end() ? stored(n) + quant_suffix(q->second) : stored(n);
    std::vector<std::int64_t> shape = files_[where_.at(s)].get(s).shape;
    if (q != quant_.end() && q->second == Quant::q4) shape.back() *= 2;
    total += checked_nbytes(shape, DType::f32, what_);
  }
  return total;
}

}  // namespace qkv
