// Catalogue 6 - a sequence-first tensor [Seq, Batch, Model] (PyTorch's default layout) fed
// to a block that is batch_first.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Seq<4>, Batch<2>, Model<16>>>(g, "x_seq_first");
  auto mha = MultiHeadAttention<16, 2>::make(g);
  // expected-error: multi_head_attention: x is [Seq=4, Batch=2, Model=16] but must be [Batch=dyn, Seq=dyn, Model=dyn] (batch first); fix: permute<Batch, Seq, Model>(x)
  auto [out, weights] = mha(x);
  (void)out;
  (void)weights;
}
