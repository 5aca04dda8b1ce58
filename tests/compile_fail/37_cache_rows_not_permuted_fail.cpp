// A KV cache is [Batch, KvHeads, Slot, HeadDim]; a step's keys come out of the projection as
// [Batch, Seq, KvHeads, HeadDim]. Appending them unpermuted would write rows of the wrong
// layout into the cache: a compile error that gives the permute.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto cache = input<KvCache>(g, "cache_k");
  auto keys = input<Tensor<f32, Batch<dyn>, Seq<dyn>, KvHeads<dyn>, HeadDim<dyn>>>(g, "keys");
  const auto past = size_input<Past>(g, "past_length");
  // clang-format off
  // expected-error: cache_append: the rows are [Batch=dyn, Seq=dyn, KvHeads=dyn, HeadDim=dyn] but must be laid out as the cache [Batch=dyn, KvHeads=dyn, Slot=dyn, HeadDim=dyn] with `Seq` for `Slot`; fix: permute<Batch, KvHeads, Seq, HeadDim>(x)
  auto [updated, prefix] = cache_append<Slot, Seq, Key>(cache, keys, past);
  // clang-format on
  (void)updated;
  (void)prefix;
}
