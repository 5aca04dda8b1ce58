// Issue 12, item 4 (user-built mask) - a padding mask built as a plain bool tensor, not declared
// as a keep-mask, passed to a building block: the block takes a non-mask tensor for an additive
// bias, and a bool tensor is not one.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto real_tokens = input<Tensor<boolean, Batch<2>, Key<4>>>(g, "real_tokens");
  auto mha = MultiHeadAttention<16, 2>::make(g);
  // expected-error: biased: [Batch=2, Key=4] is a bool mask (true = may attend), not an additive float bias; fix: masked(scores, mask), with the mask declared as KeepMask, KeyPaddingMask or AttnMask
  auto [out, weights] = mha(x, real_tokens);
  output(out, "out");
  output(weights, "weights");
}
