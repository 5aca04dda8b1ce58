// The twin of 38_pointwise_operand_axis_missing_fail.cpp: the floor over the hidden axis.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto h = input<Tensor<f32, Batch<2>, Seq<4>, Hidden<32>>>(g, "h");
  auto floor = input<Tensor<f32, Hidden<32>>>(g, "floor");
  auto y = max(h, floor);
  (void)y;
}
