// Issue 12, item 1 - after a shape error the program goes on, in every style the lessons use:
// the result captured as `auto` and passed on to ops and output(), converted to a declared
// type, passed to a lambda with a declared parameter, then to a building block. qkv's message
// must be the first and only error (g++ used to print `no matching function for call to
// 'output(qkv::poison&, ...)'` first).
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "k");
  auto v = input<Tensor<f32, Batch<2>, Heads<2>, Key<4>, HeadDim<8>>>(g, "v");
  auto keep = input<KeyPaddingMask<Batch<2>, Key<4>>>(g, "keep");
  // expected-error: softmax: scores [Batch=2, Heads=2, Seq=4, Key=4] are raw Q*K^T, not scaled by 1/sqrt(HeadDim=8); fix: softmax<Key>(scaled(scores)), or unscaled(scores) to opt out
  auto p = softmax<Key>(masked(contract<HeadDim>(q, k), keep));
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
