// Issue 12, item 2 - PyTorch's `x.view(B, S, H, Dh)` written as a qkv view from three axes to
// four: splitting Model into heads is split, by name.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  // expected-error: view: [Batch=2, Seq=4, Model=16] -> [Batch=2, Seq=4, Heads=2, HeadDim=8] splits `Model`, which a view never does by name; fix: split<Model, Heads<2>, HeadDim<8>>(x)
  auto heads = view<Batch<2>, Seq<4>, Heads<2>, HeadDim<8>>(x);
  output(permute<Batch, Heads, Seq, HeadDim>(heads), "heads");
}
