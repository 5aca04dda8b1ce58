// A gradient used where its primal's axes do not fit: the weight's gradient [out, in] added to
// the activations [Batch, Seq, Model].
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
  // expected-error: `Hidden` of rhs [Hidden=8, Model=8] is not an axis of lhs [Batch=2, Seq=4, Model=8]
  auto wrong = add(x, dw);
  (void)dx;
  (void)wrong;
}
