// qkv run causal-lm and qkv generate: Hugging Face decoder checkpoints (llama, qwen2, mistral)
// on token ids.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include <qkv/codegen/jit.hpp>
#include <qkv/runtime/decoder_session.hpp>

#include <qkv/runtime/hf_checkpoint.hpp>
#include <qkv/runtime/io/npy.hpp>

#include "commands.hpp"
#include "memory.hpp"
#include "out_of_memory.hpp"
#include "run_common.hpp"

namespace qkv::cli {

namespace {

/// The token ids of `flag`: an integer array [B, L] or [L] (one sequence), each in [0, vocab).
NdArray load_token_ids(const std::string& path, const std::string& flag, std::int64_t vocab) {
  NdArray ids = load_npy(path, flag);
  if (ids.dtype != DType::i32 && ids.dtype != DType::i64)
    throw IoError(flag + ": token ids must be an integer array (int32 or int64), not " +
                  std::string(dtype_name(ids.dtype)));
  if (ids.shape.size() == 1) ids.shape.insert(ids.shape.begin(), 1);
  if (ids.shape.size() != 2 || ids.shape[1] == 0)
    throw IoError(flag + ": token ids must be [batch, length] or [length] with length > 0, not " +
                  shape_to_string(ids.shape));
  const std::vector<float> v = ids.to_f32();
  for (std::size_t k = 0; k < v.size(); ++k)
    if (!(v[k] >= 0 && v[k] < static_cast<float>(vocab)))
      throw IoError(flag + ": token id " + std::to_string(static_cast<long long>(v[k])) + " at index " +
                    std::to_string(k) + " is outside the vocabulary of " + std::to_string(vocab));
  return ids;
}

/// Positions 0 .. L-1 of every sequence, [B, L] i64.
NdArray positions_for(std::int64_t batch, std::int64_t len, std::int64_t start = 0) {
  NdArray p = NdArray::zeros(DType::i64, {batch, len});
  auto v = p.as<std::int64_t>();
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < len; ++i) v[static_cast<std::size_t>(b * len + i)] = start + i;
  return p;
}

/// The checkpoint's weights as feeds (f32), with a note when they were stored otherwise.
Feeds weight_feeds(const HfCheckpoint& ck) {
  require_memory(ck.f32_bytes(), "reading the weights of the model");
  const auto types = ck.dtypes();
  for (DType t : types)
    if (t != DType::f32) {
      std::fprintf(stderr, "qkv: note: the weights are stored as %s; they are converted to f32 (computing in f32)\n",
                   std::string(dtype_name(t)).c_str());
      break;
    }
  Feeds feeds;
  for (const auto& name : ck.names()) feeds[name] = ck.load_f32(name);
  return feeds;
}

}  // namespace

int run_causal_lm(const RunCausalLm& o) {
  OutputGroup outputs;
  protect_inputs(outputs, {{o.tokens, "--tokens"}});
  for (const char* f : {"config.json", "model.safetensors", "model.safetensors.index.json"})
    outputs.protect(std::filesystem::path(o.model) / f, "--model");
  const std::size_t logits_file = outputs.add_file(o.logits_out, "--logits-out");

  const Activity reading("reading the model");
  const HfCheckpoint ck = HfCheckpoint::open(o.model);
  const HfConfig& c = ck.config();
  NdArray tokens = load_token_ids(o.tokens, "--tokens", c.vocab_size);
  const std::int64_t B = tokens.shape[0], L = tokens.shape[1];
  if (L > c.max_position_embeddings)
    std::fprintf(stderr, "qkv: note: %lld tokens exceed max_position_embeddings (%lld) of the model\n",
                 static_cast<long long>(L), static_cast<long long>(c.max_position_embeddings));
  Feeds feeds = weight_feeds(ck);
  feeds["tokens"] = std::move(tokens);
  feeds["positions"] = positions_for(B, L);
  const RunResult r = run_model(build_causal_lm(c), feeds, o.backend, o.stats);

  const Activity writing("writing the outputs");
  stage_npy(outputs, logits_file, r.outputs.at("logits"));
  outputs.commit();
  return 0;
}

namespace {

/// The next token of each sequence from its logits [vocab]: the argmax (temperature 0), or a
/// draw from softmax(logits / T) over the top k (all when k is 0).
std::int64_t choose(std::span<const float> logits, const Generate& o, std::mt19937_64& rng) {
  const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
  if (o.temperature <= 0) return best;
  std::vector<std::size_t> order(logits.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  const std::size_t k =
      o.top_k > 0 ? std::min<std::size_t>(static_cast<std::size_t>(o.top_k), order.size()) : order.size();
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](std::size_t a, std::size_t b) { return logits[a] > logits[b]; });
  std::vector<double> w(k);
  const double top = logits[order[0]];
  for (std::size_t i = 0; i < k; ++i) w[i] = std::exp((logits[order[i]] - top) / o.temperature);
  std::discrete_distribution<std::size_t> pick(w.begin(), w.end());
  return static_cast<std::int64_t>(order[pick(rng)]);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int generate(const Generate& o) {
  if (o.new_tokens <= 0) throw UsageError("--new-tokens must be positive");
  if (!(std::isfinite(o.temperature) && o.temperature >= 0)) throw UsageError("--temperature must be >= 0");
  if (o.top_k < 0) throw UsageError("--top-k must be >= 0");
  if (o.top_k > 0 && o.temperature == 0) throw UsageError("--top-k samples: give a --temperature > 0 with it");
  OutputGroup outputs;
  protect_inputs(outputs, {{o.prompt_ids, "--prompt-ids"}});
  for (const char* f : {"config.json", "model.safetensors", "model.safetensors.index.json"})
    outputs.protect(std::filesystem::path(o.model) / f, "--model");
  const std::size_t ids_file = outputs.add_file(o.out, "--out");
  const std::size_t logits_file = o.logits_out.empty() ? 0 : outputs.add_file(o.logits_out, "--logits-out");

  const Activity reading("reading the model");
  const HfCheckpoint ck = HfCheckpoint::open(o.model);
  const HfConfig& c = ck.config();
  const NdArray prompt = load_token_ids(o.prompt_ids, "--prompt-ids", c.vocab_size);
  const std::int64_t B = prompt.shape[0], P = prompt.shape[1], N = o.new_tokens;
  const std::int64_t total = P + N;
  if (total > c.max_position_embeddings)
    std::fprintf(stderr, "qkv: note: %lld positions exceed max_position_embeddings (%lld) of the model\n",
                 static_cast<long long>(total), static_cast<long long>(c.max_position_embeddings));
  // The cache at its largest, twice (the past and the present of a step), beside the weights.
  const std::uint64_t cache =
      2ull * 2 * static_cast<std::uint64_t>(c.num_hidden_layers * B * c.num_key_value_heads * total * c.head_dim) * 4;
  require_memory(cache, "the KV cache");
  DecoderSession session(build_causal_lm_step(c), weight_feeds(ck),
                         {.layers = c.num_hidden_layers,
                          .kv_heads = c.num_key_value_heads,
                          .head_dim = c.head_dim,
                          .batch = B,
                          .capacity = total},
                         [&](const Graph& g, const Feeds& f) { return run_graph(g, f, o.backend, o.threads); });

  const Activity running("generating");
  std::mt19937_64 rng(o.seed);
  const std::size_t V = static_cast<std::size_t>(c.vocab_size);
  NdArray ids = NdArray::zeros(DType::i64, {B, total});
  NdArray chosen_logits = NdArray::zeros(DType::f32, {B, N, c.vocab_size});
  const std::vector<float> p = prompt.to_f32();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < P; ++t)
      ids.as<std::int64_t>()[static_cast<std::size_t>(b * total + t)] =
          static_cast<std::int64_t>(p[static_cast<std::size_t>(b * P + t)]);
  auto t0 = std::chrono::steady_clock::now();
  NdArray logits = session.prefill(prompt);
  const double prefill_ms = ms_since(t0);
  const std::int64_t modules_after_prefill = codegen::jit_stats().modules;
  double decode_ms = 0;
  NdArray next = NdArray::zeros(DType::i64, {B, 1});
  for (std::int64_t t = 0; t < N; ++t) {
    const std::int64_t len = logits.shape[1];
    const auto lv = logits.as<float>();
    for (std::int64_t b = 0; b < B; ++b) {
      const std::span<const float> row = lv.subspan(static_cast<std::size_t>((b * len + len - 1)) * V, V);
      std::copy(row.begin(), row.end(),
                chosen_logits.as<float>().begin() + static_cast<std::ptrdiff_t>((b * N + t) * c.vocab_size));
      const std::int64_t id = choose(row, o, rng);
      ids.as<std::int64_t>()[static_cast<std::size_t>(b * total + P + t)] = id;
      next.as<std::int64_t>()[static_cast<std::size_t>(b)] = id;
    }
    if (t + 1 == N) break;
    t0 = std::chrono::steady_clock::now();
    logits = session.decode(next);
    decode_ms += ms_since(t0);
  }
  const long long compiled = static_cast<long long>(codegen::jit_stats().modules - modules_after_prefill);
  std::fprintf(stderr,
               "qkv: prefill: %lld tokens in %.1f ms (%.1f tokens/s); decode: %lld steps in %.1f ms (%.1f tokens/s); "
               "%lld module(s) compiled after the prefill\n",
               static_cast<long long>(B * P), prefill_ms, 1e3 * static_cast<double>(B * P) / prefill_ms,
               static_cast<long long>(N - 1), decode_ms,
               N > 1 ? 1e3 * static_cast<double>(B * (N - 1)) / decode_ms : 0.0, compiled);

  const Activity writing("writing the outputs");
  stage_npy(outputs, ids_file, ids);
  if (!o.logits_out.empty()) stage_npy(outputs, logits_file, chosen_logits);
  outputs.commit();
  return 0;
}

}  // namespace qkv::cli
