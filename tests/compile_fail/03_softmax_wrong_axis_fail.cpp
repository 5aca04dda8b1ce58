// Catalogue 3 - softmax over the query axis (`dim=1` instead of `dim=-1`), then the weighted
// sum contracts the key axis: the weights do not sum to one over what is summed.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto h = Head<16, 16>::make(g, "");
  auto q = linear(x, h.q);
  auto k = rename<Seq, Key>(linear(x, h.k));
  auto v = rename<Seq, Key>(linear(x, h.v));
  auto p = softmax<Seq>(scaled(contract<HeadDim>(q, k)));
  // expected-error: contract: weights are normalised over `Seq` but contracted over `Key`; fix: softmax<Key>(scores)
  auto out = contract<Key>(p, v);
  (void)out;
}
