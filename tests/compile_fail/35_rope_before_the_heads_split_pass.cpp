// Positive twin of 35_rope_before_the_heads_split_fail.cpp: split into heads first.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<8>, Model<64>>>(g, "x");
  auto positions = input<Tensor<i64, Batch<2>, Seq<8>>>(g, "positions");
  auto q = linear(x, linear_params<Model<64>, Model<64>>(g, "q_proj"));
  auto r = rope<HeadDim, Seq>(split<Model, Heads<4>, HeadDim<16>>(q), positions);
  (void)r;
}
