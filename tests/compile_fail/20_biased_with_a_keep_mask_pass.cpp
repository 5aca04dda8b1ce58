// Positive twin of 20_biased_with_a_keep_mask_fail.cpp: a keep-mask is applied with masked().
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "k");
  auto pad = input<KeyPaddingMask<Batch<2>, Key<4>>>(g, "key_padding");
  auto scores = scaled(contract<HeadDim>(q, k));
  auto p = softmax<Key>(masked(scores, pad));
  output(p, "weights");
}
