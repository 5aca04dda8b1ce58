// A slice past the end of a static axis: the last 8 of 16 tokens taken from 12.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<12>, Model<8>>>(g, "x");
  // expected-error: slice: [8, 16) is outside `Seq` (12); fix: a range inside the axis
  auto tail = slice<Seq, 8, 8>(x);
  (void)tail;
}
