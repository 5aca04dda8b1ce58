// Catalogue 12 - a causal mask on 4 queries against 6 keys (a cache) without saying how
// the triangle is aligned.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<1>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<1>, Key<6>, HeadDim<8>>>(g, "k");
  auto scores = scaled(contract<HeadDim>(q, k));
  // expected-error: causal: `Seq` (4) != `Key` (6), so the alignment of the mask matters; fix: causal<Seq, Key>(s, top_left) as in PyTorch is_causal, or bottom_right as in FlashAttention
  auto p = softmax<Key>(causal<Seq, Key>(scores));
  (void)p;
}
