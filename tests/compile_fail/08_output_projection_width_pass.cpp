// Positive twin of 08_output_projection_width_fail.cpp: the correct program compiles.
#include <array>

#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<32>>>(g, "x");
  auto h0 = Head<32, 8>::make(g, "heads.0.");
  auto h1 = Head<32, 8>::make(g, "heads.1.");
  auto w_o = linear_params<Model<16>, Model<32>>(g, "out_proj");
  auto both = concat<ValueDim, Model>(std::array{h0(x).first, h1(x).first});
  auto out = linear(both, w_o);
  (void)out;
}
