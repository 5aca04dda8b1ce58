// RoPE rotates each token by its own position: the keys' positions given to the queries (the
// positions of a cache of 9 keys for 1 new query) are a compile error naming both axes.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<1>, Seq<1>, Heads<4>, HeadDim<16>>>(g, "q");
  auto key_positions = input<Tensor<i64, Batch<1>, Key<9>>>(g, "key_positions");
  // clang-format off
  // expected-error: rope: positions [Batch=1, Key=9] have no axis `Seq`, so they are not the positions of the tokens along `Seq`; fix: positions over `Seq` (e.g. [Batch, Seq])
  auto r = rope<HeadDim, Seq>(q, key_positions);
  // clang-format on
  (void)r;
}
