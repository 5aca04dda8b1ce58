// Positive twin of 33_logsumexp_wrong_key_axis_fail.cpp: over the key axis the mask covers, the
// log-sum-exp has the scores' axes without it.
#include <qkv/qkv.hpp>

#include <type_traits>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<64>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<64>>>(g, "k");
  auto pad = input<KeyPaddingMask<Batch<2>, Key<4>>>(g, "pad");
  auto lse = logsumexp<Key>(masked(scaled(contract<HeadDim>(q, k)), pad));
  static_assert(std::is_same_v<typename decltype(lse)::axis_list, axes<Batch<2>, Heads<2>, Seq<4>>>);
}
