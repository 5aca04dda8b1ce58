// Issue 12, item 2 - PyTorch's `context.transpose(1, 2).contiguous().view(B, S, E)` written as a
// qkv view from four axes to three. A view only restates axes; joining two is merge (this used
// to fail inside Hana, `no matching function for call to 'ebo_get'`, before qkv's message).
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto attended = input<Tensor<f32, Batch<dyn>, Heads<2>, Seq<4>, HeadDim<8>>>(g, "attended");
  auto heads_back = permute<Batch, Seq, Heads, HeadDim>(attended);
  // expected-error: view: [Batch=dyn, Seq=4, Heads=2, HeadDim=8] -> [Batch=dyn, Seq=4, Model=16] merges `Heads` and `HeadDim`, which a view never does by name; fix: merge<Heads, HeadDim, Model>(x)
  auto context = view<Batch<dyn>, Seq<4>, Model<16>>(heads_back);
  output(context, "context");
}
