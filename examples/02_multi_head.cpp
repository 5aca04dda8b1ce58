// Lesson 02 — multi-head attention: split, permute, attend, permute back, merge.
//
// d_model = 16 split into 2 heads of 8. The steps the tutorials write with view/transpose are
// named here, and each one is checked by name:
//   [Batch, Seq, Model] --split--> [Batch, Seq, Heads, HeadDim] --permute--> [Batch, Heads, Seq, HeadDim]
//   attend per head                                                   -> [Batch, Heads, Seq, HeadDim]
//   --permute--> [Batch, Seq, Heads, HeadDim] --merge--> [Batch, Seq, Model] --W_o-->
//
// Then both versions — by hand and the library block — run on the same seeded weights and must
// agree: the library's fused in_proj_weight is q_proj, k_proj and v_proj stacked.
//
//     ./build/examples/02_multi_head
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

using namespace qkv;
using namespace qkv::nn;  // the library's axis names: Batch, Seq, Key, Model, Heads, HeadDim, ...

constexpr int kModel = 16, kHeads = 2, kHeadDim = kModel / kHeads;

int main() {
  Graph g;
  // Batch and sequence length are dynamic: bound when the graph runs.
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<kModel>>>(g, "x");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");

  // By hand, with the ops (the library's MultiHeadAttention does exactly this):
  auto w_q = linear_params<Model<kModel>, Model<kModel>>(g, "q_proj");
  auto w_k = linear_params<Model<kModel>, Model<kModel>>(g, "k_proj");
  auto w_v = linear_params<Model<kModel>, Model<kModel>>(g, "v_proj");
  auto w_o = linear_params<Model<kModel>, Model<kModel>>(g, "out_proj");

  // split needs the factors to multiply to d_model (16 = 2 x 8): 6 heads would not compile.
  auto to_heads = [](auto t) {
    return permute<Batch, Heads, Seq, HeadDim>(split<Model, Heads<kHeads>, HeadDim<kHeadDim>>(t));
  };
  auto q = to_heads(linear(x, w_q));
  auto k = rename<Seq, Key>(to_heads(linear(x, w_k)));
  auto v = rename<Seq, Key>(to_heads(linear(x, w_v)));

  // Each head attends on its own: Heads is a batch axis of the contraction.
  auto p = softmax<Key>(masked(scaled(contract<HeadDim>(q, k)), keep));  // [Batch, Heads, Seq, Key]
  auto o = contract<Key>(p, v);                                          // [Batch, Heads, Seq, HeadDim]

  // Back to tokens: the heads must sit next to HeadDim before they merge (lesson 07, bug 9).
  auto merged = merge<Heads, HeadDim, Model>(permute<Batch, Seq, Heads, HeadDim>(o));
  Tensor<f32, Batch<dyn>, Seq<dyn>, Model<kModel>> out = linear(merged, w_o);
  output(out, "out");

  std::cout << "Multi-head attention, d_model 16, 2 heads:\n\n" << g.table();

  // The same model from the library block records the same kinds of steps.
  Graph lib;
  auto x2 = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<kModel>>>(lib, "x");
  output(MultiHeadAttention<kModel, kHeads>::make(lib)(x2).first, "out");
  std::cout << "\nqkv::nn::MultiHeadAttention<16, 2> records " << lib.size()
            << " nodes (fused in_proj cut in three).\n";

  // Bind sizes: batch 3, 5 tokens, a mask over 5 keys. Every deferred check passes; a mask
  // over 4 keys would not (the ShapeError carries the same message a static size would give).
  g.check({{"Batch", 3}, {"Seq", 5}, {"Key", 5}});
  try {
    g.check({{"Batch", 3}, {"Seq", 5}, {"Key", 4}});
    return EXIT_FAILURE;
  } catch (const ShapeError& e) {
    std::cout << "\nwith a 4-key mask for 5 tokens:\n  ShapeError: " << e.what() << "\n";
  }
  bool ok = out.node().axes[2].extent == Extent::fixed(kModel) && p.node().attr_axes[0] == "Key";

  // Run both on batch 3, 5 tokens, the same weights.
  const Bindings sizes{{"Batch", 3}, {"Seq", 5}, {"Key", 5}};
  Feeds hand = random_feeds(g, sizes, /*seed=*/7, 0.5f);
  hand["keep"] = keep_first({5, 3, 1}, 5);
  Feeds fused = hand;
  std::vector<float> w, b;  // in_proj_weight = [W_q; W_k; W_v], in_proj_bias = [b_q; b_k; b_v]
  for (const char* part : {"q_proj", "k_proj", "v_proj"}) {
    const auto pw = hand.at(std::string(part) + ".weight").to_f32(), pb = hand.at(std::string(part) + ".bias").to_f32();
    w.insert(w.end(), pw.begin(), pw.end());
    b.insert(b.end(), pb.begin(), pb.end());
  }
  fused["in_proj_weight"] = NdArray::from_f32(w, {3 * kModel, kModel});
  fused["in_proj_bias"] = NdArray::from_f32(b, {3 * kModel});
  Graph lib2;  // the library block again, now with the padding mask
  auto x3 = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<kModel>>>(lib2, "x");
  auto keep3 = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(lib2, "keep");
  output(MultiHeadAttention<kModel, kHeads>::make(lib2)(x3, keep3).first, "out");
  const auto a = interpret(g, hand).outputs.at("out").to_f32();
  const auto c = interpret(lib2, fused).outputs.at("out").to_f32();
  double diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff = std::max(diff, static_cast<double>(std::abs(a[i] - c[i])));
  std::cout << "by hand vs qkv::nn::MultiHeadAttention on the same weights: max |diff| = " << diff << "\n";
  ok = ok && a.size() == c.size() && diff < 1e-5;
  std::cout << "checks: " << (ok ? "ok" : "FAILED") << "\n";
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
