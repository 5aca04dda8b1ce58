// qkv run causal-lm and qkv generate: Hugging Face decoder checkpoints (llama, qwen2, mistral, gpt2)
// on token ids; qkv run encoder-model: an encoder checkpoint (bert).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <optional>
#include <random>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/cpu/run_attention.hpp>

#include <qkv/codegen/jit.hpp>
#include <qkv/ir/float_dtype.hpp>
#include <qkv/runtime/decoder_session.hpp>

#include <qkv/runtime/hf_checkpoint.hpp>
#include <qkv/runtime/io/npy.hpp>
#include <qkv/runtime/io/safetensors.hpp>
#include <qkv/runtime/quantize.hpp>

#include "commands.hpp"
#include "memory.hpp"
#include "out_of_memory.hpp"
#include "run_common.hpp"
#include "tokenizer.hpp"

namespace qkv::cli {

namespace {

/// The token ids of `flag`: an integer array [B, L] or [L] (one sequence), each in [0, vocab)
/// (with `padded`, or −1 after a row's last id: rows of different lengths); `table` names what
/// vocab counts in messages.
NdArray load_token_ids(const std::string& path, const std::string& flag, std::int64_t vocab,
                       const std::string& table = "the vocabulary", bool padded = false) {
  NdArray ids = load_npy(path, flag);
  if (ids.dtype != DType::i32 && ids.dtype != DType::i64)
    throw IoError(flag + ": token ids must be an integer array (int32 or int64), not " +
                  std::string(dtype_name(ids.dtype)));
  if (ids.shape.size() == 1) ids.shape.insert(ids.shape.begin(), 1);
  if (ids.shape.size() != 2 || ids.shape[1] == 0)
    throw IoError(flag + ": token ids must be [batch, length] or [length] with length > 0, not " +
                  shape_to_string(ids.shape));
  const std::vector<float> v = ids.to_f32();
  const auto L = static_cast<std::size_t>(ids.shape[1]);
  for (std::size_t k = 0; k < v.size(); ++k) {
    if (padded && v[k] == -1) {
      if (k % L == 0)
        throw IoError(flag + ": row " + std::to_string(k / L) + " is all padding (-1): each needs a token id first");
      continue;
    }
    if (padded && k % L > 0 && v[k - 1] == -1)
      throw IoError(flag + ": token id at index " + std::to_string(k) +
                    " follows padding (-1): pad a shorter row at its end only");
    if (!(v[k] >= 0 && v[k] < static_cast<float>(vocab)))
      throw IoError(flag + ": token id " + std::to_string(static_cast<long long>(v[k])) + " at index " +
                    std::to_string(k) + " is outside " + table + " of " + std::to_string(vocab));
  }
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

/// The checkpoint's weights as feeds for a model computing in `dtype`; those named in `quantize`
/// quantized as each is read (as `format`: quantize_linear_weights then takes them), so that the
/// unquantized weights are never all resident. A weight the checkpoint stores quantized is read as
/// stored when it is in `quantize` (else dequantized: a linear layer's in the checkpoint that this
/// model reads otherwise). With a half `dtype` (--dtype bf16 / f16), each float weight is
/// converted from the file's bytes as it is read (HfCheckpoint::load_as: no f32 copy) and named in
/// `converted` (for model_as' note): converting them all after reading them had peaked at the f32
/// size plus the converted one (2.21 GB for a 1.94 GB checkpoint in bf16), converting each f32
/// copy as it was read at 1.42 GB (the 262 MB embedding's f32 copy beside its bf16 one).
Feeds weight_feeds(const HfCheckpoint& ck, DType dtype, std::vector<Converted>& converted,
                   const std::vector<std::string>& quantize = {}, Quant format = Quant::q8) {
  require_memory(ck.f32_bytes(), "reading the weights of the model");
  Feeds feeds;
  for (const auto& name : ck.names()) {
    const bool linear = std::find(quantize.begin(), quantize.end(), name) != quantize.end();
    if (linear && ck.quantized(name)) {
      add_quantized_feeds(feeds, name, ck.load_quantized(name));
      continue;
    }
    const DType stored = ck.stored_dtype(name);
    const bool convert = dtype != DType::f32 && stored != dtype && is_model_float(stored);
    // Converted as it is read (no f32 copy beside the converted one) unless it is quantized.
    NdArray w = convert && !linear ? ck.load_as(name, dtype) : ck.load(name);
    if (linear && w.shape.size() == 2) {
      add_quantized_feeds(feeds, name, w, format);
      continue;
    }
    if (convert) {
      converted.push_back({name, stored});
      if (w.dtype != dtype) w = w.converted(dtype);
    }
    feeds[name] = std::move(w);
  }
  return feeds;
}

/// The model as it runs: the checkpoint's weights read into `feeds`, the graph stored as `dtype`
/// (model_as); with --quantize q8 / q4, or a checkpoint whose linear weights are stored quantized
/// (`qkv quantize`), each linear weight quantized as it is read (or read as stored), the graph's
/// linear layers reading them so, and a note of what that saved.
Graph model_with_weights(const Graph& model, const HfCheckpoint& ck, DType dtype, std::optional<Quant> quant,
                         Feeds& feeds) {
  const bool quantize = quant || ck.any_quantized();
  std::vector<Converted> converted;
  Feeds weights =
      weight_feeds(ck, dtype, converted, quantize ? quantizable_linear_weights(model) : std::vector<std::string>{},
                   quant.value_or(Quant::q8));
  feeds.merge(weights);
  Graph g = model_as(model, dtype, feeds, converted);
  if (!quantize) return g;
  QuantizedModel m = quantize_linear_weights(g, feeds, quant.value_or(Quant::q8));
  std::fprintf(stderr, "qkv: note: %zu linear weights %s %s (%.1f MB in f32 -> %.1f MB)\n", m.weights.size(),
               ck.any_quantized() ? "read as stored in" : "quantized to", quant_summary(m.formats).c_str(),
               static_cast<double>(m.bytes_before) / 1e6, static_cast<double>(m.bytes_after) / 1e6);
  return std::move(m.graph);
}

/// Opens the checkpoint in `dir`, a decoder's (or with `encoder`, an encoder's); no output may be
/// any file it read (the config, every shard, the index; by device and inode, so through links too).
HfCheckpoint open_model(OutputGroup& outputs, const std::string& dir, bool encoder = false, bool mmap = true) {
  HfCheckpoint ck = HfCheckpoint::open(dir, mmap);
  const std::string& type = ck.config().model_type;
  if (ck.config().bert() && !encoder)
    throw UsageError("--model " + dir + ": a " + type + " model is an encoder; run it with `qkv run encoder-model`");
  if (!ck.config().bert() && encoder)
    throw UsageError("--model " + dir + ": a " + type +
                     " model is a decoder; run it with `qkv run causal-lm` or `qkv generate`");
  for (const auto& f : ck.files()) outputs.protect(f, "--model");
  return ck;
}

/// Says on stderr which weights a command that succeeded read (a failure stays one line).
void say_weights(const HfCheckpoint& ck) {
  const auto& files = ck.files();
  if (ck.ignored_index())
    std::fprintf(stderr,
                 "qkv: weights: %s (model.safetensors.index.json and its shards are ignored, as transformers "
                 "ignores them)\n",
                 files[1].c_str());
  else if (files[1].filename() == "model.safetensors.index.json")
    std::fprintf(stderr, "qkv: weights: %zu shard(s) listed by %s\n", files.size() - 2, files[1].c_str());
  else
    std::fprintf(stderr, "qkv: weights: %s\n", files[1].c_str());
}

/// The first non-finite value of the checkpoint's weights, as "`name` has nan at index i", or ""
/// when every weight is finite: what a non-finite logit is checked against (read only then).
std::string first_non_finite_weight(const HfCheckpoint& ck) {
  for (const auto& name : ck.names()) {
    const std::vector<float> w = ck.load(name).to_f32();
    for (std::size_t i = 0; i < w.size(); ++i)
      if (!std::isfinite(w[i]))
        return "`" + name + "` has " +
               (std::isnan(w[i]) ? "nan"
                : w[i] > 0       ? "inf"
                                 : "-inf") +
               " at index " + std::to_string(i);
  }
  return "";
}

/// Refuses logits with a non-finite value (exit 1): `where` says which (e.g. "new token 3 of
/// sequence 0"), and the message names the first non-finite weight, or says that every weight is
/// finite (the activations overflowed).
void require_finite(std::span<const float> logits, const HfCheckpoint& ck, const std::string& where) {
  const auto bad = std::find_if(logits.begin(), logits.end(), [](float x) { return !std::isfinite(x); });
  if (bad == logits.end()) return;
  const std::string weight = first_non_finite_weight(ck);
  throw std::runtime_error(where + ": the logits are not finite (" + (std::isnan(*bad) ? "nan" : "inf") +
                           " for token id " + std::to_string(bad - logits.begin()) + "); " +
                           (weight.empty() ? "every weight is finite, so an activation overflowed (try --dtype f32)"
                                           : "the weight " + weight));
}

}  // namespace

int run_causal_lm(const RunCausalLm& o) {
  OutputGroup outputs;
  protect_inputs(outputs, {{o.tokens, "--tokens"}});
  const std::size_t logits_file = outputs.add_file(o.logits_out, "--logits-out");

  const Activity reading("reading the model");
  const HfCheckpoint ck = open_model(outputs, o.model);
  const HfConfig& c = ck.config();
  NdArray tokens = load_token_ids(o.tokens, "--tokens", c.vocab_size);
  const std::int64_t B = tokens.shape[0], L = tokens.shape[1];
  if (L > c.max_position_embeddings)
    std::fprintf(stderr, "qkv: note: %lld tokens exceed max_position_embeddings (%lld) of the model\n",
                 static_cast<long long>(L), static_cast<long long>(c.max_position_embeddings));
  Feeds feeds;
  feeds["tokens"] = std::move(tokens);
  feeds["positions"] = positions_for(B, L);
  const Graph g = model_with_weights(build_causal_lm(c), ck, o.dtype, o.quant, feeds);
  const RunResult r = run_model(g, feeds, o.backend, o.stats);
  const NdArray& logits = r.outputs.at("logits");
  require_finite(logits.dtype == DType::f32 ? logits.as<float>() : logits.converted(DType::f32).as<float>(), ck,
                 "--tokens");

  const Activity writing("writing the outputs");
  stage_npy(outputs, logits_file, r.outputs.at("logits"));
  outputs.commit();
  say_weights(ck);
  return 0;
}

int run_encoder_model(const RunEncoderModel& o) {
  OutputGroup outputs;
  protect_inputs(
      outputs,
      {{o.tokens, "--tokens"}, {o.attention_mask, "--attention-mask"}, {o.token_type_ids, "--token-type-ids"}});
  const std::size_t hidden_file = outputs.add_file(o.out, "--out");
  const bool pooled = !o.pooled_out.empty();
  const std::size_t pooled_file = pooled ? outputs.add_file(o.pooled_out, "--pooled-out") : 0;

  const Activity reading("reading the model");
  const HfCheckpoint ck = open_model(outputs, o.model, /*encoder=*/true);
  const HfConfig& c = ck.config();
  if (pooled && !ck.has_pooler())
    throw UsageError("--pooled-out: the checkpoint in " + o.model + " has no pooler (pooler.dense.weight)");
  NdArray tokens = load_token_ids(o.tokens, "--tokens", c.vocab_size);
  const std::int64_t B = tokens.shape[0], L = tokens.shape[1];
  if (L > c.max_position_embeddings)
    throw UsageError("--tokens: " + std::to_string(L) + " tokens exceed max_position_embeddings (" +
                     std::to_string(c.max_position_embeddings) + ") of the model");
  // Token types and the mask are [B, L] like the ids ([L] for one sequence).
  auto like_tokens = [&](NdArray a, const std::string& flag) {
    if (a.shape.size() == 1) a.shape.insert(a.shape.begin(), 1);
    if (a.shape != tokens.shape)
      throw IoError(flag + ": shape " + shape_to_string(a.shape) + " must be the tokens' " +
                    shape_to_string(tokens.shape));
    return a;
  };
  NdArray types = o.token_type_ids.empty()
                      ? NdArray::zeros(DType::i64, tokens.shape)
                      : like_tokens(load_token_ids(o.token_type_ids, "--token-type-ids", c.type_vocab_size,
                                                   "the token types (type_vocab_size)"),
                                    "--token-type-ids");
  std::vector<Converted> converted;
  Feeds feeds = weight_feeds(ck, o.dtype, converted);
  if (!o.attention_mask.empty()) {
    const NdArray m = like_tokens(load_npy(o.attention_mask, "--attention-mask"), "--attention-mask");
    if (m.dtype != DType::boolean && m.dtype != DType::i32 && m.dtype != DType::i64)
      throw IoError("--attention-mask: must be an integer or bool array (1 = a token, 0 = padding), not " +
                    std::string(dtype_name(m.dtype)));
    const std::vector<float> v = m.to_f32();
    NdArray keep = NdArray::zeros(DType::boolean, tokens.shape);
    auto k = keep.as<bool>();
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (v[i] != 0 && v[i] != 1)
        throw IoError("--attention-mask: entry " + std::to_string(i) + " is " +
                      std::to_string(static_cast<long long>(v[i])) + "; only 0 and 1 are allowed");
      k[i] = v[i] == 1;
    }
    for (std::int64_t b = 0; b < B; ++b)
      if (std::none_of(k.begin() + b * L, k.begin() + (b + 1) * L, [](bool x) { return x; }))
        throw IoError("--attention-mask: sequence " + std::to_string(b) + " has no token (every entry is 0)");
    feeds["key_keep"] = std::move(keep);
  }
  feeds["tokens"] = std::move(tokens);
  feeds["token_type_ids"] = std::move(types);
  const Graph g = model_as(build_encoder_model(c, !o.attention_mask.empty(), pooled), o.dtype, feeds, converted);
  const RunResult r = run_model(g, feeds, o.backend, o.stats);

  const Activity writing("writing the outputs");
  stage_npy(outputs, hidden_file, r.outputs.at("last_hidden_state"));
  if (pooled) stage_npy(outputs, pooled_file, r.outputs.at("pooler_output"));
  outputs.commit();
  say_weights(ck);
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

namespace {

/// What one generation produced and what it cost.
struct Generation {
  NdArray ids, chosen_logits;
  std::int64_t batch = 0, prompt = 0, steps = 0;  // steps: decode steps run (new tokens − 1)
  std::int64_t prompt_tokens = 0;                 // the prompts' ids, padding not counted
  bool repacked = false;                          // cpu: the linear layers' weights packed once and kept
  double prefill_ms = 0, decode_ms = 0;
  /// warm: the first prefill (compiling the step graph, then running it); else the JIT's
  /// compile time within the timed prefill
  double compile_ms = 0;
  long long compiled_after_prefill = 0, compiled_after_first_step = 0;
  long long modules = 0, loaded_from_cache = 0;  // the JIT's modules in all, and of them loaded from the code cache
  double rss_after_first_step_mib = 0, rss_end_mib = 0;
};

/// The prompts continued by o.new_tokens tokens through a DecoderSession (the flags' checks, the
/// model, the cache, the loop): what `generate` writes and `bench generate` times. `warm`: one
/// untimed prefill first (it compiles the step graph), then reset() and the timed run.
Generation run_generation(const Generate& o, const HfCheckpoint& ck, bool warm = false,
                          const Tokenizer* tokenizer = nullptr) {
  if (o.new_tokens <= 0) throw UsageError("--new-tokens must be positive");
  if (!(std::isfinite(o.temperature) && o.temperature >= 0)) throw UsageError("--temperature must be >= 0");
  if (o.top_k < 0) throw UsageError("--top-k must be >= 0");
  if (o.top_k > 0 && o.temperature == 0) throw UsageError("--top-k samples: give a --temperature > 0 with it");
  const HfConfig& c = ck.config();
  NdArray prompt;
  if (tokenizer) {
    const std::vector<std::int64_t> ids = tokenizer->encode(o.prompt);
    if (ids.empty()) throw IoError("--prompt: the text encodes to no token at all");
    prompt = NdArray::zeros(DType::i64, {1, static_cast<std::int64_t>(ids.size())});
    std::copy(ids.begin(), ids.end(), prompt.as<std::int64_t>().begin());
  } else {
    prompt = load_token_ids(o.prompt_ids, "--prompt-ids", c.vocab_size, "the vocabulary", /*padded=*/true);
  }
  const std::int64_t B = prompt.shape[0], P = prompt.shape[1], N = o.new_tokens;
  // Rows of different lengths (right-padded with −1 in the file) run left-padded: row b's ids
  // after first[b] pad tokens (id 0, which no query sees), all rows' last ids in the last column.
  std::vector<std::int64_t> first(static_cast<std::size_t>(B), 0);
  NdArray tokens = NdArray::zeros(DType::i64, {B, P});
  {
    const std::vector<float> p = prompt.to_f32();
    for (std::int64_t b = 0; b < B; ++b) {
      std::int64_t len = P;
      while (p[static_cast<std::size_t>(b * P + len - 1)] == -1) --len;
      first[static_cast<std::size_t>(b)] = P - len;
      for (std::int64_t t = 0; t < len; ++t)
        tokens.as<std::int64_t>()[static_cast<std::size_t>(b * P + P - len + t)] =
            static_cast<std::int64_t>(p[static_cast<std::size_t>(b * P + t)]);
    }
  }
  const bool ragged = std::any_of(first.begin(), first.end(), [](std::int64_t f) { return f > 0; });
  const std::vector<std::int64_t> padding = ragged ? first : std::vector<std::int64_t>{};  // what prefill takes
  if (N > c.max_position_embeddings - P)  // also where P + N would overflow
    throw UsageError("--new-tokens " + std::to_string(N) + ": the prompt's " + std::to_string(P) +
                     " token(s) and the new ones exceed the model's max_position_embeddings (" +
                     std::to_string(c.max_position_embeddings) + "); give at most " +
                     std::to_string(std::max<std::int64_t>(c.max_position_embeddings - P, 0)));
  const std::int64_t total = P + N;
  // The caches at their full capacity (written in place by the CPU backend; the interpreter and
  // the CUDA backend hand back a second set each step), beside the weights.
  const std::uint64_t cache =
      2ull * (o.backend == Backend::cpu ? 1 : 2) *
      static_cast<std::uint64_t>(c.num_hidden_layers * B * c.num_key_value_heads * total * c.head_dim) *
      (o.dtype == DType::f32 ? 4 : 2);  // the caches are in the model's dtype
  require_memory(cache, "the KV cache");
  // The CPU backend packs the float linear layers' weights once (a second copy of them, at most
  // the checkpoint's size) when the decode steps run on the GEMM, whose every step would pack
  // them again; with fewer rows they run on the GEMV, which reads them in place, and only the
  // prefill packs. Quantized weights are read as stored (their GEMV takes more rows).
  const bool quantized = o.quant.has_value() || ck.any_quantized();
  const bool repack = o.repack.value_or(B > codegen::cpu::gemv_max_rows());
  if (o.backend == Backend::cpu && repack && !quantized)
    require_memory(ck.f32_bytes(), "the weights packed for the GEMM (--no-repack: none kept)");
  Feeds weights;
  Graph step = model_with_weights(build_causal_lm_step(c, ragged), ck, o.dtype, o.quant, weights);
  DecoderSession session(std::move(step), std::move(weights),
                         {.layers = c.num_hidden_layers,
                          .kv_heads = c.num_key_value_heads,
                          .head_dim = c.head_dim,
                          .batch = B,
                          .capacity = total},
                         [&, bound = codegen::cpu::BoundRunner(o.threads, repack)](const Graph& g, const Feeds& f,
                                                                                   const Destinations& into) {
                           // The CPU backend: the weights packed once, the caches written in place.
                           return o.backend == Backend::cpu ? bound(g, f, into) : run_graph(g, f, o.backend, o.threads);
                         });

  const Activity running("generating");
  const std::size_t V = static_cast<std::size_t>(c.vocab_size);
  Generation r;
  r.repacked = o.backend == Backend::cpu && repack;
  r.batch = B;
  r.prompt = P;
  r.steps = N - 1;
  r.prompt_tokens = B * P;
  for (const std::int64_t f : first) r.prompt_tokens -= f;
  // Each row: its prompt as given (its −1s too), its new ids after its last prompt id, then −1.
  r.ids = NdArray::zeros(DType::i64, {B, total});
  r.chosen_logits = NdArray::zeros(DType::f32, {B, N, c.vocab_size});
  auto ids_at = [&](std::int64_t b, std::int64_t t) -> std::int64_t& {
    return r.ids.as<std::int64_t>()[static_cast<std::size_t>(b * total + t)];
  };
  {
    const std::vector<float> p = prompt.to_f32();
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < total; ++t)
        ids_at(b, t) = t < P ? static_cast<std::int64_t>(p[static_cast<std::size_t>(b * P + t)]) : -1;
  }
  const codegen::JitStats jit_before = codegen::jit_stats();
  const double compiled_before = jit_before.compile_ms;
  auto t0 = std::chrono::steady_clock::now();
  if (warm) {
    (void)session.prefill(tokens, padding);
    session.reset();
    r.compile_ms = ms_since(t0);
  }
  std::int64_t modules_after_prefill = 0, modules_after_first_step = 0;
  std::vector<double> prefill_ms, decode_ms;  // one per repetition (bench generate --repeat)
  for (std::int64_t rep = 0; rep < o.repeat; ++rep) {
    std::mt19937_64 rng(o.seed);  // every repetition draws what the first drew
    t0 = std::chrono::steady_clock::now();
    NdArray logits = session.prefill(tokens, padding);
    prefill_ms.push_back(ms_since(t0));
    decode_ms.push_back(0);
    if (rep == 0) {
      if (!warm) r.compile_ms = codegen::jit_stats().compile_ms - compiled_before;
      modules_after_prefill = modules_after_first_step = codegen::jit_stats().modules;
      r.rss_after_first_step_mib = peak_rss_mib();
    }
    NdArray next = NdArray::zeros(DType::i64, {B, 1});
    for (std::int64_t t = 0; t < N; ++t) {
      const std::int64_t len = logits.shape[1];
      if (logits.dtype != DType::f32) logits = logits.converted(DType::f32);  // a bf16 / f16 model's, exactly
      const auto lv = logits.as<float>();
      for (std::int64_t b = 0; b < B; ++b) {
        const std::span<const float> row = lv.subspan(static_cast<std::size_t>((b * len + len - 1)) * V, V);
        std::copy(row.begin(), row.end(),
                  r.chosen_logits.as<float>().begin() + static_cast<std::ptrdiff_t>((b * N + t) * c.vocab_size));
        require_finite(row, ck, "new token " + std::to_string(t + 1) + " of sequence " + std::to_string(b));
        const std::int64_t id = choose(row, o, rng);
        ids_at(b, P - first[static_cast<std::size_t>(b)] + t) = id;
        next.as<std::int64_t>()[static_cast<std::size_t>(b)] = id;
      }
      if (t + 1 == N) break;
      t0 = std::chrono::steady_clock::now();
      logits = session.decode(next);
      decode_ms.back() += ms_since(t0);
      if (t == 0 && rep == 0) {
        modules_after_first_step = codegen::jit_stats().modules;
        r.rss_after_first_step_mib = peak_rss_mib();
      }
    }
  }
  r.prefill_ms = median(prefill_ms);
  r.decode_ms = median(decode_ms);
  r.compiled_after_prefill = static_cast<long long>(codegen::jit_stats().modules - modules_after_prefill);
  r.compiled_after_first_step = static_cast<long long>(codegen::jit_stats().modules - modules_after_first_step);
  r.rss_end_mib = peak_rss_mib();
  r.modules = static_cast<long long>(codegen::jit_stats().modules - jit_before.modules);
  r.loaded_from_cache = static_cast<long long>(codegen::jit_stats().loaded_from_cache - jit_before.loaded_from_cache);
  return r;
}

double per_second(double count, double ms) { return ms > 0 ? 1e3 * count / ms : 0.0; }

/// The inputs of generate outside the checkpoint's own files (open_model protects those).
void protect_prompt(OutputGroup& outputs, const Generate& o) {
  if (o.prompt_ids.empty() && o.prompt.empty()) throw UsageError("--prompt-ids is required (or --prompt TEXT)");
  outputs.protect(std::filesystem::path(o.model) / "tokenizer.model", "--model");
  protect_inputs(outputs, {{o.prompt_ids, "--prompt-ids"}});
}

/// GB/s of K and V read by the decode attention at the model's shape (batch B, query heads over
/// kv heads, head_dim) against a cache of `keys` keys: the split-KV kernel on its own, the
/// median of 21 runs; a bf16 model's on bf16 q, K, V (2 bytes per element), others' on f32.
double decode_attention_gbps(const HfConfig& c, std::int64_t batch, std::int64_t keys, int threads, DType dtype) {
  codegen::cpu::AttentionSpec spec;
  const bool half = dtype == DType::bf16;
  if (half) spec.storage = DType::bf16;
  spec.dk = spec.dv = c.head_dim;
  spec.hq = c.num_attention_heads;
  spec.hkv = c.num_key_value_heads;
  spec.causal = true;
  spec.align = CausalAlign::bottom_right;
  const auto kv = static_cast<std::size_t>(batch * spec.hkv * keys * c.head_dim);
  // bf16: each float's bits hold two bf16 copies of the value (its top half, truncated).
  auto value = [&](float x) {
    const std::uint32_t h = std::bit_cast<std::uint32_t>(x) >> 16;
    return half ? std::bit_cast<float>(h << 16 | h) : x;
  };
  std::vector<float> q(static_cast<std::size_t>(batch * spec.hq * c.head_dim), value(0.01f)), k(kv, value(0.02f)),
      v(kv, value(0.03f)), out(q.size());
  codegen::cpu::AttentionArgs a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.out = out.data();
  a.batch = batch;
  a.len_q = 1;
  a.len_k = keys;
  codegen::cpu::run_attention(spec, a, threads);
  std::vector<double> ms;
  for (int i = 0; i < 21; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    codegen::cpu::run_attention(spec, a, threads);
    ms.push_back(ms_since(t0));
  }
  std::sort(ms.begin(), ms.end());
  return 2.0 * static_cast<double>(kv) * (half ? 2 : 4) / (ms[ms.size() / 2] * 1e-3) * 1e-9;
}

}  // namespace

int generate(const Generate& o) {
  OutputGroup outputs;
  protect_prompt(outputs, o);
  const std::size_t ids_file = outputs.add_file(o.out, "--out");
  const std::size_t logits_file = o.logits_out.empty() ? 0 : outputs.add_file(o.logits_out, "--logits-out");

  const Activity reading("reading the model");
  const HfCheckpoint ck = open_model(outputs, o.model, /*encoder=*/false, o.mmap);
  std::optional<Tokenizer> tokenizer;
  if (!o.prompt.empty()) tokenizer = Tokenizer::open(o.model, ck.config().vocab_size);
  const Generation r = run_generation(o, ck, /*warm=*/false, tokenizer ? &*tokenizer : nullptr);
  std::fprintf(stderr,
               "qkv: prefill: %lld tokens in %.1f ms (%.1f tokens/s); decode: %lld steps in %.1f ms (%.1f tokens/s); "
               "compiling %.1f ms of the prefill (%lld module(s), %lld loaded from the code cache); %lld module(s) "
               "compiled after the prefill\n",
               static_cast<long long>(r.prompt_tokens), r.prefill_ms,
               per_second(static_cast<double>(r.prompt_tokens), r.prefill_ms), static_cast<long long>(r.steps),
               r.decode_ms, per_second(static_cast<double>(r.batch * r.steps), r.decode_ms), r.compile_ms, r.modules,
               r.loaded_from_cache, r.compiled_after_prefill);

  const Activity writing("writing the outputs");
  stage_npy(outputs, ids_file, r.ids);
  if (!o.logits_out.empty()) stage_npy(outputs, logits_file, r.chosen_logits);
  outputs.commit();
  say_weights(ck);
  if (tokenizer) {  // the prompt and its continuation, as text
    const auto ids = r.ids.as<std::int64_t>();
    std::printf("%s\n", tokenizer->decode(ids).c_str());
  }
  return 0;
}

int quantize_model(const QuantizeModel& o) {
  namespace fs = std::filesystem;
  OutputGroup outputs;
  const Activity reading("reading the model");
  const HfCheckpoint ck = open_model(outputs, o.model);
  const fs::path dir(o.model), out(o.out);
  const fs::path tokenizer = dir / "tokenizer.model";
  const bool has_tokenizer = fs::is_regular_file(tokenizer);
  if (has_tokenizer) outputs.protect(tokenizer, "--model");
  outputs.add_directory(out, "--out");
  const std::size_t config_file = outputs.add_file(out / "config.json", "--out");
  const std::size_t model_file = outputs.add_file(out / "model.safetensors", "--out");
  const std::size_t tokenizer_file = has_tokenizer ? outputs.add_file(out / "tokenizer.model", "--out") : 0;

  // The weights as the model names them, under the names the files give them; the linear
  // layers' (those quantize_linear_weights would quantize) as q and scales.
  const std::vector<std::string> linear = quantizable_linear_weights(build_causal_lm_step(ck.config()));
  require_memory(ck.f32_bytes(), "reading the weights of the model");
  std::map<std::string, NdArray> tensors;
  std::vector<Quant> formats, kept;
  std::uint64_t f32_bytes = 0, q_bytes = 0;
  for (const auto& name : ck.names()) {
    const std::string& stored = ck.stored(name);
    if (std::find(linear.begin(), linear.end(), name) == linear.end()) {
      tensors[stored] = ck.load(name);
      continue;
    }
    QuantizedWeight qw;
    if (ck.quantized(name)) {
      qw = ck.load_quantized(name);
      if (qw.format != quant_for(o.format, qw.columns()))
        throw InputError("--model " + o.model + ": `" + stored + "` is stored " + std::string(quant_name(qw.format)) +
                         " already; quantize the float checkpoint to " + std::string(quant_name(o.format)));
      kept.push_back(qw.format);
    } else {
      const NdArray w = ck.load(name);
      qw = quantize_weight(w, quant_for(o.format, w.shape.at(1)), kQuantGroup, "`" + stored + "`");
    }
    f32_bytes += static_cast<std::uint64_t>(qw.q.shape.at(0) * qw.columns()) * 4;
    q_bytes += static_cast<std::uint64_t>(qw.q.bytes.size() + qw.scales.bytes.size());
    formats.push_back(qw.format);
    tensors[stored + quant_suffix(qw.format)] = std::move(qw.q);
    tensors[stored + quant_scale_suffix(qw.format)] = std::move(qw.scales);
  }
  const auto quantized = static_cast<std::int64_t>(formats.size());
  if (quantized == 0)
    throw InputError("--model " + o.model + ": the model has no linear layer weight that qkv quantizes");

  const Activity writing("writing the outputs");
  const std::vector<std::byte> config = InputFile::open(dir / "config.json").read_all(1u << 24, "config.json");
  outputs.write(config_file, {config});
  const std::vector<std::byte> image = serialize_safetensors(
      tensors,
      {{"format", "pt"},
       {"qkv.quantization", o.format == Quant::q4 ? "q4_0: two 4-bit entries a byte, an f16 scale per 32 inputs"
                                                  : "q8_0: int8, an f16 scale per 32 inputs"}});
  outputs.write(model_file, {image});
  if (has_tokenizer) {
    const std::vector<std::byte> bytes = InputFile::open(tokenizer).read_all(1u << 30, "tokenizer.model");
    outputs.write(tokenizer_file, {bytes});
  }
  outputs.commit();
  const std::string what =
      kept.size() == formats.size()
          ? "stored " + quant_summary(formats) + ", already"
          : "quantized to " + quant_summary(formats) +
                (kept.empty() ? "" : "; " + std::to_string(kept.size()) + " of them stored so already");
  std::fprintf(stderr, "qkv: %lld linear weights %s (%.1f MB in f32 -> %.1f MB); %s: %.1f MB\n",
               static_cast<long long>(quantized), what.c_str(), static_cast<double>(f32_bytes) / 1e6,
               static_cast<double>(q_bytes) / 1e6, (out / "model.safetensors").c_str(),
               static_cast<double>(image.size()) / 1e6);
  return 0;
}

int bench_generate(const Generate& o, bool json) {
  OutputGroup outputs;
  protect_prompt(outputs, o);
  const std::size_t ids_file = o.out.empty() ? 0 : outputs.add_file(o.out, "--out");
  const Activity reading("reading the model");
  const HfCheckpoint ck = open_model(outputs, o.model, /*encoder=*/false, o.mmap);
  const HfConfig& c = ck.config();
  std::optional<Tokenizer> tokenizer;
  if (!o.prompt.empty()) tokenizer = Tokenizer::open(o.model, c.vocab_size);
  const Generation r = run_generation(o, ck, /*warm=*/true, tokenizer ? &*tokenizer : nullptr);
  const double prefill_tps = per_second(static_cast<double>(r.prompt_tokens), r.prefill_ms);
  const double decode_tps = per_second(static_cast<double>(r.batch * r.steps), r.decode_ms);
  const double attention_gbps =
      o.backend == Backend::cpu ? decode_attention_gbps(c, r.batch, r.prompt + r.steps, o.threads, o.dtype) : 0.0;
  const double growth = r.rss_end_mib - r.rss_after_first_step_mib;
  if (json) {
    std::printf(
        "{\"model_type\": \"%s\", \"layers\": %lld, \"hidden\": %lld, \"heads\": %lld, \"kv_heads\": %lld, "
        "\"vocab\": %lld, \"batch\": %lld, \"prompt_tokens\": %lld, \"decode_steps\": %lld, \"first_prefill_ms\": "
        "%.6g, "
        "\"prefill_ms\": %.6g, "
        "\"prefill_tokens_per_s\": %.6g, \"decode_ms\": %.6g, \"decode_tokens_per_s\": %.6g, "
        "\"decode_attention_gbps\": %.6g, \"modules_compiled_after_prefill\": %lld, "
        "\"modules_compiled_after_first_step\": %lld, \"modules_loaded_from_cache\": %lld, \"peak_rss_mib\": %.6g, "
        "\"peak_rss_growth_after_first_step_mib\": %.6g, \"weights_repacked\": %s}\n",
        c.model_type.c_str(), static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.hidden_size),
        static_cast<long long>(c.num_attention_heads), static_cast<long long>(c.num_key_value_heads),
        static_cast<long long>(c.vocab_size), static_cast<long long>(r.batch), static_cast<long long>(r.prompt),
        static_cast<long long>(r.steps), r.compile_ms, r.prefill_ms, prefill_tps, r.decode_ms, decode_tps,
        attention_gbps, r.compiled_after_prefill, r.compiled_after_first_step, r.loaded_from_cache, r.rss_end_mib,
        growth, r.repacked ? "true" : "false");
  } else {
    std::printf(
        "%s, %lld layers: first prefill (compiles) %.1f ms; prefill %lld tokens in %.1f ms (%.1f tokens/s); decode "
        "%lld steps in %.1f ms (%.1f "
        "tokens/s); decode attention %.1f GB/s at %lld keys; %lld module(s) compiled after the prefill, %lld after "
        "the first step; peak memory %.1f MiB (+%.1f after the first step)%s\n",
        c.model_type.c_str(), static_cast<long long>(c.num_hidden_layers), r.compile_ms,
        static_cast<long long>(r.prompt_tokens), r.prefill_ms, prefill_tps, static_cast<long long>(r.steps),
        r.decode_ms, decode_tps, attention_gbps, static_cast<long long>(r.prompt + r.steps), r.compiled_after_prefill,
        r.compiled_after_first_step, r.rss_end_mib, growth, r.repacked ? "; weights packed once (--repack)" : "");
  }
  if (!o.out.empty()) {
    stage_npy(outputs, ids_file, r.ids);
    outputs.commit();
  }
  say_weights(ck);
  return 0;
}

}  // namespace qkv::cli
