// append / pad (PyTorch's add_bias_kv and add_zero_attn) through the interpreter, checked
// element by element against the definition.
#include <gtest/gtest.h>

#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>

namespace qkv::nn {
namespace {

std::vector<float> iota(std::size_t n, float start) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

TEST(InterpreterAppend, AppendRepeatsTheRowOverTheAxesItLacks) {
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Key<dyn>, Model<2>>>(g, "x");
  auto row = param<Tensor<f32, Key<1>, Model<2>>>(g, "bias_k");
  auto y = append<Key>(x, row);
  EXPECT_EQ(y.node().axes[1].extent.str(), "Key?+1");
  output(y, "y");
  const auto xs = iota(2 * 3 * 2, 0.0f);
  const auto r =
      interpret(g, {{"x", NdArray::from_f32(xs, {2, 3, 2})}, {"bias_k", NdArray::from_f32({100, 200}, {1, 2})}});
  const NdArray& out = r.outputs.at("y");
  ASSERT_EQ(out.shape, (std::vector<std::int64_t>{2, 4, 2}));
  const auto v = out.to_f32();
  for (int b = 0; b < 2; ++b)
    for (int k = 0; k < 4; ++k)
      for (int m = 0; m < 2; ++m) {
        const float want = k < 3 ? xs[(b * 3 + k) * 2 + m] : (m == 0 ? 100.0f : 200.0f);
        EXPECT_EQ(v[(b * 4 + k) * 2 + m], want) << b << "," << k << "," << m;
      }
}

TEST(InterpreterAppend, PadAppendsConstantsAndKeepsMasksMasks) {
  Graph g;
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  auto padded = pad<Key, 2>(keep, 1.0);
  KeyPaddingMask<Batch<dyn>, Key<dyn>> still_a_mask = padded;
  output(still_a_mask, "m");
  NdArray m = NdArray::zeros(DType::boolean, {2, 3});
  m.as<bool>()[0] = true;
  const auto r = interpret(g, {{"keep", m}});
  const NdArray& out = r.outputs.at("m");
  ASSERT_EQ(out.shape, (std::vector<std::int64_t>{2, 5}));
  const auto v = out.to_f32();
  EXPECT_EQ(v, (std::vector<float>{1, 0, 0, 1, 1, 0, 0, 0, 1, 1}));
}

TEST(InterpreterAppend, ZeroAttentionKeyTakesWeightButAddsNothing) {
  // One query, one real key, plus a zero key: scores are (q.k/sqrt(d), 0); the zero value
  // contributes nothing, so out = softmax_0 * v.
  Graph g;
  auto q = input<Tensor<f32, Seq<1>, HeadDim<2>>>(g, "q");
  auto k = input<Tensor<f32, Key<1>, HeadDim<2>>>(g, "k");
  auto v = input<Tensor<f32, Key<1>, HeadDim<2>>>(g, "v");
  auto [out, w] = attention(q, pad<Key, 1>(k, 0.0), pad<Key, 1>(v, 0.0));
  output(out, "out");
  output(w, "w");
  const auto r = interpret(g, {{"q", NdArray::from_f32({1, 1}, {1, 2})},
                               {"k", NdArray::from_f32({1, 1}, {1, 2})},
                               {"v", NdArray::from_f32({3, 5}, {1, 2})}});
  const double s = 2.0 / std::sqrt(2.0), p0 = std::exp(s) / (std::exp(s) + 1.0);
  const auto wv = r.outputs.at("w").to_f32(), ov = r.outputs.at("out").to_f32();
  EXPECT_NEAR(wv[0], p0, 1e-6);
  EXPECT_NEAR(wv[1], 1.0 - p0, 1e-6);
  EXPECT_NEAR(ov[0], 3.0 * p0, 1e-5);
  EXPECT_NEAR(ov[1], 5.0 * p0, 1e-5);
}

}  // namespace
}  // namespace qkv::nn
