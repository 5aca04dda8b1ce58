// Positive twin of 25_values_not_renamed_fail.cpp: V renamed like K, the sum over Key.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto h = Head<16, 8>::make(g, "");
  auto q = linear(x, h.q);
  auto k = rename<Seq, Key>(linear(x, h.k));
  auto v = rename<Seq, Key>(linear(x, h.v));
  auto p = softmax<Key>(scaled(contract<HeadDim>(q, k)));
  auto out = contract<Key>(p, v);
  output(out, "out");
}
