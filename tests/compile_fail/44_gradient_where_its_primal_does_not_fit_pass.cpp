// The weight's gradient used where the weight fits: one SGD step, w − 0.1 · dw.
#include <qkv/dsl/grad.hpp>
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<8>>>(g, "x");
  auto w = param<Tensor<f32, Hidden<8>, Model<8>>>(g, "w");
  auto y = contract<Model>(x, w);
  auto [dx, dw] = grad(sum_all(y), x, w);
  output(w - dw * 0.1, "w_next");
  (void)dx;
}
