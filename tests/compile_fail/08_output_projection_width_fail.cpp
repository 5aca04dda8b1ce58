// Catalogue 8 - heads x d_v (2 x 8 = 16) does not match W_o's input width (32).
#include <array>

#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<32>>>(g, "x");
  auto h0 = Head<32, 8>::make(g, "heads.0.");
  auto h1 = Head<32, 8>::make(g, "heads.1.");
  auto w_o = linear_params<Model<32>, Model<32>>(g, "out_proj");
  auto both = concat<ValueDim, Model>(std::array{h0(x).first, h1(x).first});  // [Batch, Seq, Model=16]
  // expected-error: linear: `Model` of x (16) must equal the input width of the projection (32); fix: the features entering a projection (e.g. heads x d_v into W_o) must match its weight
  auto out = linear(both, w_o);
  (void)out;
}
