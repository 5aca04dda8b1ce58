// Positive twin of 26_view_with_dynamic_batch_fail.cpp: a view may restate a dynamic batch as a
// static one (checked at bind time); the heads are split and permuted by name.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<4>, Model<16>>>(g, "x");
  auto sized = view<Batch<2>, Seq<4>, Model<16>>(x);
  auto heads = permute<Batch, Heads, Seq, HeadDim>(split<Model, Heads<2>, HeadDim<8>>(sized));
  output(heads, "heads");
}
