// Issue 14 - a score_mod whose function returns a bool (a keep predicate).
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q_ = input<Tensor<f32, Batch<2>, Heads<2>, Seq<5>, HeadDim<4>>>(g, "q");
  auto k_ = input<Tensor<f32, Batch<2>, Heads<2>, Key<7>, HeadDim<4>>>(g, "k");
  auto s = scaled(contract<HeadDim>(q_, k_));
  // expected-error: score_mod: the function returns a bool, not a number; fix: use mask_mod for a keep predicate, or where(cond, s, value) to change the score
  auto p = softmax<Key>(modded(s, score_mod([](auto x, auto, auto, auto q, auto k) { return x > 0 && k <= q; }, bottom_right)));
  output(p, "weights");
}
