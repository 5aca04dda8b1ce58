// Issue 12, item 7 (the negative side) - a user-built additive mask applied to raw Q*K^T and the
// scale forgotten: adding a bias is not a scale, so softmax still refuses the raw scores.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "k");
  auto alibi = input<Tensor<f32, Heads<2>, Seq<4>, Key<4>>>(g, "alibi");
  // expected-error: softmax: scores [Batch=2, Heads=2, Seq=4, Key=4] are raw Q*K^T, not scaled by 1/sqrt(HeadDim=8); fix: softmax<Key>(scaled(scores)), or unscaled(scores) to opt out
  auto p = softmax<Key>(biased(contract<HeadDim>(q, k), alibi));
  output(p, "weights");
}
