// Issue 12, item 3 - MultiHeadAttention::cross(x, memory, mask) with 5 queries against a
// 7-token memory and a causal mask that does not say how it is aligned. (The call used to be
// taken for cross(x, key, value): `no type named 'axis_list' in 'qkv::nn::Causal<>'` and 7-9
// error lines.)
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<5>, Model<16>>>(g, "x");
  auto memory = input<Tensor<f32, Batch<2>, Mem<7>, Model<16>>>(g, "memory");
  auto mha = MultiHeadAttention<16, 2>::make(g);
  // expected-error: causal: `Seq` (5) != `Key` (7), so the alignment of the mask matters; fix: pass causal_top_left (as PyTorch is_causal) or causal_bottom_right (as FlashAttention) instead of causal_mask
  auto [out, weights] = mha.cross(x, memory, causal_mask);
  output(out, "out");
  output(weights, "weights");
}
