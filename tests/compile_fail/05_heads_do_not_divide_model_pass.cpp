// Positive twin of 05_heads_do_not_divide_model_fail.cpp: the correct program compiles.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  constexpr int E = 512, H = 8;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<E>>>(g, "x");
  auto heads = split<Model, Heads<H>, HeadDim<E / H>>(x);
  (void)heads;
}
