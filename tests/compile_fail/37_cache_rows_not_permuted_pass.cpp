// Positive twin of 37_cache_rows_not_permuted_fail.cpp: the step's keys permuted to the cache's
// layout; the prefix the attention reads has `Key` in place of `Slot`.
#include <qkv/qkv.hpp>

#include <type_traits>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto cache = input<KvCache>(g, "cache_k");
  auto keys = input<Tensor<f32, Batch<dyn>, Seq<dyn>, KvHeads<dyn>, HeadDim<dyn>>>(g, "keys");
  const auto past = size_input<Past>(g, "past_length");
  auto [updated, prefix] = cache_append<Slot, Seq, Key>(cache, permute<Batch, KvHeads, Seq, HeadDim>(keys), past);
  static_assert(std::is_same_v<decltype(updated), KvCache>);
  static_assert(std::is_same_v<decltype(prefix), Tensor<f32, Batch<dyn>, KvHeads<dyn>, Key<dyn>, HeadDim<dyn>>>);
}
