// Catalogue 13 - softmax straight over Q·Kᵀ, the 1/sqrt(d_k) forgotten.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<64>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<64>>>(g, "k");
  // expected-error: softmax: scores [Batch=2, Heads=2, Seq=4, Key=4] are raw Q*K^T, not scaled by 1/sqrt(HeadDim=64); fix: softmax<Key>(scaled(scores)), or unscaled(scores) to opt out
  auto p = softmax<Key>(contract<HeadDim>(q, k));
  (void)p;
}
