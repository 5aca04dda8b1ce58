// RoPE pairs feature i with i + D/2 of each head: applied to the projection before it is split
// into heads, it would pair features of different heads. The features must be `HeadDim`.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<8>, Model<64>>>(g, "x");
  auto positions = input<Tensor<i64, Batch<2>, Seq<8>>>(g, "positions");
  auto q = linear(x, linear_params<Model<64>, Model<64>>(g, "q_proj"));
  // clang-format off
  // expected-error: rope: x [Batch=2, Seq=8, Model=64] has no axis `HeadDim` to rotate; fix: apply rope to per-head queries and keys, over their features
  auto r = rope<HeadDim, Seq>(q, positions);
  // clang-format on
  (void)r;
}
