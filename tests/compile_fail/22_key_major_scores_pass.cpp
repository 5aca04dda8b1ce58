// Positive twin of 22_key_major_scores_fail.cpp: key-major scores [Batch, Heads, Key, Seq] with
// the padding mask over the keys and a causal mask, softmax over Key and the weighted sum over
// Key — all by name, whatever the layout (used to be refused: "the key-padding mask covers Key
// (4), not the key axis Seq of the scores").
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "k");
  auto v = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "v");
  auto pad = input<KeyPaddingMask<Batch<2>, Key<4>>>(g, "key_padding");
  auto scores = scaled(contract<HeadDim>(k, q));  // [Batch, Heads, Key, Seq]
  auto p = softmax<Key>(causal<Seq, Key>(masked(scores, pad)));
  output(contract<Key>(p, v), "attended");
}
