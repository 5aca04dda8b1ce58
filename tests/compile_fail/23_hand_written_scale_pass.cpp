// Positive twin of 23_hand_written_scale_fail.cpp: the tutorials' `scores / sqrt(d_k)` written by
// hand as scale(s, 1 / sqrt(8)) counts as scaled, as does any deliberate factor (used to be
// refused: "raw Q*K^T, not scaled by 1/sqrt(HeadDim=8)").
#include <cmath>

#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "k");
  auto alibi = input<Tensor<f32, Heads<2>, Seq<4>, Key<4>>>(g, "alibi");
  auto p = softmax<Key>(biased(scale(contract<HeadDim>(q, k), 1 / std::sqrt(8.f)), alibi));
  auto temperature = softmax<Key>(scale(biased(contract<HeadDim>(q, k), alibi), 0.25));
  output(p, "weights");
  output(temperature, "tempered");
}
