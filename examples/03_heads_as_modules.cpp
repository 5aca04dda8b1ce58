// Lesson 03 — multi-head attention as a list of single heads, concatenated.
//
// The other way the tutorials write it: H independent heads, each projecting d_model to
// d_k = d_model / H, their outputs concatenated along the feature axis, then W_o. Same
// function as lesson 02's split/permute form given the same weights; the graph differs. The
// lesson runs both and compares.
//
//     ./build/examples/03_heads_as_modules
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>

#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");

  // Four heads of width 4. Each is a Head<16, 4>: q/k_proj Model -> HeadDim, v_proj Model -> ValueDim.
  auto heads = HeadsAsModules<16, 4>::make(g);

  // concat<ValueDim, Model> joins the four [Batch, Seq, ValueDim=4] outputs into [Batch, Seq, Model=16];
  // W_o's input width must be heads x d_v (lesson 07, bug 8).
  Tensor<f32, Batch<2>, Seq<4>, Model<16>> out = heads(x);
  output(out, "out");

  std::cout << "Four heads as modules:\n\n" << g.table();
  int concat_inputs = 0;
  for (const auto& n : g.nodes())
    if (n.op == Op::concat) concat_inputs = static_cast<int>(n.inputs.size());
  std::cout << "\nconcat joins " << concat_inputs << " head outputs\n";

  // The split/permute form with the same weights: head h's q/k/v rows are rows [4h, 4h+4) of the
  // fused projection's q, k and v blocks.
  Graph split_form;
  auto x2 = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(split_form, "x");
  output(MultiHeadAttention<16, 4>::make(split_form)(x2).first, "out");
  Feeds per_head = random_feeds(g, {}, /*seed=*/3, 0.5f);
  Feeds fused = per_head;
  std::vector<float> w, b;
  for (const char* part : {"q_proj", "k_proj", "v_proj"})
    for (int h = 0; h < 4; ++h) {
      const std::string prefix = "heads." + std::to_string(h) + "." + part;
      const auto pw = per_head.at(prefix + ".weight").to_f32(), pb = per_head.at(prefix + ".bias").to_f32();
      w.insert(w.end(), pw.begin(), pw.end());
      b.insert(b.end(), pb.begin(), pb.end());
    }
  fused["in_proj_weight"] = NdArray::from_f32(w, {48, 16});
  fused["in_proj_bias"] = NdArray::from_f32(b, {48});
  const auto a = interpret(g, per_head).outputs.at("out").to_f32();
  const auto c = interpret(split_form, fused).outputs.at("out").to_f32();
  double diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff = std::max(diff, static_cast<double>(std::abs(a[i] - c[i])));
  std::cout << "heads as modules vs split/permute, same weights: max |diff| = " << diff << "\n";
  const bool ok = concat_inputs == 4 && a.size() == c.size() && diff < 1e-5;
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
