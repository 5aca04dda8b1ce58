// Positive twin of 18_view_to_higher_rank_fail.cpp: split names the factors.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto heads = split<Model, Heads<2>, HeadDim<8>>(x);
  output(permute<Batch, Heads, Seq, HeadDim>(heads), "heads");
}
