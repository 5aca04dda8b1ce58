// softmax over the query axis of causal scores: the contraction (the axis of k) and causal<Seq, Key>
// agree that Key is the key axis, so the softmax is what is wrong — not the causal mask (the old
// message blamed causal and suggested swapping its axes).
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Key<4>, HeadDim<8>>>(g, "k");
  auto s = causal<Seq, Key>(scaled(contract<HeadDim>(q, k)));
  // expected-error: softmax: the key axis of the scores [Batch=2, Seq=4, Key=4] is `Key` (the axis k brought to the contraction, and causal<Seq, Key> says so too), but softmax is over `Seq`; fix: softmax<Key>(scores)
  auto p = softmax<Seq>(s);
  (void)p;
}
