// Positive twin of 27_contract_batch_sizes_fail.cpp: Q and K from the same batch.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "k");
  auto scores = contract<HeadDim>(q, k);
  output(softmax<Key>(scaled(scores)), "weights");
}
