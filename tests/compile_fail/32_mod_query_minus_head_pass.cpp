// Positive twin of 32_mod_query_minus_head_fail.cpp: the head used in a test of its own.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q_ = input<Tensor<f32, Batch<2>, Heads<2>, Seq<5>, HeadDim<4>>>(g, "q");
  auto k_ = input<Tensor<f32, Batch<2>, Heads<2>, Key<7>, HeadDim<4>>>(g, "k");
  auto s = scaled(contract<HeadDim>(q_, k_));
  auto p = softmax<Key>(modded(s, mask_mod([](auto, auto h, auto q, auto k) { return k <= q && h == 0; }, bottom_right)));
  output(p, "weights");
}
