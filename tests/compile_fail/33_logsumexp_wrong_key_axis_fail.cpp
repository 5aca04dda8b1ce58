// The log-sum-exp taken with the same checks as softmax: here over a key axis the mask does not
// cover (a key-padding mask over `Key`, logsumexp over `Seq`).
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<64>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<64>>>(g, "k");
  auto pad = input<KeyPaddingMask<Batch<2>, Key<4>>>(g, "pad");
  auto s = masked(scaled(contract<HeadDim>(q, k)), pad);
  // clang-format off
  // expected-error: masked: the key-padding mask covers `Key` (4), not the key axis `Seq` of the scores [Batch=2, Heads=2, Seq=4, Key=4]; fix: build the mask over the keys, e.g. rename<Key, Seq>(mask)
  auto lse = logsumexp<Seq>(s);
  // clang-format on
  (void)lse;
}
