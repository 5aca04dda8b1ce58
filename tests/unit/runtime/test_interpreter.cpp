// The reference interpreter: each op against a hand computation written here with plain loops,
// the binding of feeds to extents (and its error messages), attention built with the DSL against
// a straightforward reference, and dropout's mask against the generator evaluated directly.
#include "interpreter_test_helpers.hpp"

namespace qkv {
namespace {

using namespace qkv::testing_interp;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// --- contract, linear ---------------------------------------------------------------------------

TEST(Interpreter, ContractMatchesBatchAxesByName) {
  // q [B, H, S, D] · k [H, B, K, D] over D: the batch axes come in another order on the rhs.
  const int B = 2, H = 3, S = 4, K = 6, D = 5;
  Graph g;
  const int q = leaf(g, "q", {ax("B", B), ax("H", H), ax("S", S), ax("D", D)});
  const int k = leaf(g, "k", {ax("H", H), ax("B", B), ax("K", K), ax("D", D)});
  const int s = op(g, Op::contract, {q, k}, {ax("B", B), ax("H", H), ax("S", S), ax("K", K)}, {"D"});
  g.mark_output(s, "s");
  const NdArray qa = random_array({B, H, S, D}, 1), ka = random_array({H, B, K, D}, 2);
  const auto out = interpret(g, {{"q", qa}, {"k", ka}}).outputs.at("s");
  ASSERT_EQ(out.shape, (std::vector<std::int64_t>{B, H, S, K}));
  const auto qv = qa.to_f32(), kv = ka.to_f32(), ov = out.to_f32();
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < S; ++i)
        for (int j = 0; j < K; ++j) {
          double want = 0;
          for (int d = 0; d < D; ++d)
            want += double(qv[((b * H + h) * S + i) * D + d]) * kv[((h * B + b) * K + j) * D + d];
          EXPECT_NEAR(ov[((b * H + h) * S + i) * K + j], want, 1e-5);
        }
}

TEST(Interpreter, ContractOverTwoAxes) {
  // a [I, J, K] · b [K, J] over {J, K} -> [I]
  const int I = 3, J = 4, K = 5;
  Graph g;
  const int a = leaf(g, "a", {ax("I", I), ax("J", J), ax("K", K)});
  const int b = leaf(g, "b", {ax("K", K), ax("J", J)});
  const int c = op(g, Op::contract, {a, b}, {ax("I", I)}, {"J", "K"});
  const NdArray aa = random_array({I, J, K}, 3), ba = random_array({K, J}, 4);
  const auto av = aa.to_f32(), bv = ba.to_f32(), cv = value_of(g, {{"a", aa}, {"b", ba}}, c);
  for (int i = 0; i < I; ++i) {
    double want = 0;
    for (int j = 0; j < J; ++j)
      for (int k = 0; k < K; ++k) want += double(av[(i * J + j) * K + k]) * bv[k * J + j];
    EXPECT_NEAR(cv[i], want, 1e-5);
  }
}

TEST(Interpreter, LinearWithBiasProjectsTheNamedAxis) {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<3>, Model<4>>>(g, "x");
  auto fc = linear_params<Model<4>, Hidden<5>>(g, "fc");
  output(linear(x, fc), "y");
  const NdArray xa = random_array({2, 3, 4}, 5), wa = random_array({5, 4}, 6), ba = random_array({5}, 7);
  const auto r = interpret(g, {{"x", xa}, {"fc.weight", wa}, {"fc.bias", ba}});
  const NdArray& y = r.outputs.at("y");
  ASSERT_EQ(y.shape, (std::vector<std::int64_t>{2, 3, 5}));
  const auto xv = xa.to_f32(), wv = wa.to_f32(), bv = ba.to_f32(), yv = y.to_f32();
  for (int t = 0; t < 6; ++t)
    for (int o = 0; o < 5; ++o) {
      double want = bv[o];
      for (int i = 0; i < 4; ++i) want += double(xv[t * 4 + i]) * wv[o * 4 + i];
      EXPECT_NEAR(yv[t * 5 + o], want, 1e-5);
    }
}

TEST(Interpreter, LinearOnALeadingAxisWithoutBias) {
  // x [In=4, S=3]: the projected axis is not the last one; it is replaced in place.
  Graph g;
  const int x = leaf(g, "x", {ax("In", 4), ax("S", 3)});
  const int w = leaf(g, "w", {ax("out", 2), ax("in", 4)});
  const int y = op(g, Op::linear, {x, w}, {ax("Out", 2), ax("S", 3)}, {"In", "Out"});
  const NdArray xa = random_array({4, 3}, 8), wa = random_array({2, 4}, 9);
  const auto xv = xa.to_f32(), wv = wa.to_f32(), yv = value_of(g, {{"x", xa}, {"w", wa}}, y);
  for (int o = 0; o < 2; ++o)
    for (int s = 0; s < 3; ++s) {
      double want = 0;
      for (int i = 0; i < 4; ++i) want += double(xv[i * 3 + s]) * wv[o * 4 + i];
      EXPECT_NEAR(yv[o * 3 + s], want, 1e-5);
    }
}

// --- structure: permute, split/merge, chunk/concat ------------------------------------------------

TEST(Interpreter, PermuteReordersByName) {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<3>, Model<4>>>(g, "x");
  output(permute<Model, Batch, Seq>(x), "p");
  const NdArray xa = random_array({2, 3, 4}, 10);
  const auto p = interpret(g, {{"x", xa}}).outputs.at("p");
  ASSERT_EQ(p.shape, (std::vector<std::int64_t>{4, 2, 3}));
  const auto xv = xa.to_f32(), pv = p.to_f32();
  for (int b = 0; b < 2; ++b)
    for (int s = 0; s < 3; ++s)
      for (int m = 0; m < 4; ++m) EXPECT_EQ(pv[(m * 2 + b) * 3 + s], xv[(b * 3 + s) * 4 + m]);
}

TEST(Interpreter, SplitPermuteMergeRoundTrips) {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<3>, Model<8>>>(g, "x");
  auto heads = permute<Batch, Heads, Seq, HeadDim>(split<Model, Heads<2>, HeadDim<4>>(x));
  auto back = merge<Heads, HeadDim, Model>(permute<Batch, Seq, Heads, HeadDim>(heads));
  output(heads, "heads");
  output(back, "back");
  const NdArray xa = random_array({2, 3, 8}, 11);
  const auto r = interpret(g, {{"x", xa}});
  EXPECT_EQ(r.outputs.at("back"), xa);
  const auto xv = xa.to_f32(), hv = r.outputs.at("heads").to_f32();
  ASSERT_EQ(r.outputs.at("heads").shape, (std::vector<std::int64_t>{2, 2, 3, 4}));
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 3; ++s)
        for (int d = 0; d < 4; ++d) EXPECT_EQ(hv[((b * 2 + h) * 3 + s) * 4 + d], xv[(b * 3 + s) * 8 + h * 4 + d]);
}

TEST(Interpreter, ChunkSlicesAndConcatJoinsInInputOrder) {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<3>, Model<8>>>(g, "x");
  auto parts = chunk<Model, 2, Hidden>(x);
  output(parts[1], "second");
  output(concat<Hidden, Model>(parts), "same");
  output(concat<Hidden, Model>(std::array{parts[1], parts[0]}), "swapped");
  const NdArray xa = random_array({2, 3, 8}, 12);
  const auto r = interpret(g, {{"x", xa}});
  EXPECT_EQ(r.outputs.at("same"), xa);
  const auto xv = xa.to_f32(), sv = r.outputs.at("second").to_f32(), wv = r.outputs.at("swapped").to_f32();
  ASSERT_EQ(r.outputs.at("second").shape, (std::vector<std::int64_t>{2, 3, 4}));
  for (int t = 0; t < 6; ++t)
    for (int m = 0; m < 4; ++m) {
      EXPECT_EQ(sv[t * 4 + m], xv[t * 8 + 4 + m]);
      EXPECT_EQ(wv[t * 8 + m], xv[t * 8 + 4 + m]);
      EXPECT_EQ(wv[t * 8 + 4 + m], xv[t * 8 + m]);
    }
}

TEST(Interpreter, SliceOffsetIsInUnitsOfThePart) {
  // w [out=6, in=2]: part 2 of size 2 is rows [4, 6) (as a fused QKV weight is cut).
  Graph g;
  const int w = leaf(g, "w", {ax("out", 6), ax("in", 2)});
  Node s;
  s.op = Op::slice;
  s.inputs = {w};
  s.axes = {ax("out", 2), ax("in", 2)};
  s.attr_axes = {"out", "out"};
  s.offset = 2;
  const int id = g.add(s);
  const NdArray wa = random_array({6, 2}, 13);
  const auto wv = wa.to_f32(), sv = value_of(g, {{"w", wa}}, id);
  ASSERT_EQ(sv.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(sv[i], wv[8 + i]);
}

// --- elementwise, scale, layer norm -------------------------------------------------------------

TEST(Interpreter, AddMulBiasAndKeepMaskBroadcastByName) {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<3>, Model<4>>>(g, "x");
  auto y = input<Tensor<f32, Model<4>, Batch<2>>>(g, "y");  // rhs axes in another order
  auto bias = input<Tensor<f32, Seq<3>>>(g, "bias");
  auto keep = input<KeepMask<Batch<2>, Model<4>>>(g, "keep");
  output(add(x, y), "add");
  output(mul(x, y), "mul");
  output(biased(x, bias), "biased");
  output(masked(x, keep), "masked");
  const NdArray xa = random_array({2, 3, 4}, 14), ya = random_array({4, 2}, 15);
  const NdArray ba = NdArray::from_f32({0.5f, -kInf, 2.0f}, {3});
  const std::vector<int> kv = {1, 0, 1, 1, 0, 0, 1, 0};
  const auto r = interpret(g, {{"x", xa}, {"y", ya}, {"bias", ba}, {"keep", bool_array(kv, {2, 4})}});
  const auto xv = xa.to_f32(), yv = ya.to_f32(), bv = ba.to_f32();
  const auto av = r.outputs.at("add").to_f32(), mv = r.outputs.at("mul").to_f32();
  const auto biv = r.outputs.at("biased").to_f32(), mkv = r.outputs.at("masked").to_f32();
  for (int b = 0; b < 2; ++b)
    for (int s = 0; s < 3; ++s)
      for (int m = 0; m < 4; ++m) {
        const int i = (b * 3 + s) * 4 + m;
        EXPECT_EQ(av[i], xv[i] + yv[m * 2 + b]);
        EXPECT_EQ(mv[i], xv[i] * yv[m * 2 + b]);
        EXPECT_EQ(biv[i], xv[i] + bv[s]);
        EXPECT_EQ(mkv[i], kv[b * 4 + m] ? xv[i] : -kInf);
      }
}

TEST(Interpreter, ScaleByFactor) {
  Graph g;
  auto x = input<Tensor<f32, Seq<3>>>(g, "x");
  output(scale(x, 0.25), "y");
  const auto y = interpret(g, {{"x", NdArray::from_f32({4, -8, 1}, {3})}}).outputs.at("y").to_f32();
  EXPECT_EQ(y, (std::vector<float>{1, -2, 0.25f}));
}

TEST(Interpreter, ScaleBySymbolUsesTheBoundSize) {
  Graph g;
  auto q = input<Tensor<f32, Batch<>, Seq<>, HeadDim<>>>(g, "q");
  auto k = input<Tensor<f32, Batch<>, Key<>, HeadDim<>>>(g, "k");
  auto s = scaled(contract<HeadDim>(q, k));
  ASSERT_EQ(s.node().dim, Extent::dynamic("HeadDim"));  // the contracted extent, recorded by scaled()
  output(s, "s");
  const NdArray qa = random_array({1, 2, 9}, 16), ka = random_array({1, 3, 9}, 17);
  const auto r = interpret(g, {{"q", qa}, {"k", ka}});
  EXPECT_EQ(r.bindings.at("HeadDim"), 9);
  const auto qv = qa.to_f32(), kv = ka.to_f32(), sv = r.outputs.at("s").to_f32();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      double dot = 0;
      for (int d = 0; d < 9; ++d) dot += double(qv[i * 9 + d]) * kv[j * 9 + d];
      EXPECT_NEAR(sv[i * 3 + j], dot / 3.0, 1e-6);
    }
}

TEST(Interpreter, ScaleBySymbolOfADerivedHeadDim) {
  // HeadDim = Model? / 2: the symbol behind the scale is not bound by any input under its own
  // name; the size is the extent of the contracted axis.
  Graph g;
  auto x = input<Tensor<f32, Batch<>, Seq<>, Model<>>>(g, "x");
  auto q = permute<Batch, Heads, Seq, HeadDim>(split<Model, Heads<2>, HeadDim<dyn>>(x));
  auto k = permute<Batch, Heads, Key, HeadDim>(split<Model, Heads<2>, HeadDim<dyn>>(rename<Seq, Key>(x)));
  output(scaled(contract<HeadDim>(q, k)), "s");
  const NdArray xa = random_array({1, 3, 8}, 18);  // Model = 8 -> HeadDim = 4 -> scale 1/2
  const auto r = interpret(g, {{"x", xa}});
  EXPECT_FALSE(r.bindings.contains("HeadDim"));
  const auto xv = xa.to_f32(), sv = r.outputs.at("s").to_f32();
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) {
        double dot = 0;
        for (int d = 0; d < 4; ++d) dot += double(xv[i * 8 + h * 4 + d]) * xv[j * 8 + h * 4 + d];
        EXPECT_NEAR(sv[(h * 3 + i) * 3 + j], dot / 2.0, 1e-6);
      }
}

TEST(Interpreter, LayerNormMatchesPyTorch) {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<3>, Model<5>>>(g, "x");
  output(layer_norm(x, layer_norm_params<Model<5>>(g, "ln", 1e-5)), "y");
  const NdArray xa = random_array({2, 3, 5}, 19, -3, 3), ga = random_array({5}, 20), ba = random_array({5}, 21);
  const auto y = interpret(g, {{"x", xa}, {"ln.weight", ga}, {"ln.bias", ba}}).outputs.at("y").to_f32();
  const auto xv = xa.to_f32(), gv = ga.to_f32(), bv = ba.to_f32();
  for (int t = 0; t < 6; ++t) {
    double mean = 0, var = 0;
    for (int m = 0; m < 5; ++m) mean += xv[t * 5 + m];
    mean /= 5;
    for (int m = 0; m < 5; ++m) var += (xv[t * 5 + m] - mean) * (xv[t * 5 + m] - mean);
    var /= 5;  // biased, as torch.nn.LayerNorm
    for (int m = 0; m < 5; ++m)
      EXPECT_NEAR(y[t * 5 + m], (xv[t * 5 + m] - mean) / std::sqrt(var + 1e-5) * gv[m] + bv[m], 1e-5);
  }
}

TEST(Interpreter, LayerNormOverAMiddleAxis) {
  Graph g;
  const int x = leaf(g, "x", {ax("A", 2), ax("N", 4), ax("C", 3)});
  const int gm = leaf(g, "g", {ax("N", 4)});
  const int bt = leaf(g, "b", {ax("N", 4)});
  Node ln;
  ln.op = Op::layer_norm;
  ln.inputs = {x, gm, bt};
  ln.axes = {ax("A", 2), ax("N", 4), ax("C", 3)};
  ln.attr_axes = {"N"};
  ln.scalar = 1e-3;
  const int id = g.add(ln);
  const NdArray xa = random_array({2, 4, 3}, 22), ga = random_array({4}, 23), ba = random_array({4}, 24);
  const auto xv = xa.to_f32(), gv = ga.to_f32(), bv = ba.to_f32();
  const auto y = value_of(g, {{"x", xa}, {"g", ga}, {"b", ba}}, id);
  for (int a = 0; a < 2; ++a)
    for (int c = 0; c < 3; ++c) {
      double mean = 0, var = 0;
      for (int n = 0; n < 4; ++n) mean += xv[(a * 4 + n) * 3 + c];
      mean /= 4;
      for (int n = 0; n < 4; ++n) var += std::pow(xv[(a * 4 + n) * 3 + c] - mean, 2);
      var /= 4;
      for (int n = 0; n < 4; ++n)
        EXPECT_NEAR(y[(a * 4 + n) * 3 + c], (xv[(a * 4 + n) * 3 + c] - mean) / std::sqrt(var + 1e-3) * gv[n] + bv[n],
                    1e-5);
    }
}

TEST(Interpreter, GeluIsTheExactErfFormAndReluClamps) {
  Graph g;
  auto x = input<Tensor<f32, Seq<9>>>(g, "x");
  output(gelu(x), "gelu");
  output(relu(x), "relu");
  const std::vector<float> xv = {-4, -2, -1, -0.5f, 0, 0.5f, 1, 2, 4};
  const auto r = interpret(g, {{"x", NdArray::from_f32(xv, {9})}});
  const auto gv = r.outputs.at("gelu").to_f32(), rv = r.outputs.at("relu").to_f32();
  for (std::size_t i = 0; i < xv.size(); ++i) {
    EXPECT_NEAR(gv[i], 0.5 * xv[i] * (1.0 + std::erf(xv[i] / std::sqrt(2.0))), 1e-6) << xv[i];
    EXPECT_EQ(rv[i], xv[i] > 0 ? xv[i] : 0.0f);
  }
}

// --- softmax and causal masks -------------------------------------------------------------------

TEST(Interpreter, SoftmaxIsStableForLargeInputs) {
  Graph g;
  const int x = leaf(g, "x", {ax("Row", 2), ax("Col", 3)});
  const int p = op(g, Op::softmax, {x}, {ax("Row", 2), ax("Col", 3)}, {"Col"});
  const auto v = value_of(g, {{"x", NdArray::from_f32({1000, -1000, 999, -1000, -1000, -999}, {2, 3})}}, p);
  for (float e : v) EXPECT_TRUE(std::isfinite(e));
  const double e1 = std::exp(-1.0);
  EXPECT_NEAR(v[0], 1 / (1 + e1), 1e-6);
  EXPECT_EQ(v[1], 0.0f);
  EXPECT_NEAR(v[2], e1 / (1 + e1), 1e-6);
  EXPECT_NEAR(v[3], e1 / (2 * e1 + 1), 1e-6);
  EXPECT_NEAR(v[4], e1 / (2 * e1 + 1), 1e-6);
  EXPECT_NEAR(v[5], 1 / (2 * e1 + 1), 1e-6);
}

TEST(Interpreter, SoftmaxRowsSumToOneOverTheNamedAxis) {
  // softmax over the first axis of [N=5, C=4]: the "rows" run down the columns.
  Graph g;
  const int x = leaf(g, "x", {ax("N", 5), ax("C", 4)});
  const int p = op(g, Op::softmax, {x}, {ax("N", 5), ax("C", 4)}, {"N"});
  const NdArray xa = random_array({5, 4}, 25, -5, 5);
  const auto xv = xa.to_f32(), v = value_of(g, {{"x", xa}}, p);
  for (int c = 0; c < 4; ++c) {
    double sum = 0, z = 0;
    for (int n = 0; n < 5; ++n) z += std::exp(double(xv[n * 4 + c]));
    for (int n = 0; n < 5; ++n) {
      sum += v[n * 4 + c];
      EXPECT_NEAR(v[n * 4 + c], std::exp(double(xv[n * 4 + c])) / z, 1e-6);
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

TEST(Interpreter, SoftmaxOfAFullyMaskedRowIsZeroNotNaN) {
  Graph g;
  auto s = input<Tensor<f32, Seq<2>, Key<3>>>(g, "s");
  auto keep = input<KeepMask<Seq<2>, Key<3>>>(g, "keep");
  output(softmax<Key>(masked(unscaled(s), keep)), "p");
  const auto p = interpret(g, {{"s", random_array({2, 3}, 26)}, {"keep", bool_array({1, 0, 1, 0, 0, 0}, {2, 3})}})
                     .outputs.at("p")
                     .to_f32();
  EXPECT_EQ(p[1], 0.0f);
  EXPECT_NEAR(p[0] + p[2], 1.0, 1e-6);
  for (int j = 3; j < 6; ++j) {
    EXPECT_FALSE(std::isnan(p[j]));
    EXPECT_EQ(p[j], 0.0f);
  }
}

/// The keep pattern of causal<Seq, Key> on zero scores of L queries and S keys.
template <class Align, int L, int S>
std::vector<int> causal_pattern(Align align, std::vector<float>* weights = nullptr) {
  Graph g;
  auto s = input<Tensor<f32, Seq<L>, Key<S>>>(g, "s");
  auto c = causal<Seq, Key>(s, align);
  output(c, "c");
  output(softmax<Key>(c), "p");
  const auto r = interpret(g, {{"s", NdArray::zeros(DType::f32, {L, S})}});
  std::vector<int> kept;
  for (float v : r.outputs.at("c").to_f32()) {
    EXPECT_TRUE(v == 0.0f || v == -kInf);
    kept.push_back(v == 0.0f);
  }
  if (weights) *weights = r.outputs.at("p").to_f32();
  return kept;
}

TEST(Interpreter, CausalTopLeftAndBottomRightOnMoreKeysThanQueries) {
  // L = 3 queries, S = 5 keys.
  const std::vector<int> top = causal_pattern<top_left_t, 3, 5>(top_left);
  EXPECT_EQ(top, (std::vector<int>{1, 0, 0, 0, 0,  //
                                   1, 1, 0, 0, 0,  //
                                   1, 1, 1, 0, 0}));
  std::vector<float> p;
  const std::vector<int> bottom = causal_pattern<bottom_right_t, 3, 5>(bottom_right, &p);
  EXPECT_EQ(bottom, (std::vector<int>{1, 1, 1, 0, 0,  //
                                      1, 1, 1, 1, 0,  //
                                      1, 1, 1, 1, 1}));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j) EXPECT_NEAR(p[i * 5 + j], j <= i + 2 ? 1.0 / (i + 3) : 0.0, 1e-7);
}

TEST(Interpreter, CausalBottomRightWithMoreQueriesLeavesEmptyRowsAtZero) {
  // L = 5, S = 3: queries 0 and 1 see no key under bottom-right alignment.
  std::vector<float> p;
  const std::vector<int> kept = causal_pattern<bottom_right_t, 5, 3>(bottom_right, &p);
  EXPECT_EQ(kept, (std::vector<int>{0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 1, 1, 1}));
  for (int j = 0; j < 6; ++j) EXPECT_EQ(p[j], 0.0f);
  EXPECT_NEAR(p[6], 1.0, 1e-7);
}

// --- binding --------------------------------------------------------------------------------------

TEST(Bind, MissingFeed) {
  Graph g;
  output(relu(input<Tensor<f32, Batch<>, Model<4>>>(g, "x")), "y");
  EXPECT_THAT(shape_error_message(g, {}), HasSubstr("missing input 'x'"));
}

TEST(Bind, WrongStaticSize) {
  Graph g;
  output(relu(input<Tensor<f32, Batch<>, Model<16>>>(g, "x")), "y");
  EXPECT_THAT(shape_error_message(g, {{"x", random_array({2, 15}, 27)}}),
              HasSubstr("input 'x': axis `Model` is 16 but the array has 15 there"));
}

TEST(Bind, WrongRank) {
  Graph g;
  output(relu(input<Tensor<f32, Batch<>, Model<4>>>(g, "x")), "y");
  EXPECT_THAT(shape_error_message(g, {{"x", random_array({2, 4, 1}, 28)}}),
              HasSubstr("input 'x': expected 2 axes [Batch?, Model=4] but the array has shape (2, 4, 1)"));
}

TEST(Bind, InconsistentDynamicSymbolNamesBothTensors) {
  Graph g;
  const int x = leaf(g, "x", {dyn_ax("Batch", "Batch"), dyn_ax("Seq", "Seq")});
  const int k = leaf(g, "k", {dyn_ax("Batch", "Batch"), dyn_ax("Key", "Seq")});  // keys: Seq renamed
  g.mark_output(x, "x");
  g.mark_output(k, "k");
  EXPECT_EQ(shape_error_message(g, {{"x", random_array({2, 4}, 29)}, {"k", random_array({2, 6}, 30)}}),
            "input 'k': axis `Key` (extent Seq?) is 6 but 'x' bound Seq = 4");
  // Consistent sizes bind.
  const Bindings b = bind_extents(g, {{"x", random_array({2, 4}, 29)}, {"k", random_array({2, 4}, 30)}});
  EXPECT_EQ(b, (Bindings{{"Batch", 2}, {"Seq", 4}}));
}

TEST(Bind, TwoInputsDeclaringOneDynamicAxisAreToldHowToSeparateThem) {
  // An encoder-decoder whose source and target are both Seq<dyn> (issue 31): one size for both.
  Graph g;
  const int src = leaf(g, "src", {dyn_ax("Batch", "Batch"), dyn_ax("Seq", "Seq")});
  const int tgt = leaf(g, "tgt", {dyn_ax("Batch", "Batch"), dyn_ax("Seq", "Seq")});
  g.mark_output(src, "src");
  g.mark_output(tgt, "tgt");
  EXPECT_EQ(shape_error_message(g, {{"src", random_array({2, 9}, 29)}, {"tgt", random_array({2, 6}, 30)}}),
            "input 'tgt': axis `Seq` (extent Seq?) is 6 but 'src' bound Seq = 9; both declare `Seq` with one run-time "
            "size: if they are different sequences (an encoder's source and a decoder's target), give one its own "
            "axis (e.g. QKV_AXIS(Mem) and Mem<dyn>), as the memory of CrossAttention has");
}

TEST(Bind, DerivedExtentIsCheckedAfterBinding) {
  Graph g;
  leaf(g, "x", {dyn_ax("Seq", "Seq")});
  leaf(g, "h", {Axis{"Half", Extent::dynamic("Seq").divided(2)}});
  EXPECT_NO_THROW((void)bind_extents(g, {{"x", random_array({8}, 31)}, {"h", random_array({4}, 32)}}));
  EXPECT_EQ(shape_error_message(g, {{"x", random_array({8}, 31)}, {"h", random_array({3}, 32)}}),
            "input 'h': axis `Half` (extent Seq?/2) is 3 but 'x' bound Seq = 8, which makes it 4");
  EXPECT_THAT(shape_error_message(g, {{"x", random_array({7}, 31)}, {"h", random_array({3}, 32)}}),
              HasSubstr("'x' bound Seq = 7, which is not divisible by 2"));

  Graph only_derived;
  leaf(only_derived, "h", {Axis{"Half", Extent::dynamic("Seq").divided(2)}});
  EXPECT_THAT(shape_error_message(only_derived, {{"h", random_array({3}, 32)}}),
              HasSubstr("no input binds Seq by itself"));
}

TEST(Bind, DeferredGraphChecksRunUnderTheBindings) {
  Graph g;
  auto x = input<Tensor<f32, Batch<>, Seq<>, Model<>>>(g, "x");
  output(split<Model, Heads<4>, HeadDim<dyn>>(x), "h");
  EXPECT_THAT(shape_error_message(g, {{"x", random_array({1, 2, 66}, 33)}}),
              HasSubstr("split: `Model` (66) is not a multiple of Heads (4) x HeadDim (dyn) = 4"));
  const auto r = interpret(g, {{"x", random_array({1, 2, 64}, 33)}});
  EXPECT_EQ(r.outputs.at("h").shape, (std::vector<std::int64_t>{1, 2, 4, 16}));
}

TEST(Bind, MergeOfTwoDynamicAxesBindsTheNewSymbol) {
  Graph g;
  auto x = input<Tensor<f32, Batch<>, Seq<>, Model<4>>>(g, "x");
  output(merge<Batch, Seq, Hidden>(x), "tokens");
  const NdArray xa = random_array({2, 3, 4}, 34);
  const auto r = interpret(g, {{"x", xa}});
  EXPECT_EQ(r.bindings.at("Hidden"), 6);
  EXPECT_EQ(r.outputs.at("tokens").shape, (std::vector<std::int64_t>{6, 4}));
  EXPECT_EQ(r.outputs.at("tokens").to_f32(), xa.to_f32());
}

TEST(Bind, FeedDtypes) {
  // (Rank-2 operands: masked() does not compile with a rank-1 mask, see the report.)
  Graph g;
  auto x = input<Tensor<f32, Batch<1>, Seq<3>>>(g, "x");
  auto keep = input<KeepMask<Batch<1>, Seq<3>>>(g, "keep");
  output(masked(x, keep), "y");
  output(keep, "keep");
  const NdArray mask = bool_array({1, 0, 1}, {1, 3});
  // f64 (and other numeric) feeds convert to f32.
  NdArray x64 = NdArray::zeros(DType::f64, {1, 3});
  const double xs[3] = {1.5, -2.0, 3.25};
  std::memcpy(x64.bytes.data(), xs, sizeof xs);
  const auto r = interpret(g, {{"x", x64}, {"keep", mask}});
  EXPECT_EQ(r.outputs.at("y").to_f32(), (std::vector<float>{1.5f, -kInf, 3.25f}));
  EXPECT_EQ(r.outputs.at("keep"), mask);  // boolean nodes come back as bool arrays
  // A mask must be fed bools; a float tensor must not be.
  EXPECT_THAT(
      shape_error_message(g, {{"x", x64}, {"keep", NdArray::from_f32({1, 0, 1}, {1, 3})}}),
      HasSubstr("input 'keep' is a boolean keep-mask (true = may attend) and must be fed a bool array, got f32"));
  EXPECT_THAT(shape_error_message(g, {{"x", mask}, {"keep", mask}}),
              HasSubstr("input 'x' is f32 but was fed a bool array"));
}

TEST(Interpreter, InconsistentGraphsAreInternalErrors) {
  const Feeds feeds{{"x", random_array({2, 3}, 35)}};
  {
    Graph g;
    const int x = leaf(g, "x", {ax("A", 2), ax("B", 3)});
    g.mark_output(op(g, static_cast<Op>(200), {x}, {ax("A", 2), ax("B", 3)}), "y");
    EXPECT_THAT(internal_error_message(g, feeds), StartsWith("qkv internal error:"));
  }
  {
    Graph g;
    const int x = leaf(g, "x", {ax("A", 2), ax("B", 3)});
    g.mark_output(op(g, Op::relu, {x, x}, {ax("A", 2), ax("B", 3)}), "y");
    EXPECT_THAT(internal_error_message(g, feeds), StartsWith("qkv internal error: %1 (relu): expects 1 inputs, has 2"));
  }
  {
    Graph g;
    const int x = leaf(g, "x", {ax("A", 2), ax("B", 3)});
    g.mark_output(op(g, Op::softmax, {x}, {ax("A", 2), ax("B", 3)}, {"Nope"}), "y");
    EXPECT_THAT(internal_error_message(g, feeds),
                StartsWith("qkv internal error: %1 (softmax): input [A=2, B=3] has no axis `Nope`"));
  }
  {
    Graph g;  // the IR declares a shape the value does not have
    const int x = leaf(g, "x", {ax("A", 2), ax("B", 3)});
    g.mark_output(op(g, Op::relu, {x}, {ax("A", 2), ax("B", 4)}), "y");
    EXPECT_THAT(internal_error_message(g, feeds), StartsWith("qkv internal error:"));
  }
}

}  // namespace
}  // namespace qkv
