// Issue 12, item 8 - catalogue 1 with a dynamic batch viewed as a static one: the message names
// the axis that differs (it used to say "`Batch` is not `Batch`", as if the dyn and static
// batch sizes were the mistake).
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<4>, Model<16>>>(g, "x");
  // expected-error: view: [Batch=dyn, Seq=4, Model=16] -> [Batch=2, Heads=2, Seq=4, HeadDim=8] would move data between differently named axes (axis 1 is `Seq` in x but `Heads` in the view); fix: permute<Batch, Heads, Seq, HeadDim>(split<Model, Heads<2>, HeadDim<8>>(x))
  auto heads = view<Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>(x);
  output(heads, "heads");
}
