// Positive twin of 21_causal_axes_swapped_fail.cpp: the query axis first, then the key axis.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "k");
  auto scores = scaled(contract<HeadDim>(q, k));
  auto p = softmax<Key>(causal<Seq, Key>(scores));
  output(p, "weights");
}
