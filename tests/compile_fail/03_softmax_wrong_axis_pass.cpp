// Positive twin of 03_softmax_wrong_axis_fail.cpp: the correct program compiles.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto h = Head<16, 16>::make(g, "");
  auto q = linear(x, h.q);
  auto k = rename<Seq, Key>(linear(x, h.k));
  auto v = rename<Seq, Key>(linear(x, h.v));
  auto p = softmax<Key>(scaled(contract<HeadDim>(q, k)));
  auto out = contract<Key>(p, v);
  (void)out;
}
