// Positive twin of 09_merge_before_permute_back_fail.cpp: the correct program compiles.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto o = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "attended");
  auto merged = merge<Heads, HeadDim, Model>(permute<Batch, Seq, Heads, HeadDim>(o));
  (void)merged;
}
