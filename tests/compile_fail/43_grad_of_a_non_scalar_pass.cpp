// The same per-token losses averaged first: a scalar, whose gradient has x's type.
#include <qkv/dsl/grad.hpp>
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<8>>>(g, "x");
  auto w = linear_params<Model<8>, Hidden<1>>(g, "head");
  auto per_token = merge<Seq, Hidden, Seq>(linear(x, w));
  Tensor<f32, Batch<2>, Seq<4>, Model<8>> dx = grad(mean_all(per_token), x);
  output(dx, "dx");
}
