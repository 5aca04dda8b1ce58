// Positive twin of 13_softmax_unscaled_fail.cpp: the correct program compiles.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<64>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<64>>>(g, "k");
  auto p = softmax<Key>(scaled(contract<HeadDim>(q, k)));
  auto also_fine = softmax<Key>(unscaled(contract<HeadDim>(q, k)));  // opting out is explicit
  (void)p;
  (void)also_fine;
}
