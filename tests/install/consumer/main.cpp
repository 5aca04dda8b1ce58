// A user's project, built against an installed qkv: a graph with the DSL, run on the interpreter
// (qkv::runtime) and compiled by the CPU backend (qkv::codegen), the README's link line.
#include <cmath>
#include <iostream>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/rng.hpp>

QKV_AXIS(Seq);
QKV_AXIS(Model);

int main() {
  qkv::Graph g;
  auto x = qkv::input<qkv::Tensor<qkv::f32, Seq<>, Model<8>>>(g, "x");
  qkv::output(qkv::gelu_tanh(qkv::relu(x)) * 2.0, "y");
  std::cout << g.table() << "dropout draw: " << qkv::dropout_uniform(1, 0, 0, 0, 0) << "\n";
  std::vector<float> v(3 * 8);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.25f * static_cast<float>(i) - 2.0f;
  const qkv::Feeds feeds{{"x", qkv::NdArray::from_f32(v, {3, 8})}};
  const auto want = qkv::interpret(g, feeds).outputs.at("y").to_f32();
  const auto got = qkv::codegen::cpu::run(g, feeds).outputs.at("y").to_f32();
  double err = 0;
  for (std::size_t i = 0; i < want.size(); ++i) err = std::max(err, std::abs(double(got[i]) - want[i]));
  std::cout << "cpu vs interpreter: " << err << "\n";
  return g.size() == 4 && err < 1e-5 ? 0 : 1;
}
