// A learned CLS token [Batch, Seq = 1, Model] joined to the tokens along the feature axis instead
// of the sequence axis: the parts differ on Seq. (This compiled and then failed at run time with
// an internal error.)
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto cls = input<Tensor<f32, Batch<2>, Seq<1>, Model<8>>>(g, "cls");
  auto x = input<Tensor<f32, Batch<2>, Seq<16>, Model<8>>>(g, "x");
  // expected-error: append: `Model`-joined parts differ on `Seq` (1 vs 16); fix: give both parts the same sizes off the joined axis (append along `Seq` if that is the axis to join)
  auto y = append<Model>(cls, x);
  (void)y;
}
