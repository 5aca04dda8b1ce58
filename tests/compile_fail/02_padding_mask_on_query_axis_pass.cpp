// Positive twin of 02_padding_mask_on_query_axis_fail.cpp: the correct program compiles.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto pad = input<KeyPaddingMask<Batch<2>, Seq<4>>>(g, "lengths_3_and_4");
  auto sa = Head<16, 16>::make(g, "");
  auto q = linear(x, sa.q);
  auto k = rename<Seq, Key>(linear(x, sa.k));
  auto scores = scaled(contract<HeadDim>(q, k));
  auto p = softmax<Key>(masked(scores, rename<Seq, Key>(pad)));
  (void)p;
}
