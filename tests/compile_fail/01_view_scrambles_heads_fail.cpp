// Catalogue 1 - heads scrambled: reshaping [B, S, E] straight to [B, H, S, Dh] with a view,
// as `x.view(B, H, S, Dh)` would in PyTorch, moves data between differently named axes.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  // expected-error: view: [Batch=2, Seq=4, Model=16] -> [Batch=2, Heads=2, Seq=4, HeadDim=8] would move data between differently named axes (axis 1 is `Seq` in x but `Heads` in the view); fix: permute<Batch, Heads, Seq, HeadDim>(split<Model, Heads<2>, HeadDim<8>>(x))
  auto heads = view<Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>(x);
  (void)heads;
}
