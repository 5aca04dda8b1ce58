// Positive twin of 20b_block_given_a_bool_tensor_fail.cpp: the mask declared as what it is.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto real_tokens = input<KeyPaddingMask<Batch<2>, Key<4>>>(g, "real_tokens");
  auto mha = MultiHeadAttention<16, 2>::make(g);
  auto [out, weights] = mha(x, real_tokens);
  output(out, "out");
  output(weights, "weights");
}
