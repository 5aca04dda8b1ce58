// Lesson 12 — a decoder LLM: a tiny Llama written with qkv::nn's blocks, a prefill and a decode
// loop against its KV cache.
//
// The blocks are the ones Llama, Qwen2 and Mistral are made of: RMSNorm, rotary position
// embeddings (RoPE) on the queries and keys, grouped-query attention (8 query heads sharing 2
// key/value heads), a SwiGLU MLP, a token embedding and an LM head. CausalLm::cached builds one
// *step* of the model: this step's tokens, attended against the keys and values of the positions
// before them (the cache). Each cache is one buffer of the full capacity; cache_append writes the
// step's keys and values after the Past positions it holds. DecoderSession owns the buffers
// across calls: prefill(prompt), then decode(token) one token at a time.
//
// The compiler's side: the step graph is compiled once. Its lengths — the step's tokens (Seq),
// the positions already cached (Past, a size fed by value) and so the keys (Key = Past + Seq, a
// symbol of its own) — are run-time sizes of the compiled module, so the prefill and every decode
// step run the same machine code: part 2 prints the modules compiled per call (1, then 0). The
// present caches are written back into the session's buffers, so a step writes only its own rows,
// and each layer's attention reads K and V out of the caches' rows where they are (the kernel
// steps its heads by the capacity): no copy of the cache per step. The attention is one fused
// kernel, or the split-KV decode kernel at one query (GQA without copying K and V per query head;
// causal aligned bottom-right, so the one query of a decode step sees the whole cache).
//
// Part 1 checks the incremental logits against one full forward of the whole sequence, on the
// CPU backend, and the full forward against the reference interpreter. Part 3 shows the axis
// mistakes RoPE catches at compile time.
//
//     ./build/examples/12_decoder_llm
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/jit.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/decoder_session.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

using namespace qkv;
using namespace qkv::nn;

namespace {

constexpr std::int64_t kPrompt = 12, kNew = 20, kVocab = 256, kLayers = 2;

struct Mistake {
  const char* test;   // tests/compile_fail/<test>_fail.cpp
  const char* what;   // the mistake
  const char* code;   // the offending line
  const char* error;  // qkv's diagnostic
};

// clang-format off
constexpr Mistake kMistakes[] = {
    {"34_rope_positions_of_the_keys",
     "The cache's key positions given to the step's query: every query would turn by another token's angle.",
     "rope<HeadDim, Seq>(q, key_positions)  // key_positions [Batch, Key]",
     "rope: positions [Batch=1, Key=9] have no axis `Seq`, so they are not the positions of the tokens along `Seq`; fix: positions over `Seq` (e.g. [Batch, Seq])"},
    {"35_rope_before_the_heads_split",
     "RoPE applied to the projection before it is split into heads: it would pair features of different heads.",
     "rope<HeadDim, Seq>(linear(x, q_proj), positions)",
     "rope: x [Batch=2, Seq=8, Model=64] has no axis `HeadDim` to rotate; fix: apply rope to per-head queries and keys, over their features"},
};
// clang-format on

LlamaConfig config() {
  LlamaConfig c;
  c.layers = kLayers;
  c.rms_norm_eps = 1e-5;
  c.attention = {.heads = 8,
                 .kv_heads = 2,
                 .head_dim = 16,
                 .rope = {.theta = 500000.0, .llama3 = std::nullopt},
                 .qkv_bias = false,
                 .o_bias = false,
                 .sliding_window = std::nullopt};
  return c;
}

NdArray ids(const std::vector<std::int64_t>& v) {
  NdArray a = NdArray::zeros(DType::i64, {1, static_cast<std::int64_t>(v.size())});
  for (std::size_t i = 0; i < v.size(); ++i) a.as<std::int64_t>()[i] = v[i];
  return a;
}

std::int64_t argmax_last(const NdArray& logits) {
  const auto v = logits.as<float>();
  const std::size_t V = static_cast<std::size_t>(logits.shape[2]);
  const float* row = v.data() + v.size() - V;
  std::size_t best = 0;
  for (std::size_t i = 1; i < V; ++i)
    if (row[i] > row[best]) best = i;
  return static_cast<std::int64_t>(best);
}

}  // namespace

int main() {
  // The full forward (for the check) and one step against the cache, the same weights by name.
  Graph full, step;
  const auto model = CausalLm<128>::make(full, config());
  auto tokens = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(full, "tokens");
  auto positions = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(full, "positions");
  output(model(tokens, positions), "logits");

  // The step: CausalLm::cached on the caches cache_k.{i} / cache_v.{i} (their full capacity) and
  // the size past_length; outputs present_k.{i} / present_v.{i}, the caches after the step.
  declare_cached_step(step, CausalLm<128>::make(step, config()));

  // Random weights (seeded), bound once into the session.
  const Feeds drawn = random_feeds(
      full, {{"Batch", 1}, {"Seq", 1}, {"Vocab", kVocab}, {"Hidden", 384}, {"QProj", 128}, {"KvProj", 32}}, 2026, 0.5f);
  Feeds weights;
  for (const auto& n : full.nodes())
    if (n.op == Op::param) weights[n.name] = drawn.at(n.name);

  std::printf("Part 1: a prefill of %lld tokens, then %lld greedy tokens one at a time\n",
              static_cast<long long>(kPrompt), static_cast<long long>(kNew));
  DecoderSession session(step, weights,
                         {.layers = kLayers, .kv_heads = 2, .head_dim = 16, .batch = 1, .capacity = kPrompt + kNew},
                         codegen::cpu::BoundRunner());  // weights packed once, caches written in place
  std::vector<std::int64_t> sequence;
  for (std::int64_t i = 0; i < kPrompt; ++i) sequence.push_back((i * 37 + 11) % kVocab);
  std::vector<NdArray> step_logits;
  std::vector<long long> compiled;
  double decode_ms = 0;
  for (std::int64_t t = 0; t < kNew; ++t) {
    const std::int64_t before = codegen::jit_stats().modules;
    const auto t0 = std::chrono::steady_clock::now();
    NdArray l = t == 0 ? session.prefill(ids(sequence)) : session.decode(ids({sequence.back()}));
    if (t > 0) decode_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    compiled.push_back(static_cast<long long>(codegen::jit_stats().modules - before));
    sequence.push_back(argmax_last(l));
    step_logits.push_back(std::move(l));
  }
  std::printf("  generated:");
  for (std::int64_t t = kPrompt; t < kPrompt + kNew; ++t)
    std::printf(" %lld", static_cast<long long>(sequence[static_cast<std::size_t>(t)]));
  std::printf("\n  cache: %lld positions of %lld\n", static_cast<long long>(session.position()),
              static_cast<long long>(session.capacity()));

  // The check: the last row of every step equals the full forward's row at its position.
  Feeds f = weights;
  sequence.pop_back();  // the last token was chosen, not run
  f["tokens"] = ids(sequence);
  NdArray pos = NdArray::zeros(DType::i64, {1, static_cast<std::int64_t>(sequence.size())});
  for (std::size_t i = 0; i < sequence.size(); ++i) pos.as<std::int64_t>()[i] = static_cast<std::int64_t>(i);
  f["positions"] = pos;
  const NdArray want = codegen::cpu::run(full, f).outputs.at("logits");
  const NdArray reference = interpret(full, f).outputs.at("logits");
  const auto w = want.as<float>(), r = reference.as<float>();
  double step_err = 0, backend_err = 0;
  for (std::size_t i = 0; i < w.size(); ++i)
    backend_err = std::max(backend_err, static_cast<double>(std::abs(w[i] - r[i])));
  for (std::int64_t t = 0; t < kNew; ++t) {
    const auto s = step_logits[static_cast<std::size_t>(t)].as<float>();
    const std::size_t at = static_cast<std::size_t>(kPrompt - 1 + t) * kVocab;
    for (std::size_t v = 0; v < static_cast<std::size_t>(kVocab); ++v)
      step_err = std::max(step_err, static_cast<double>(std::abs(s[s.size() - kVocab + v] - w[at + v])));
  }
  std::printf("  max |incremental - full forward| = %.2e; max |cpu - interpreter| = %.2e\n", step_err, backend_err);

  std::printf("\nPart 2: LLVM modules compiled per call (prefill first): ");
  long long after_first = 0;
  for (std::size_t t = 0; t < compiled.size(); ++t) {
    std::printf("%lld%s", compiled[t], t + 1 < compiled.size() ? " " : "\n");
    if (t > 0) after_first += compiled[t];
  }
  std::printf("  %lld decode steps in %.1f ms (%.1f tokens/s)\n", static_cast<long long>(kNew - 1), decode_ms,
              1e3 * static_cast<double>(kNew - 1) / decode_ms);

  std::printf("\nPart 3: what RoPE's types catch\n");
  for (const auto& m : kMistakes) std::printf("  %s\n    %s\n    error: %s\n", m.what, m.code, m.error);

  const bool ok = step_err <= 1e-4 && backend_err <= 1e-4 && after_first == 0;
  std::printf("\n%s\n", ok ? "OK" : "MISMATCH");
  return ok ? 0 : 1;
}
