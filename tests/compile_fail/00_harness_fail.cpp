// Harness self-test: a deliberately wrong program whose diagnostic the harness must find.
// A mistyped declaration: the value is [Seq, Model] but the declared type says [Model, Seq].
#include <qkv/qkv.hpp>

QKV_AXIS(Seq);
QKV_AXIS(Model);

int main() {
  qkv::Graph g;
  auto x = qkv::input<qkv::Tensor<qkv::f32, Seq<4>, Model<8>>>(g, "x");
  // expected-error: convert: axis 0 of [Seq=4, Model=8] is `Seq` but the declared type [Model=8, Seq=4] wants `Model` there; fix: permute<Model, Seq>(x)
  qkv::Tensor<qkv::f32, Model<8>, Seq<4>> y = x;
  (void)y;
}
