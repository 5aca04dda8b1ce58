// The gradient of a tensor that is not a scalar: the per-token losses [Batch, Seq] handed to
// grad() as they are (PyTorch's backward() refuses it at run time: "grad can be implicitly
// created only for scalar outputs").
#include <qkv/dsl/grad.hpp>
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<8>>>(g, "x");
  auto w = linear_params<Model<8>, Hidden<1>>(g, "head");
  auto per_token = merge<Seq, Hidden, Seq>(linear(x, w));
  // expected-error: grad: the loss [Batch=2, Seq=4] is not a scalar; fix: reduce it first, e.g. sum_all(loss) or mean_all(loss)
  auto dx = grad(per_token, x);
  (void)dx;
}
