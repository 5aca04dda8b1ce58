// Positive twin of 11_wrong_pair_transposed_fail.cpp: the correct program compiles.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto split_x = split<Model, Heads<2>, HeadDim<8>>(x);
  Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>> per_head = transpose<Seq, Heads>(split_x);
  (void)per_head;
}
