// The twin of 42_slice_past_the_end_fail.cpp: the last 4 of 12.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<12>, Model<8>>>(g, "x");
  auto tail = slice<Seq, 8, 4>(x);
  (void)tail;
}
