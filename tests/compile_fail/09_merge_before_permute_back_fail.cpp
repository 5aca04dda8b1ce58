// Catalogue 9 - heads merged back while still [Batch, Heads, Seq, HeadDim] (the missing
// transpose(1, 2) before .view(B, S, E)).
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto o = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "attended");
  // expected-error: merge: `Heads` and `HeadDim` are not adjacent in [Batch=2, Heads=2, Seq=4, HeadDim=8]; fix: permute<Batch, Seq, Heads, HeadDim>(x) first, then merge
  auto merged = merge<Heads, HeadDim, Model>(o);
  (void)merged;
}
