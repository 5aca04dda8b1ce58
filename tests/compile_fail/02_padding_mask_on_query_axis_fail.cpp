// Catalogue 2 - the padding mask built over the query positions (`Seq`) and broadcast over
// the query axis of the scores, instead of over the keys.
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
  auto scores = scaled(contract<HeadDim>(q, k));  // [Batch, Seq, Key]
  // expected-error: masked: the key-padding mask covers `Seq` (4), not the key axis `Key` of the scores [Batch=2, Seq=4, Key=4]; fix: build the mask over the keys, e.g. rename<Seq, Key>(mask)
  auto p = softmax<Key>(masked(scores, pad));
  (void)p;
}
