// Positive twin of 28_mod_slopes_by_query_fail.cpp: the slopes read with the head index.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q_ = input<Tensor<f32, Batch<2>, Heads<2>, Seq<5>, HeadDim<4>>>(g, "q");
  auto k_ = input<Tensor<f32, Batch<2>, Heads<2>, Key<7>, HeadDim<4>>>(g, "k");
  auto s = scaled(contract<HeadDim>(q_, k_));
  auto slopes = input<Tensor<f32, Heads<2>>>(g, "slopes");
  auto p = softmax<Key>(modded(s, score_mod([&](auto x, auto, auto h, auto q, auto k) { return x - slopes[h] * abs(q - k); }, bottom_right)));
  output(p, "weights");
}
