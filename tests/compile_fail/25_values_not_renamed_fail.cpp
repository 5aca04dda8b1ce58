// Issue 12, item 8 - softmax over Key, then the weighted sum over Seq because V's sequence axis
// was not renamed like K's: the fix is the rename, not another softmax.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto h = Head<16, 8>::make(g, "");
  auto q = linear(x, h.q);
  auto k = rename<Seq, Key>(linear(x, h.k));
  auto v = linear(x, h.v);
  auto p = softmax<Key>(scaled(contract<HeadDim>(q, k)));
  // expected-error: contract: weights are normalised over `Key` but contracted over `Seq`, and the values [Batch=2, Seq=4, ValueDim=8] have no axis `Key`; fix: rename the sequence axis of the values: rename<Seq, Key>(v), then contract<Key>(p, v)
  auto out = contract<Seq>(p, v);
  output(out, "out");
}
