// Positive twin of 06_batch_first_confusion_fail.cpp: the correct program compiles.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Seq<4>, Batch<2>, Model<16>>>(g, "x_seq_first");
  auto mha = MultiHeadAttention<16, 2>::make(g);
  auto [out, weights] = mha(permute<Batch, Seq, Model>(x));
  (void)out;
  (void)weights;
}
