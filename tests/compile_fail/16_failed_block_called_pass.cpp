// Positive twin of 16_failed_block_called_fail.cpp: 6 query heads share 3 key/value heads.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<48>>>(g, "x");
  auto gqa = GroupedQueryAttention<48, 6, 3>::make(g);
  auto [out, weights] = gqa(x, causal_mask);
  output(out, "out");
  output(weights, "weights");
  auto again = add(x, gqa(out).first);
  output(again, "residual");
}
