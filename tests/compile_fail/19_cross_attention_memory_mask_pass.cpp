// Positive twin of 19_cross_attention_memory_mask_fail.cpp: cross(x, memory, masks...) with a
// key-padding mask, an aligned causal mask, an additive bias; and PyTorch's cross(x, key,
// value, masks...) beside it. (The mask used to be taken for the values: "cross_attention
// value: x is [Batch=2, Key=7] but must have exactly the axes [Batch, Mem, Model]".)
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<5>, Model<16>>>(g, "x");
  auto memory = input<Tensor<f32, Batch<2>, Mem<7>, Model<16>>>(g, "memory");
  auto keep = input<KeyPaddingMask<Batch<2>, Key<7>>>(g, "keep");
  auto bias = input<Tensor<f32, Seq<5>, Key<7>>>(g, "bias");
  auto mha = MultiHeadAttention<16, 2>::make(g);
  auto [out, weights] = mha.cross(x, memory, keep);
  output(out, "out");
  output(weights, "weights");
  output(mha.cross(x, memory, causal_bottom_right, keep).first, "causal");
  output(mha.cross(x, memory, bias).first, "biased");
  output(mha.cross(x, memory, memory, keep, bias).first, "key_value");
}
