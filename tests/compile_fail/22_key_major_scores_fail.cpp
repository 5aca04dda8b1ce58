// Issue 12, item 6 - scores laid out key-major, [Batch, Heads, Key, Seq] (contract<HeadDim>(k, q)),
// with the padding mask built over the query positions: by name the mask covers the query axis,
// whatever the layout.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "k");
  auto v = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "v");
  auto pad = input<KeyPaddingMask<Batch<2>, Seq<4>>>(g, "padding_over_queries");
  auto scores = scaled(contract<HeadDim>(k, q));  // [Batch, Heads, Key, Seq]
  // expected-error: masked: the key-padding mask covers `Seq` (4), not the key axis `Key` of the scores [Batch=2, Heads=2, Key=4, Seq=4]; fix: build the mask over the keys, e.g. rename<Seq, Key>(mask)
  auto p = softmax<Key>(masked(scores, pad));
  output(contract<Key>(p, v), "attended");
}
