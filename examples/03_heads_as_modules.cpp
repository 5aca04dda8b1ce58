// Lesson 03 — multi-head attention as a list of single heads, concatenated.
//
// The other way the tutorials write it: H independent heads, each projecting d_model to
// d_k = d_model / H, their outputs concatenated along the feature axis, then W_o. Same
// function as lesson 02 given the same weights; the graph differs.
//
//     ./build/examples/03_heads_as_modules
#include <cstdlib>
#include <iostream>

#include <qkv/qkv.hpp>

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
  return concat_inputs == 4 ? EXIT_SUCCESS : EXIT_FAILURE;
}
