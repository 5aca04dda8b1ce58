// qkv run mha | sdpa | encoder-layer | encoder: PyTorch's modules on .npy inputs and a
// safetensors state dict, through the reference interpreter.
#include <dlfcn.h>

#include <cmath>
#include <limits>
#include <map>

#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/io/npy.hpp>
#include <qkv/runtime/io/safetensors.hpp>
#include <qkv/runtime/torch_import.hpp>

#include "commands.hpp"
#include "run_common.hpp"

namespace qkv::cli {

Backend parse_backend(const std::string& s) {
  if (s == "reference") return Backend::reference;
  if (s == "cpu") return Backend::cpu;
  if (s == "cuda") return Backend::cuda;
  throw UsageError("--backend must be reference, cpu or cuda, not '" + s + "'");
}

Causal parse_causal(const std::optional<std::string>& flag, std::int64_t len_q, std::int64_t len_k) {
  if (!flag) return Causal::none;
  if (*flag == "top-left") return Causal::top_left;
  if (*flag == "bottom-right") return Causal::bottom_right;
  if (!flag->empty()) throw UsageError("--causal takes top-left or bottom-right, not '" + *flag + "'");
  if (len_q != len_k)
    throw UsageError("--causal: " + std::to_string(len_q) + " queries and " + std::to_string(len_k) +
                     " keys, so the alignment matters: say --causal top-left (PyTorch is_causal) or --causal "
                     "bottom-right (FlashAttention >= 2.1)");
  return Causal::top_left;
}

RunResult run_graph(const Graph& g, const Feeds& feeds, Backend backend) {
  switch (backend) {
    case Backend::reference:
      return interpret(g, feeds);
    case Backend::cuda: {
      void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
      if (!lib) throw std::runtime_error(std::string("no CUDA driver/GPU found: ") + dlerror());
      dlclose(lib);
      throw std::runtime_error("--backend cuda: the GPU backend is not part of this build yet");
    }
    case Backend::cpu:
      break;
  }
  throw std::runtime_error(
      "--backend cpu: the CPU code generator is not part of this build yet; use --backend reference");
}

NdArray load_npy(const std::string& path, const std::string& flag) {
  try {
    return read_npy(path);
  } catch (const IoError& e) {
    throw IoError(flag + ": " + e.what());
  }
}

std::string shape_str(const NdArray& a) { return shape_to_string(a.shape); }

NdArray bias_tensor(std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t s) {
  return NdArray::zeros(DType::f32, {b, h, l, s});
}

void apply_key_padding(NdArray& bias, const NdArray& kpm, const std::string& flag) {
  const auto& d = bias.shape;
  if (kpm.dtype != DType::boolean)
    throw IoError(flag + ": must be a bool array (true = ignore), got " + std::string(dtype_name(kpm.dtype)));
  if (kpm.shape != std::vector<std::int64_t>{d[0], d[3]})
    throw IoError(flag + ": shape " + shape_str(kpm) +
                  " must be [batch, S] = " + shape_to_string(std::vector{d[0], d[3]}));
  const auto ignore = kpm.as<bool>();
  auto out = bias.as<float>();
  for (std::int64_t b = 0; b < d[0]; ++b)
    for (std::int64_t h = 0; h < d[1]; ++h)
      for (std::int64_t i = 0; i < d[2]; ++i)
        for (std::int64_t j = 0; j < d[3]; ++j)
          if (ignore[static_cast<std::size_t>(b * d[3] + j)])
            out[static_cast<std::size_t>(((b * d[1] + h) * d[2] + i) * d[3] + j)] =
                -std::numeric_limits<float>::infinity();
}

void apply_broadcast_mask(NdArray& bias, const NdArray& m, const std::string& flag, bool bool_means_blocked) {
  const auto& d = bias.shape;
  if (m.shape.size() > 4) throw IoError(flag + ": shape " + shape_str(m) + " has more than 4 axes");
  // NumPy broadcasting: align from the right; each axis 1 or equal to [B, H, L, S]'s.
  std::vector<std::int64_t> stride(4, 0);
  std::int64_t st = 1;
  for (std::size_t k = 0; k < m.shape.size(); ++k) {
    const std::size_t a = m.shape.size() - 1 - k, t = 3 - k;
    if (m.shape[a] != 1 && m.shape[a] != d[t])
      throw IoError(flag + ": shape " + shape_str(m) + " does not broadcast to [B, H, L, S] = " + shape_to_string(d));
    stride[t] = m.shape[a] == 1 ? 0 : st;
    st *= m.shape[a];
  }
  const std::vector<float> v = m.to_f32();
  auto out = bias.as<float>();
  for (std::int64_t b = 0; b < d[0]; ++b)
    for (std::int64_t h = 0; h < d[1]; ++h)
      for (std::int64_t i = 0; i < d[2]; ++i)
        for (std::int64_t j = 0; j < d[3]; ++j) {
          const float x = v[static_cast<std::size_t>(b * stride[0] + h * stride[1] + i * stride[2] + j * stride[3])];
          float& o = out[static_cast<std::size_t>(((b * d[1] + h) * d[2] + i) * d[3] + j)];
          if (m.dtype == DType::boolean) {
            if ((x != 0.0f) == bool_means_blocked) o = -std::numeric_limits<float>::infinity();
          } else {
            o += x;
          }
        }
}

/// PyTorch MHA's attn_mask: [L, S] or [B*H, L, S]; bool true = not allowed, float added.
void apply_mha_attn_mask(NdArray& bias, NdArray m, const std::string& flag) {
  const auto& d = bias.shape;
  if (m.shape.size() == 3 && m.shape[0] == d[0] * d[1])
    m.shape = {d[0], d[1], m.shape[1], m.shape[2]};
  else if (m.shape.size() != 2)
    throw IoError(flag + ": shape " + shape_str(m) + " must be [L, S] = " + shape_to_string(std::vector{d[2], d[3]}) +
                  " or [batch*heads, L, S] = " + shape_to_string(std::vector{d[0] * d[1], d[2], d[3]}));
  if (m.shape.size() == 2 && m.shape != std::vector<std::int64_t>{d[2], d[3]})
    throw IoError(flag + ": shape " + shape_str(m) + " must be [L, S] = " + shape_to_string(std::vector{d[2], d[3]}));
  apply_broadcast_mask(bias, m, flag, /*bool_means_blocked=*/true);
}

namespace {

std::int64_t dim(const NdArray& a, std::size_t k) { return a.shape.at(k); }

void expect_rank(const NdArray& a, std::size_t rank, const std::string& flag, const std::string& layout) {
  if (a.shape.size() != rank)
    throw IoError(flag + ": shape " + shape_str(a) + " must be " + layout + " (" + std::to_string(rank) + " axes)");
  if (a.dtype == DType::boolean) throw IoError(flag + ": must be a float array, got bool");
}

void expect_width(const NdArray& a, std::int64_t want, const std::string& flag, const std::string& what) {
  if (a.shape.back() != want)
    throw IoError(flag + ": the last axis is " + std::to_string(a.shape.back()) + " but " + what + " is " +
                  std::to_string(want) + " (from the weights)");
}

}  // namespace

int run_mha(const RunMha& o) {
  if (o.heads <= 0) throw UsageError("--heads must be positive");
  const SafetensorsFile sd = SafetensorsFile::open(o.weights);
  const MhaConfig cfg = infer_mha_config(sd, o.heads);
  Feeds feeds = import_mha(sd, cfg);

  NdArray q = load_npy(o.query, "--query");
  expect_rank(q, 3, "--query", "[batch, L, embed_dim]");
  expect_width(q, cfg.embed_dim, "--query", "embed_dim");
  const bool cross = !o.key.empty() || !o.value.empty() || cfg.separate_qkv;
  NdArray k = o.key.empty() ? q : load_npy(o.key, "--key");
  NdArray v = o.value.empty() ? k : load_npy(o.value, "--value");
  expect_rank(k, 3, "--key", "[batch, S, kdim]");
  expect_rank(v, 3, "--value", "[batch, S, vdim]");
  expect_width(k, cfg.kdim, "--key", "kdim");
  expect_width(v, cfg.vdim, "--value", "vdim");
  if (dim(k, 0) != dim(q, 0) || dim(v, 0) != dim(q, 0))
    throw IoError("--key/--value: batch " + std::to_string(dim(k, 0)) + "/" + std::to_string(dim(v, 0)) +
                  " must equal the query's batch " + std::to_string(dim(q, 0)));
  if (dim(k, 1) != dim(v, 1))
    throw IoError("--key has S = " + std::to_string(dim(k, 1)) + " positions but --value has " +
                  std::to_string(dim(v, 1)) + "; keys and values come from one sequence");
  const std::int64_t B = dim(q, 0), L = dim(q, 1), S = dim(k, 1);
  const std::int64_t extra = (cfg.add_bias_kv ? 1 : 0) + (o.add_zero_attn ? 1 : 0);

  if (cfg.separate_qkv && extra > 0)
    throw std::runtime_error("add_bias_kv/--add-zero-attn with kdim/vdim != embed_dim is not supported yet");
  MhaModel m;
  m.heads = o.heads;
  m.cross = cross;
  m.separate_qkv = cfg.separate_qkv;
  m.bias = cfg.bias;
  m.add_bias_kv = cfg.add_bias_kv;
  m.add_zero_attn = o.add_zero_attn;
  m.causal = parse_causal(o.causal, L, S);
  if (m.causal != Causal::none && extra > 0)
    throw UsageError(
        "--causal cannot be combined with add_bias_kv/--add-zero-attn (the appended keys have no position); "
        "pass an --attn-mask instead");
  if (!o.key_padding_mask.empty() || !o.attn_mask.empty()) {
    NdArray bias = bias_tensor(B, o.heads, L, S);
    if (!o.key_padding_mask.empty())
      apply_key_padding(bias, load_npy(o.key_padding_mask, "--key-padding-mask"), "--key-padding-mask");
    if (!o.attn_mask.empty()) apply_mha_attn_mask(bias, load_npy(o.attn_mask, "--attn-mask"), "--attn-mask");
    feeds["attn_bias"] = std::move(bias);
    m.attn_bias = true;
  }
  feeds["query"] = std::move(q);
  if (cross) {
    feeds["key"] = std::move(k);
    feeds["value"] = std::move(v);
  }
  const RunResult r = run_graph(build_mha(m), feeds, o.backend);

  std::vector<std::pair<std::string, NdArray>> files{{o.out, r.outputs.at("out")}};
  if (o.need_weights || !o.weights_out.empty() || o.per_head_weights) {
    if (o.weights_out.empty()) throw UsageError("--need-weights/--per-head-weights: say where with --weights-out");
    const NdArray& w = r.outputs.at("weights");
    files.emplace_back(o.weights_out, o.per_head_weights ? w : mean_over_axis(w, 1));
  }
  write_all(files);
  return 0;
}

int run_sdpa(const RunSdpa& o) {
  NdArray q = load_npy(o.query, "--query"), k = load_npy(o.key, "--key"), v = load_npy(o.value, "--value");
  expect_rank(q, 4, "--query", "[batch, heads, L, D]");
  expect_rank(k, 4, "--key", "[batch, heads, S, D]");
  expect_rank(v, 4, "--value", "[batch, heads, S, Dv]");
  for (std::size_t a = 0; a < 2; ++a)
    if (dim(k, a) != dim(q, a) || dim(v, a) != dim(q, a))
      throw IoError(std::string(a == 0 ? "batch" : "heads") + " of --key " + shape_str(k) + " and --value " +
                    shape_str(v) + " must equal the query's " + shape_str(q));
  if (dim(k, 3) != dim(q, 3))
    throw IoError("--key: D = " + std::to_string(dim(k, 3)) + " but --query has D = " + std::to_string(dim(q, 3)));
  if (dim(v, 2) != dim(k, 2))
    throw IoError("--value has S = " + std::to_string(dim(v, 2)) + " but --key has S = " + std::to_string(dim(k, 2)));
  if (o.dropout < 0.0 || o.dropout >= 1.0) throw UsageError("--dropout must be in [0, 1)");
  const std::int64_t B = dim(q, 0), H = dim(q, 1), L = dim(q, 2), S = dim(k, 2);

  SdpaModel m;
  m.causal = parse_causal(o.causal, L, S);
  m.scale = o.scale;
  m.dropout = o.dropout;
  m.seed = o.seed;
  Feeds feeds{{"q", std::move(q)}, {"k", std::move(k)}, {"v", std::move(v)}};
  if (!o.attn_bias.empty() || !o.attn_mask.empty() || !o.key_padding_mask.empty()) {
    NdArray bias = bias_tensor(B, H, L, S);
    if (!o.attn_bias.empty()) {
      NdArray b = load_npy(o.attn_bias, "--attn-bias");
      if (b.dtype == DType::boolean) throw IoError("--attn-bias: must be float (use --attn-mask for a bool mask)");
      apply_broadcast_mask(bias, b, "--attn-bias", true);
    }
    if (!o.attn_mask.empty()) {
      NdArray mk = load_npy(o.attn_mask, "--attn-mask");
      if (mk.dtype != DType::boolean)
        throw IoError("--attn-mask: must be bool (true = not allowed); use --attn-bias for floats");
      apply_broadcast_mask(bias, mk, "--attn-mask", true);
    }
    if (!o.key_padding_mask.empty())
      apply_key_padding(bias, load_npy(o.key_padding_mask, "--key-padding-mask"), "--key-padding-mask");
    feeds["attn_bias"] = std::move(bias);
    m.attn_bias = true;
  }
  const RunResult r = run_graph(build_sdpa(m), feeds, o.backend);
  std::vector<std::pair<std::string, NdArray>> files{{o.out, r.outputs.at("out")}};
  if (!o.weights_out.empty()) files.emplace_back(o.weights_out, r.outputs.at("weights"));
  write_all(files);
  return 0;
}

int run_encoder(const RunEncoder& o) {
  if (o.heads <= 0) throw UsageError("--heads must be positive");
  if (o.activation != "relu" && o.activation != "gelu") throw UsageError("--activation must be relu or gelu");
  if (o.causal && !o.src_mask.empty()) throw UsageError("--src-mask and --causal are alternatives; give one");
  const SafetensorsFile sd = SafetensorsFile::open(o.weights);
  EncoderModel m;
  m.heads = o.heads;
  m.gelu = o.activation == "gelu";
  m.norm_first = o.norm_first;
  m.eps = o.eps;
  m.stack = o.stack;
  Feeds feeds;
  std::int64_t E = 0;
  if (o.stack) {
    while (sd.contains("layers." + std::to_string(m.layers) + ".linear1.weight")) ++m.layers;
    m.layers = std::max<std::int64_t>(m.layers, 0);
    if (m.layers == 0)
      throw StateDictError("state dict " + o.weights + ": no 'layers.0.*' keys (nn.TransformerEncoder)");
    for (std::int64_t i = 0; i < m.layers; ++i) {
      const std::string p = "layers." + std::to_string(i) + ".";
      const auto cfg = infer_encoder_layer_config(sd, o.heads, p);
      E = cfg.self_attn.embed_dim;
      feeds.merge(import_encoder_layer(sd, cfg, p));
    }
    m.final_norm = sd.contains("norm.weight");
    if (m.final_norm) {
      feeds["norm.weight"] = sd.load("norm.weight");
      feeds["norm.bias"] = sd.load("norm.bias");
    }
  } else {
    const auto cfg = infer_encoder_layer_config(sd, o.heads);
    E = cfg.self_attn.embed_dim;
    feeds = import_encoder_layer(sd, cfg);
  }
  NdArray src = load_npy(o.src, "--src");
  expect_rank(src, 3, "--src", "[batch, L, d_model]");
  expect_width(src, E, "--src", "d_model");
  const std::int64_t B = dim(src, 0), L = dim(src, 1);
  m.causal = parse_causal(o.causal, L, L);
  if (!o.src_key_padding_mask.empty() || !o.src_mask.empty()) {
    NdArray bias = bias_tensor(B, o.heads, L, L);
    if (!o.src_key_padding_mask.empty())
      apply_key_padding(bias, load_npy(o.src_key_padding_mask, "--src-key-padding-mask"), "--src-key-padding-mask");
    if (!o.src_mask.empty()) apply_mha_attn_mask(bias, load_npy(o.src_mask, "--src-mask"), "--src-mask");
    feeds["attn_bias"] = std::move(bias);
    m.attn_bias = true;
  }
  feeds["src"] = std::move(src);
  const RunResult r = run_graph(build_encoder(m), feeds, o.backend);
  write_all({{o.out, r.outputs.at("out")}});
  return 0;
}

}  // namespace qkv::cli
