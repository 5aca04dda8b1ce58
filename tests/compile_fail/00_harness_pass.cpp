// Harness self-test, positive twin: the declaration matches the value's axes.
#include <qkv/qkv.hpp>

QKV_AXIS(Seq);
QKV_AXIS(Model);

int main() {
  qkv::Graph g;
  auto x = qkv::input<qkv::Tensor<qkv::f32, Seq<4>, Model<8>>>(g, "x");
  qkv::Tensor<qkv::f32, Seq<4>, Model<8>> y = x;
  (void)y;
}
