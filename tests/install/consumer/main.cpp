// A user's project, built against an installed qkv.
#include <iostream>

#include <qkv/qkv.hpp>
#include <qkv/runtime/rng.hpp>

QKV_AXIS(Seq);
QKV_AXIS(Model);

int main() {
  qkv::Graph g;
  auto x = qkv::input<qkv::Tensor<qkv::f32, Seq<>, Model<8>>>(g, "x");
  qkv::output(qkv::relu(x), "y");
  std::cout << g.table() << "dropout draw: " << qkv::dropout_uniform(1, 0, 0, 0, 0) << "\n";
  return g.size() == 2 ? 0 : 1;
}
