// Issue 12, item 8 - Q from a batch of 2 and K from a batch of 3: `Batch` is not contracted, it
// is a batch axis both operands keep, and the fix says so (it used to speak of d_k).
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<3>, Heads<2>, Key<4>, HeadDim<8>>>(g, "k");
  // expected-error: contract: `Batch` of lhs (2) must equal `Batch` of rhs (3); fix: `Batch` is kept by both operands, so it is a batch axis and must have one size (the same batch, the same heads)
  auto scores = contract<HeadDim>(q, k);
  output(softmax<Key>(scaled(scores)), "weights");
}
