// Positive twin of 24_keys_not_renamed_fail.cpp: the keys get their own axis.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto h = Head<16, 8>::make(g, "");
  auto q = linear(x, h.q);
  auto k = rename<Seq, Key>(linear(x, h.k));
  auto scores = scaled(contract<HeadDim>(q, k));
  output(softmax<Key>(scores), "weights");
}
