// Positive twin of 12_causal_without_alignment_fail.cpp: the correct program compiles.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<1>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<1>, Key<6>, HeadDim<8>>>(g, "k");
  auto scores = scaled(contract<HeadDim>(q, k));
  auto p = softmax<Key>(causal<Seq, Key>(scores, bottom_right));
  (void)p;
}
