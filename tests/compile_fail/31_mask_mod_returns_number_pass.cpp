// Positive twin of 31_mask_mod_returns_number_fail.cpp: the distance compared with a window.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q_ = input<Tensor<f32, Batch<2>, Heads<2>, Seq<5>, HeadDim<4>>>(g, "q");
  auto k_ = input<Tensor<f32, Batch<2>, Heads<2>, Key<7>, HeadDim<4>>>(g, "k");
  auto s = scaled(contract<HeadDim>(q_, k_));
  auto p = softmax<Key>(modded(s, mask_mod([](auto, auto, auto q, auto k) { return abs(q - k) <= 3; }, top_left)));
  output(p, "weights");
}
