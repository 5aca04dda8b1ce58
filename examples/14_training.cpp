// Lesson 14 — training: a 4-layer decoder learns a short English text about attention
// (examples/data/attention.txt, one byte per token), then writes text of its own; and the three
// bugs that make such a loss refuse to fall, as the compile errors qkv gives instead.
//
// The model is lesson 12's tiny Llama (RMSNorm, RoPE, grouped-query attention, a SwiGLU MLP),
// four layers wide 32. One *training step* is one graph: the forward pass, the cross-entropy
// against the next bytes, the reverse mode (a gradient for every weight the loss reaches), the
// gradients clipped to a global norm of 1 and AdamW's update. What the compiler does with it:
//   - the step is compiled once, by the CPU backend, into one LLVM module (every node outlined into
//     a function of its own, so the optimiser works on many small functions); the first step pays
//     for the compile, every later step runs the same machine code;
//   - the learning rate and the step number are *inputs* of the graph (scalars), so the schedule
//     (warmup, then cosine) changes them every step without compiling anything again;
//   - the batch and the sequence length are run-time sizes: the same module would train on other
//     window sizes;
//   - the updated weights and the optimizer's moments (exp_avg.<name>, exp_avg_sq.<name>) are the
//     step's outputs, fed back as the next step's inputs.
// The validation loss and the generation use a second graph, the forward pass and the loss only
// (no reverse mode), on the reference interpreter: for a model this small, interpreting a forward
// pass takes milliseconds, less than compiling it would.
//
// Part 1 trains and prints the loss curve; part 2 decodes greedily from a prompt; part 3 lists
// the bugs. The program fails (exit 1) unless the loss fell well below where it started.
//
//     ./build/examples/14_training [text file]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <numbers>
#include <string>
#include <vector>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/dsl/train.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

using namespace qkv;
using namespace qkv::nn;

namespace {

constexpr std::int64_t kWidth = 32, kLayers = 4, kHidden = 64, kVocab = 256;
constexpr std::int64_t kBatch = 8, kSeq = 48, kSteps = 200, kWarmup = 20, kLogEvery = 20;
constexpr double kPeakLr = 1e-2, kMinLr = 1e-3;

struct Mistake {
  const char* test;   // tests/compile_fail/<test>_fail.cpp
  const char* what;   // the mistake
  const char* code;   // the offending line
  const char* error;  // qkv's diagnostic
};

// The three reasons the seed tutorials give for a loss that does not go down, and a fourth for one
// that goes down too well. In PyTorch each is a program that runs and trains badly; in qkv it does
// not compile.
// clang-format off
constexpr Mistake kMistakes[] = {
    {"13_softmax_unscaled",
     "The 1/sqrt(d_k) forgotten: the scores grow with the head width, the softmax saturates on one key and its gradients vanish.",
     "auto p = softmax<Key>(contract<HeadDim>(q, k));",
     "softmax: scores [Batch=2, Heads=2, Seq=4, Key=4] are raw Q*K^T, not scaled by 1/sqrt(HeadDim=64); fix: softmax<Key>(scaled(scores)), or unscaled(scores) to opt out"},
    {"41_softmax_over_queries_after_causal",
     "Softmax over the wrong axis (dim=1 for dim=-1): each key's weights sum to one over the queries, so a query's do not.",
     "auto p = softmax<Seq>(s);",
     "softmax: the key axis of the scores [Batch=2, Seq=4, Key=4] is `Key` (the axis k brought to the contraction, and causal<Seq, Key> says so too), but softmax is over `Seq`; fix: softmax<Key>(scores)"},
    {"20_biased_with_a_keep_mask",
     "A mask used the wrong way round: a keep-mask (true = a real token) added to the scores as 0/1 hides nothing, or, inverted, hides every real token.",
     "auto p = softmax<Key>(biased(scores, pad));",
     "biased: [Batch=2, Key=4] is a bool mask (true = may attend), not an additive float bias; fix: masked(scores, mask), with the mask declared as KeepMask, KeyPaddingMask or AttnMask"},
    {"21_causal_axes_swapped",
     "And a loss that falls too well: the causal mask's axes swapped, every query sees itself and the future (teacher forcing that peeks at the answer).",
     "auto p = softmax<Key>(causal<Key, Seq>(scores));",
     "causal: causal<Key, Seq> takes `Seq` as the key axis, but softmax normalises the scores [Batch=2, Heads=2, Seq=4, Key=4] over `Key`; fix: the query axis first, then the key axis: causal<Seq, Key>(scores)"},
};
// clang-format on

LlamaConfig config() {
  LlamaConfig c;
  c.layers = kLayers;
  c.rms_norm_eps = 1e-5;
  c.attention = {.heads = 4, .kv_heads = 2, .head_dim = 8, .rope = {.theta = 10000.0}};
  return c;
}

/// The decoder over tokens and positions [Batch, Seq], its logits and the cross-entropy against
/// the targets (the next bytes); returns the loss.
template <class M>
auto decoder_loss(Graph& g, const M& model) {
  auto tokens = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "tokens");
  auto positions = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "positions");
  auto targets = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "targets");
  auto logits = model(tokens, positions);
  return std::pair{logits, cross_entropy<Vocab>(logits, targets)};
}

/// tokens, positions and targets [rows, len]: the windows of `text` starting at `starts`.
void windows(Feeds& f, const std::string& text, const std::vector<std::size_t>& starts, std::int64_t len) {
  const auto rows = static_cast<std::int64_t>(starts.size());
  NdArray tokens = NdArray::zeros(DType::i64, {rows, len}), positions = tokens, targets = tokens;
  for (std::int64_t b = 0; b < rows; ++b)
    for (std::int64_t i = 0; i < len; ++i) {
      const auto k = static_cast<std::size_t>(b * len + i);
      const std::size_t at = starts[static_cast<std::size_t>(b)] + static_cast<std::size_t>(i);
      tokens.as<std::int64_t>()[k] = static_cast<unsigned char>(text[at]);
      targets.as<std::int64_t>()[k] = static_cast<unsigned char>(text[at + 1]);
      positions.as<std::int64_t>()[k] = i;
    }
  f["tokens"] = std::move(tokens);
  f["positions"] = std::move(positions);
  f["targets"] = std::move(targets);
}

/// Linear warmup to kPeakLr, then cosine down to kMinLr.
double lr_at(std::int64_t step) {
  if (step <= kWarmup) return kPeakLr * static_cast<double>(step) / kWarmup;
  const double t = static_cast<double>(step - kWarmup) / static_cast<double>(kSteps - kWarmup);
  return kMinLr + 0.5 * (kPeakLr - kMinLr) * (1 + std::cos(std::numbers::pi * t));
}

std::string bar(double loss, double scale) {
  return std::string(static_cast<std::size_t>(std::max(0.0, std::round(40 * loss / scale))), '#');
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : QKV_LESSON_TEXT;
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The last 10 % is held out for the validation loss.
  const std::size_t train_end = text.size() - text.size() / 10;
  if (train_end < static_cast<std::size_t>(kSeq) + 2 || text.size() - train_end < static_cast<std::size_t>(kSeq) + 1) {
    std::fprintf(stderr, "%s: %zu bytes, too little text to train on\n", path.c_str(), text.size());
    return 1;
  }

  // The training step: the decoder, its loss, and append_training_step's reverse mode and update.
  Graph step_graph;
  const auto model = CausalLm<kWidth>::make(step_graph, config());
  const auto loss = decoder_loss(step_graph, model).second;
  const TrainingStep step =
      append_training_step(step_graph, loss.id(), AdamW{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.01},
                           {.max_grad_norm = 1.0});

  // The evaluation graph: the same weights by name, the logits and the loss, no gradients (run by
  // the reference interpreter, nothing to compile).
  Graph eval_graph;
  {
    const auto [logits, eval_loss] = decoder_loss(eval_graph, CausalLm<kWidth>::make(eval_graph, config()));
    output(logits, "logits");
    output(eval_loss, "loss");
  }

  // Weights: uniform in ±0.05 (seeded Philox: the same on every machine), the norms' gains 1;
  // AdamW's moments start at zero.
  const Feeds drawn = random_feeds(step_graph,
                                   {{"Batch", kBatch},
                                    {"Seq", kSeq},
                                    {"Vocab", kVocab},
                                    {"Hidden", kHidden},
                                    {"QProj", config().attention.heads * 8},
                                    {"KvProj", config().attention.kv_heads * 8}},
                                   14, 0.05f);
  Feeds feeds;
  std::int64_t parameters = 0;
  for (const auto& p : step.params) {
    NdArray w = drawn.at(p);
    if (w.shape.size() == 1) std::fill(w.as<float>().begin(), w.as<float>().end(), 1.0f);
    parameters += static_cast<std::int64_t>(w.as<float>().size());
    for (const auto& s : step.state) feeds[s + "." + p] = NdArray::zeros(DType::f32, w.shape);
    feeds[p] = std::move(w);
  }

  std::vector<std::size_t> val_starts;
  for (std::size_t at = train_end; at + static_cast<std::size_t>(kSeq) < text.size();
       at += static_cast<std::size_t>(kSeq))
    val_starts.push_back(at);
  auto validation_loss = [&] {
    Feeds f;
    for (const auto& p : step.params) f[p] = feeds.at(p);
    windows(f, text, val_starts, kSeq);
    return static_cast<double>(interpret(eval_graph, f).outputs.at("loss").to_f32()[0]);
  };

  std::printf("Part 1: a %lld-layer decoder of %lld parameters trained on %zu bytes of %s (%zu held out)\n",
              static_cast<long long>(kLayers), static_cast<long long>(parameters), train_end, path.c_str(),
              text.size() - train_end);
  std::printf("  %lld steps of %lld windows x %lld bytes, AdamW, lr warmup %lld steps to %g then cosine to %g\n\n",
              static_cast<long long>(kSteps), static_cast<long long>(kBatch), static_cast<long long>(kSeq),
              static_cast<long long>(kWarmup), kPeakLr, kMinLr);

  auto t0 = std::chrono::steady_clock::now();
  const double val_before = validation_loss();
  const double eval_s = seconds_since(t0);

  // Batches: windows at random offsets of the training part (a fixed seed).
  std::uint64_t rng = 0x14;
  auto next_start = [&] {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::size_t>((rng >> 33) % (train_end - static_cast<std::size_t>(kSeq) - 1));
  };
  std::vector<double> losses;
  double first_step_s = 0;
  t0 = std::chrono::steady_clock::now();
  for (std::int64_t s = 1; s <= kSteps; ++s) {
    std::vector<std::size_t> starts;
    for (std::int64_t b = 0; b < kBatch; ++b) starts.push_back(next_start());
    windows(feeds, text, starts, kSeq);
    feeds["lr"] = NdArray::from_f32({static_cast<float>(lr_at(s))}, {});
    feeds["step"] = NdArray::from_f32({static_cast<float>(s)}, {});
    RunResult r = codegen::cpu::run(step_graph, feeds);  // the first call compiles, once
    if (s == 1) first_step_s = seconds_since(t0);
    for (const auto& p : step.params) {
      feeds[p] = std::move(r.outputs.at(p));
      for (const auto& st : step.state) feeds[st + "." + p] = std::move(r.outputs.at(st + "." + p));
    }
    losses.push_back(r.outputs.at("loss").to_f32()[0]);
    if (s == 1 || s % kLogEvery == 0)
      std::printf("  step %3lld  loss %.3f  lr %.4f  %s\n", static_cast<long long>(s), losses.back(), lr_at(s),
                  bar(losses.back(), losses.front()).c_str());
  }
  const double train_s = seconds_since(t0);
  const double val_after = validation_loss();
  double tail = 0;  // the mean of the last 20 steps' losses
  for (std::size_t i = losses.size() - 20; i < losses.size(); ++i) tail += losses[i] / 20;
  std::printf("\n  training loss %.3f -> %.3f (the last 20 steps' mean); uniform over 256 bytes would be %.3f\n",
              losses.front(), tail, std::log(256.0));
  std::printf("  validation loss (%zu held-out windows) %.3f -> %.3f\n", val_starts.size(), val_before, val_after);
  std::printf(
      "  time: the first step %.1f s (compiling the step graph), then %.1f ms a step; a validation pass %.0f ms\n",
      first_step_s, 1e3 * (train_s - first_step_s) / static_cast<double>(kSteps - 1), 1e3 * eval_s);

  // Part 2: greedy decoding: each new byte is the argmax of the logits at the last position of the
  // text so far (its last kSeq bytes, the window the model was trained on). Lesson 12 decodes with
  // a KV cache instead; here the whole window is run again, which for 130 bytes costs nothing.
  const std::string prompt = "attention ";
  std::string generated = prompt;
  for (int t = 0; t < 120; ++t) {
    const std::size_t from = generated.size() > static_cast<std::size_t>(kSeq) ? generated.size() - kSeq : 0;
    const std::string context = generated.substr(from) + " ";  // + a dummy target for the last byte
    Feeds f;
    for (const auto& p : step.params) f[p] = feeds.at(p);
    windows(f, context, {0}, static_cast<std::int64_t>(context.size()) - 1);
    const NdArray logits = interpret(eval_graph, f).outputs.at("logits");
    const auto v = logits.as<float>();
    const auto last = v.end() - kVocab;
    generated.push_back(static_cast<char>(std::max_element(last, v.end()) - last));
  }
  std::printf("\nPart 2: greedy decoding from \"%s\"\n  ", prompt.c_str());
  for (char c : generated) {
    if (c == '\n')
      std::printf("\n  ");
    else
      std::printf("%c", c);
  }
  std::printf("\n");

  std::printf("\nPart 3: why a loss does not go down, as compile errors\n");
  for (const auto& m : kMistakes) std::printf("  %s\n    %s\n    error: %s\n", m.what, m.code, m.error);

  const bool ok = tail < 0.7 * losses.front() && val_after < 0.8 * val_before;
  std::printf("\n%s\n", ok ? "OK: the loss fell" : "FAILED: the loss did not fall enough");
  return ok ? 0 : 1;
}
