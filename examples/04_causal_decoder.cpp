// Lesson 04 — a causal decoder block (GPT-style): pre-norm, causal self-attention, MLP.
//
// A causal mask lets token i see tokens 0..i. When queries and keys have the same length the
// triangle is unambiguous; when they differ (decoding 1 new token against a cache of S) the
// alignment must be said: top-left (PyTorch is_causal) or bottom-right (FlashAttention >= 2.1).
//
//     ./build/examples/04_causal_decoder
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<1>, Seq<dyn>, Model<32>>>(g, "tokens");
  auto block = CausalDecoderBlock<32, 4, 128, Activation::gelu>::make(g, "h.0.");
  Tensor<f32, Batch<1>, Seq<dyn>, Model<32>> y = block(x);
  output(y, "out");
  std::cout << "Causal decoder block (d_model 32, 4 heads, MLP 128):\n\n" << g.table();

  // Decoding: 1 query against 6 cached keys. Without an alignment this would not compile
  // (causal<Seq, Key>(s) with Seq=1, Key=6); bottom_right lets the new token see all 6.
  Graph step;
  auto q = input<Tensor<f32, Batch<1>, Heads<4>, Seq<1>, HeadDim<8>>>(step, "q");
  auto k = input<Tensor<f32, Batch<1>, Heads<4>, Key<6>, HeadDim<8>>>(step, "k_cache");
  auto p = softmax<Key>(causal<Seq, Key>(scaled(contract<HeadDim>(q, k)), bottom_right));
  output(p, "weights");
  std::cout << "\nOne decoding step against a cache of 6:\n\n" << step.table();

  bool ok =
      step.node(p.id()).op == Op::softmax && step.node(step.node(p.id()).inputs[0]).align == CausalAlign::bottom_right;

  // Run the block on 5 tokens, then look at causal weights of one attention layer: token i
  // must give keys after i exactly zero weight.
  const auto y_run = interpret(g, random_feeds(g, {{"Seq", 5}}, /*seed=*/11, 0.3f)).outputs.at("out");
  Graph attn;
  auto xa = input<Tensor<f32, Batch<1>, Seq<dyn>, Model<32>>>(attn, "tokens");
  output(MultiHeadAttention<32, 4>::make(attn)(xa, causal_mask).second, "weights");
  const auto w = interpret(attn, random_feeds(attn, {{"Seq", 5}}, 11, 0.3f)).outputs.at("weights").to_f32();
  std::printf("\ncausal weights, head 0 (5 tokens):\n");
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 5; ++j) {
      const float v = w[i * 5 + j];
      std::printf(" %6.3f", v);
      if (j > i) ok = ok && v == 0.0f;
    }
    std::printf("\n");
  }
  // Decoding against the cache, bottom-right: the new token sees all 6 cached keys.
  const auto wstep = interpret(step, random_feeds(step, {}, 12)).outputs.at("weights").to_f32();
  for (float v : wstep) ok = ok && v > 0.0f;
  std::cout << "block output " << y_run.shape.size()
            << "-D, future keys get weight 0, the decoding step sees all 6 keys: " << (ok ? "ok" : "FAILED") << "\n";
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
