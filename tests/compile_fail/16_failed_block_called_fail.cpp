// Issue 12, item 1 - a building block whose make() fails (6 query heads cannot share 4
// key/value heads), then called as the lessons call blocks. The block is poison: calling it,
// decomposing its result and passing that on print nothing more.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<48>>>(g, "x");
  // expected-error: grouped_query_attention: query heads (6) must be a multiple of key/value heads (4); fix: choose a number of key/value heads that divides the query heads
  auto gqa = GroupedQueryAttention<48, 6, 4>::make(g);
  auto [out, weights] = gqa(x, causal_mask);
  output(out, "out");
  output(weights, "weights");
  auto again = add(x, gqa(out).first);
  output(again, "residual");
}
