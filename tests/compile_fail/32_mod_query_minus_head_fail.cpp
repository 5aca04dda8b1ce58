// Issue 14 - `q - h`: a query index mixed with a head index (only query and key positions
// mix).
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto q_ = input<Tensor<f32, Batch<2>, Heads<2>, Seq<5>, HeadDim<4>>>(g, "q");
  auto k_ = input<Tensor<f32, Batch<2>, Heads<2>, Key<7>, HeadDim<4>>>(g, "k");
  auto s = scaled(contract<HeadDim>(q_, k_));
  // expected-error: mask_mod: `-` mixes the query index q (`Seq`) with the head index h (`Heads`); fix: only query and key positions mix (q - k)
  auto p = softmax<Key>(modded(s, mask_mod([](auto, auto h, auto q, auto k) { return k <= q - h; }, bottom_right)));
  output(p, "weights");
}
