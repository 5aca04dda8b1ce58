// Element-wise math broadcasts by name: the second operand's axes must be axes of the first.
// Here the bias of an FFN's hidden layer is declared over the model width instead.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto h = input<Tensor<f32, Batch<2>, Seq<4>, Hidden<32>>>(g, "h");
  auto floor = input<Tensor<f32, Model<32>>>(g, "floor");
  // expected-error: max: `Model` of rhs [Model=32] is not an axis of lhs [Batch=2, Seq=4, Hidden=32]; fix: every axis of rhs must be an axis of lhs, of the same size (the operand with every axis goes first)
  auto y = max(h, floor);
  (void)y;
}
