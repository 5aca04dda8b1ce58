// Compile-time benchmark: a GPT-2 model as a user writes it (scripts/compile-time times this TU).
//
// Two blocks of Hugging Face's GPT2LMHeadModel (qkv::nn::Gpt2LmHead), a single block on its
// own, both run on random weights by the reference interpreter and the CPU backend. The program
// is small on purpose: what it costs to compile is the headers and the DSL's type checks, not
// its own code. Built by the bench target (so it keeps compiling) and runnable:
//
//     ./build/release/bench/compile_time_gpt2_block
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

using namespace qkv;
using namespace qkv::nn;

namespace {
double worst_difference(const NdArray& a, const NdArray& b) {
  const auto x = a.to_f32(), y = b.to_f32();
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(double{x[i]} - y[i]));
  return worst;
}
}  // namespace

int main() {
  constexpr int E = 32;
  const Gpt2Config cfg{.layers = 2, .heads = 4, .head_dim = E / 4};

  // The language model: token ids and positions in, logits out.
  Graph lm;
  auto tokens = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(lm, "tokens");
  auto positions = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(lm, "positions");
  output(Gpt2LmHead<E>::make(lm, cfg)(tokens, positions), "logits");

  // One block over hidden states, with a key-padding mask after the causal one.
  Graph block;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<E>>>(block, "x");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(block, "keep");
  output(Gpt2Block<E>::make(block, "h.0.", cfg)(x, keep), "out");

  const Bindings sizes{{"Batch", 2},     {"Seq", 5},         {"Key", 5},   {"Vocab", 50},
                       {"Position", 16}, {"QkvProj", 3 * E}, {"QProj", E}, {"Hidden", 4 * E}};
  double worst = 0;
  for (const Graph* g : {&lm, &block}) {
    Feeds feeds = random_feeds(*g, sizes, /*seed=*/7, 0.5f);
    if (g == &lm) {  // token i % Vocab at position s
      NdArray ids = NdArray::zeros(DType::i64, {2, 5}), pos = NdArray::zeros(DType::i64, {2, 5});
      for (std::int64_t i = 0; i < 10; ++i) {
        ids.as<std::int64_t>()[i] = (7 * i) % 50;
        pos.as<std::int64_t>()[i] = i % 5;
      }
      feeds["tokens"] = ids;
      feeds["positions"] = pos;
    }
    for (const auto& [name, want] : interpret(*g, feeds).outputs)
      worst = std::max(worst, worst_difference(codegen::cpu::run(*g, feeds).outputs.at(name), want));
  }
  std::cout << "gpt2: max |cpu - interpreter| = " << worst << "\n";
  return worst < 1e-3 ? EXIT_SUCCESS : EXIT_FAILURE;
}
