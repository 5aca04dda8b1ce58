// Positive twin of 17_view_to_lower_rank_fail.cpp: merge joins the heads by name; a view may
// restate the axes the tensor has (here: the batch size, now known).
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto attended = input<Tensor<f32, Batch<dyn>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "attended");
  auto heads_back = permute<Batch, Seq, Heads, HeadDim>(attended);
  auto context = merge<Heads, HeadDim, Model>(heads_back);
  auto sized = view<Batch<2>, Seq<4>, Model<16>>(context);
  output(sized, "context");
}
