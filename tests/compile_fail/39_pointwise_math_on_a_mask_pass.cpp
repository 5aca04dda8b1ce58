// The twin of 39_pointwise_math_on_a_mask_fail.cpp: the mask selects between two tensors.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto keep = input<KeyPaddingMask<Batch<2>, Key<4>>>(g, "keep");
  auto x = input<Tensor<f32, Batch<2>, Key<4>>>(g, "x");
  auto y = sigmoid(where(keep, x, -1.0e4));
  (void)y;
}
