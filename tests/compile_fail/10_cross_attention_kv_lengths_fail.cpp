// Catalogue 10 - cross-attention with keys from a 6-token memory and values from a 5-token one.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto key_mem = input<Tensor<f32, Batch<2>, Mem<6>, Model<16>>>(g, "key_memory");
  auto value_mem = input<Tensor<f32, Batch<2>, Mem<5>, Model<16>>>(g, "value_memory");
  auto h = Head<16, 16>::make(g, "");
  auto k = rename<Mem, Key>(linear(key_mem, h.k));
  auto v = rename<Mem, Key>(linear(value_mem, h.v));
  auto p = softmax<Key>(scaled(contract<HeadDim>(linear(x, h.q), k)));
  // expected-error: contract: `Key` of lhs (6) must equal `Key` of rhs (5); fix: contracted axes must have one size (Q*K^T: the same d_k; P*V: keys and values from one sequence)
  auto out = contract<Key>(p, v);
  (void)out;
}
