// Issue 14 - a document mask that reads the key ids [Batch, Key] with the query index.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q_ = input<Tensor<f32, Batch<2>, Heads<2>, Seq<5>, HeadDim<4>>>(g, "q");
  auto k_ = input<Tensor<f32, Batch<2>, Heads<2>, Key<7>, HeadDim<4>>>(g, "k");
  auto s = scaled(contract<HeadDim>(q_, k_));
  auto q_doc = input<Tensor<i32, Batch<2>, Seq<5>>>(g, "q_doc");
  auto kv_doc = input<Tensor<i32, Batch<2>, Key<7>>>(g, "kv_doc");
  // expected-error: load: `Key` of [Batch=2, Key=7] is an axis of the scores, indexed here by the query index q (`Seq`); fix: index `Key` by the key index k
  auto p = softmax<Key>(modded(s, mask_mod([&](auto b, auto, auto q, auto) { return q_doc[b][q] == kv_doc[b][q]; })));
  output(p, "weights");
}
