// Catalogue 11 - transpose(2, 3) where transpose(1, 2) was meant: [B, S, H, Dh] becomes
// [B, S, Dh, H] instead of [B, H, S, Dh].
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto split_x = split<Model, Heads<2>, HeadDim<8>>(x);  // [Batch, Seq, Heads, HeadDim]
  // expected-error: convert: axis 1 of [Batch=2, Seq=4, HeadDim=8, Heads=2] is `Seq` but the declared type [Batch=2, Heads=2, Seq=4, HeadDim=8] wants `Heads` there; fix: permute<Batch, Heads, Seq, HeadDim>(x)
  Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>> per_head = transpose<Heads, HeadDim>(split_x);
  (void)per_head;
}
