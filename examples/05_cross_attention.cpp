// Lesson 05 — cross-attention: queries from one sequence, keys and values from another.
//
// A decoder of 3 tokens attends over an encoder memory of 7. The memory's positions have their
// own axis (`Mem`, renamed `Key` inside the block), so the weights are [Batch, Heads, Seq=3, Key=7],
// and K and V must come from memories of one length (lesson 07, bug 10). PyTorch's kdim/vdim are
// the widths of the key and value memories (8 and 12 here).
//
//     ./build/examples/05_cross_attention
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<3>, Model<16>>>(g, "decoder");
  auto key = input<Tensor<f32, Batch<2>, Mem<7>, Hidden<8>>>(g, "key_memory");
  auto value = input<Tensor<f32, Batch<2>, Mem<7>, ValueDim<12>>>(g, "value_memory");
  auto memory_keep = input<KeyPaddingMask<Batch<2>, Key<7>>>(g, "memory_keep");

  auto cross = CrossAttention<16, 2, /*kdim=*/8, /*vdim=*/12>::make(g);
  auto [out, weights] = cross(x, key, value, memory_keep);
  Tensor<f32, Batch<2>, Seq<3>, Model<16>> o = out;
  Tensor<f32, Batch<2>, Heads<2>, Seq<3>, Key<7>> w = weights;
  output(o, "out");
  output(w, "weights");
  std::cout << "Cross-attention, 3 queries over a memory of 7 (kdim 8, vdim 12):\n\n" << g.table();

  // Run it with the second memory padded after 4 entries: its last 3 keys get no weight, and
  // every query's weights still sum to 1 over what it may see.
  Feeds feeds = random_feeds(g, {}, /*seed=*/5, 0.5f);
  feeds["memory_keep"] = keep_first({7, 4}, 7);
  const auto p = interpret(g, feeds).outputs.at("weights").to_f32();  // [2, 2, 3, 7]
  bool ok = w.node().axes[3].extent == Extent::fixed(7);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 3; ++i) {
        double sum = 0;
        for (int j = 0; j < 7; ++j) {
          const float v = p[((b * 2 + h) * 3 + i) * 7 + j];
          sum += v;
          if (b == 1 && j >= 4) ok = ok && v == 0.0f;
        }
        ok = ok && std::abs(sum - 1.0) < 1e-6;
      }
  std::cout << "\npadded memory entries get weight 0, rows sum to 1: " << (ok ? "ok" : "FAILED") << "\n";
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
