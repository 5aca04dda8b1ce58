// The twin of 41_softmax_over_queries_after_causal_fail.cpp: softmax over the keys.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Key<4>, HeadDim<8>>>(g, "k");
  auto s = causal<Seq, Key>(scaled(contract<HeadDim>(q, k)));
  auto p = softmax<Key>(s);
  (void)p;
}
