// Issue 12, item 8 - Q and K projected from the same x and K's sequence axis not renamed: both
// have `Seq`, so Q*K^T is a dot product per position, and there is no key axis to attend over.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto h = Head<16, 8>::make(g, "");
  auto q = linear(x, h.q);
  auto k = linear(x, h.k);
  // expected-error: scaled: both operands of the contraction over `HeadDim` have the axis `Seq`, so the scores [Batch=2, Seq=4] have no key axis; fix: the keys need their own axis: rename<Seq, Key>(k)
  auto scores = scaled(contract<HeadDim>(q, k));
  output(softmax<Key>(scores), "weights");
}
