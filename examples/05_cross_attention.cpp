// Lesson 05 — cross-attention: queries from one sequence, keys and values from another.
//
// A decoder of 3 tokens attends over an encoder memory of 7. The memory's positions have their
// own axis (`Mem`, renamed `Key` inside the block), so the weights are [Batch, Heads, Seq=3, Key=7],
// and K and V must come from memories of one length (lesson 07, bug 10). PyTorch's kdim/vdim are
// the widths of the key and value memories (8 and 12 here).
//
//     ./build/examples/05_cross_attention
#include <cstdlib>
#include <iostream>

#include <qkv/qkv.hpp>

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
  return w.node().axes[3].extent == Extent::fixed(7) ? EXIT_SUCCESS : EXIT_FAILURE;
}
