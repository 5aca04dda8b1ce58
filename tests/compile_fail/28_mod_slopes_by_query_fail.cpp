// Issue 14 - ALiBi slopes [Heads] read with the query index: every query row would take
// another head's slope.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q_ = input<Tensor<f32, Batch<2>, Heads<2>, Seq<5>, HeadDim<4>>>(g, "q");
  auto k_ = input<Tensor<f32, Batch<2>, Heads<2>, Key<7>, HeadDim<4>>>(g, "k");
  auto s = scaled(contract<HeadDim>(q_, k_));
  auto slopes = input<Tensor<f32, Heads<2>>>(g, "slopes");
  // expected-error: load: `Heads` of [Heads=2] is an axis of the scores, indexed here by the query index q (`Seq`); fix: index `Heads` by the head index h
  auto p = softmax<Key>(modded(s, score_mod([&](auto x, auto, auto, auto q, auto k) { return x - slopes[q] * abs(q - k); }, bottom_right)));
  output(p, "weights");
}
