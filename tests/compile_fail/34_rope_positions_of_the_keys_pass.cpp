// Positive twin of 34_rope_positions_of_the_keys_fail.cpp: the query's own positions [Batch, Seq].
#include <qkv/qkv.hpp>

#include <type_traits>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<1>, Seq<1>, Heads<4>, HeadDim<16>>>(g, "q");
  auto positions = input<Tensor<i64, Batch<1>, Seq<1>>>(g, "positions");
  auto r = rope<HeadDim, Seq>(q, positions, {.theta = 500000.0});
  static_assert(std::is_same_v<decltype(r), decltype(q)>);
}
