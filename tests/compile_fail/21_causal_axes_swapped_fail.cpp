// Issue 12, item 5 - causal<Key, Seq> with 4 queries and 4 keys: the sizes agree, but with the
// axes swapped every query would attend only to itself and the future.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "k");
  auto scores = scaled(contract<HeadDim>(q, k));
  // expected-error: causal: causal<Key, Seq> takes `Seq` as the key axis, but softmax normalises the scores [Batch=2, Heads=2, Seq=4, Key=4] over `Key`; fix: the query axis first, then the key axis: causal<Seq, Key>(scores)
  auto p = softmax<Key>(causal<Key, Seq>(scores));
  output(p, "weights");
}
