// Catalogue 5 - d_model 512 with 6 heads: head_dim = 512 / 6 = 85 loses 2 features.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  constexpr int E = 512, H = 6;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<E>>>(g, "x");
  // expected-error: split: `Model` (512) is not Heads (6) x HeadDim (85) = 510; fix: choose factors that divide Model (e.g. a number of heads that divides d_model)
  auto heads = split<Model, Heads<H>, HeadDim<E / H>>(x);
  (void)heads;
}
