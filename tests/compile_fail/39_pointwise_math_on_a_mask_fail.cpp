// Element-wise math takes floating tensors: a bool mask selects with where(mask, a, b).
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto keep = input<KeyPaddingMask<Batch<2>, Key<4>>>(g, "keep");
  // expected-error: sigmoid: [Batch=2, Key=4] is bool, not a floating tensor; fix: convert<f32>(x) first (a mask selects with where)
  auto y = sigmoid(keep);
  (void)y;
}
