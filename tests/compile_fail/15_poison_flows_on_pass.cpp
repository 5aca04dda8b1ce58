// Positive twin of 15_poison_flows_on_fail.cpp: the same program with the scores scaled.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "k");
  auto v = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "v");
  auto keep = input<KeyPaddingMask<Batch<2>, Key<4>>>(g, "keep");
  auto p = softmax<Key>(masked(scaled(contract<HeadDim>(q, k)), keep));
  auto o = contract<Key>(dropout(p, 0.1, 7), v);
  output(o, "attended");
  output(p, "weights");
  Tensor<f32, Batch<2>, Heads<2>, Seq<4>, Key<4>> weights = p;
  auto merge_heads = [](const Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>& t) {
    return merge<Heads, HeadDim, Model>(permute<Batch, Seq, Heads, HeadDim>(t));
  };
  auto [out, mha_weights] = MultiHeadAttention<16, 2>::make(g)(merge_heads(o), keep);
  output(out, "out");
  output(mha_weights, "mha_weights");
  (void)weights;
}
