// Issue 14 - a mask_mod whose function returns a number (the distance, not a comparison).
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q_ = input<Tensor<f32, Batch<2>, Heads<2>, Seq<5>, HeadDim<4>>>(g, "q");
  auto k_ = input<Tensor<f32, Batch<2>, Heads<2>, Key<7>, HeadDim<4>>>(g, "k");
  auto s = scaled(contract<HeadDim>(q_, k_));
  // expected-error: mask_mod: the function returns a number, not a bool; fix: compare it (abs(q - k) <= 256) to keep entries, or use score_mod to change the score
  auto p = softmax<Key>(modded(s, mask_mod([](auto, auto, auto q, auto k) { return abs(q - k); }, top_left)));
  output(p, "weights");
}
