// Lesson 06 — a transformer encoder layer, post-norm and pre-norm, as torch.nn.TransformerEncoderLayer.
//
//   post-norm (PyTorch's default): x = norm1(x + self_attn(x)); x = norm2(x + ff(x))
//   pre-norm  (norm_first=True):   x = x + self_attn(norm1(x)); x = x + ff(norm2(x))
//
// The residual adds are checked by name and size: the attention branch must give back d_model
// features (lesson 07, bug 8).
//
//     ./build/examples/06_encoder_layer
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

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

/// Post-norm ends in norm2: with gain 1 and shift 0 every position comes out with mean 0 and
/// variance 1 over d_model (up to eps) — a property to check on a real run.
bool post_norm_output_is_normalised(const Graph& g) {
  Feeds feeds = random_feeds(g, {{"Batch", 2}, {"Seq", 6}, {"Key", 6}}, /*seed=*/9, 0.3f);
  feeds["src_keep"] = keep_first({6, 4}, 6);
  feeds["norm2.weight"] = NdArray::from_f32(std::vector<float>(32, 1.0f), {32});
  feeds["norm2.bias"] = NdArray::from_f32(std::vector<float>(32, 0.0f), {32});
  const auto y = interpret(g, feeds).outputs.at("out").to_f32();
  bool ok = y.size() == 2 * 6 * 32;
  for (std::size_t row = 0; row * 32 < y.size(); ++row) {
    double mean = 0, var = 0;
    for (int e = 0; e < 32; ++e) mean += y[row * 32 + e] / 32.0;
    for (int e = 0; e < 32; ++e) var += (y[row * 32 + e] - mean) * (y[row * 32 + e] - mean) / 32.0;
    ok = ok && std::abs(mean) < 1e-5 && std::abs(var - 1.0) < 1e-3;
  }
  return ok;
}

int main() {
  const Graph post = encoder<NormPlacement::post>("Encoder layer, post-norm:");
  const Graph pre = encoder<NormPlacement::pre>("Encoder layer, pre-norm:");
  bool ok = post.node(post.outputs()[0].node).op == Op::layer_norm && pre.node(pre.outputs()[0].node).op == Op::add;
  std::cout << "post-norm ends in a layer norm, pre-norm in a residual add: " << (ok ? "ok" : "FAILED") << "\n";
  const bool normalised = post_norm_output_is_normalised(post);
  std::cout << "post-norm output rows have mean 0 and variance 1: " << (normalised ? "ok" : "FAILED") << "\n";
  return ok && normalised ? EXIT_SUCCESS : EXIT_FAILURE;
}
