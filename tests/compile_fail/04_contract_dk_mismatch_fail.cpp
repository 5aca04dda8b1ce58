// Catalogue 4 - Q and K projected to different widths (d_k 64 vs 32), then Q·Kᵀ.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<128>>>(g, "x");
  auto w_q = linear_params<Model<128>, HeadDim<64>>(g, "q_proj");
  auto w_k = linear_params<Model<128>, HeadDim<32>>(g, "k_proj");
  auto q = linear(x, w_q);
  auto k = rename<Seq, Key>(linear(x, w_k));
  // expected-error: contract: `HeadDim` of lhs (64) must equal `HeadDim` of rhs (32); fix: contracted axes must have one size (Q*K^T: the same d_k; P*V: keys and values from one sequence)
  auto scores = contract<HeadDim>(q, k);
  (void)scores;
}
