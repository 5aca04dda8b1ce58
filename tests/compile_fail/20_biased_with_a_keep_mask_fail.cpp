// Issue 12, item 4 - a key-padding mask (bool, true = a real token) passed to biased(): added to
// the scores as 0/1 it would exclude no key at all.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "k");
  auto pad = input<KeyPaddingMask<Batch<2>, Key<4>>>(g, "key_padding");
  auto scores = scaled(contract<HeadDim>(q, k));
  // expected-error: biased: [Batch=2, Key=4] is a bool mask (true = may attend), not an additive float bias; fix: masked(scores, mask), with the mask declared as KeepMask, KeyPaddingMask or AttnMask
  auto p = softmax<Key>(biased(scores, pad));
  output(p, "weights");
}
