// The twin of 40_append_along_the_wrong_axis_fail.cpp: the CLS token joined along Seq.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto cls = input<Tensor<f32, Batch<2>, Seq<1>, Model<8>>>(g, "cls");
  auto x = input<Tensor<f32, Batch<2>, Seq<16>, Model<8>>>(g, "x");
  auto y = append<Seq>(cls, x);
  (void)y;
}
