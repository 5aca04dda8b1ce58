// Lesson 06 — a transformer encoder layer, post-norm and pre-norm, as torch.nn.TransformerEncoderLayer.
//
//   post-norm (PyTorch's default): x = norm1(x + self_attn(x)); x = norm2(x + ff(x))
//   pre-norm  (norm_first=True):   x = x + self_attn(norm1(x)); x = x + ff(norm2(x))
//
// The residual adds are checked by name and size: the attention branch must give back d_model
// features (lesson 07, bug 8).
//
//     ./build/examples/06_encoder_layer
#include <cstdlib>
#include <iostream>

#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

template <NormPlacement P>
Graph encoder(const char* title) {
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<32>>>(g, "src");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "src_keep");
  auto layer = EncoderLayer<32, 4, 64, Activation::relu>::make(g, "", P);
  output(layer(x, keep), "out");
  std::cout << title << "\n\n" << g.table() << "\n";
  return g;
}

int main() {
  const Graph post = encoder<NormPlacement::post>("Encoder layer, post-norm:");
  const Graph pre = encoder<NormPlacement::pre>("Encoder layer, pre-norm:");
  const bool ok = post.node(post.outputs()[0].node).op == Op::layer_norm && pre.node(pre.outputs()[0].node).op == Op::add;
  std::cout << "post-norm ends in a layer norm, pre-norm in a residual add: " << (ok ? "ok" : "FAILED") << "\n";
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
