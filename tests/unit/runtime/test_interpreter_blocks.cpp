// The reference interpreter on whole attention blocks against plain-loop references, dropout,
// and mean_over_axis (split from test_interpreter.cpp).
#include "interpreter_test_helpers.hpp"

namespace qkv {
namespace {

using namespace qkv::testing_interp;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// --- attention against a plain reference ----------------------------------------------------------

/// x [N, in] · W[out, in]ᵀ + b, in double.
std::vector<double> ref_linear(const std::vector<double>& x, int n, int in, const std::vector<float>& w,
                               const std::vector<float>& b, int out) {
  std::vector<double> y(static_cast<std::size_t>(n * out));
  for (int t = 0; t < n; ++t)
    for (int o = 0; o < out; ++o) {
      double acc = b.empty() ? 0.0 : b[o];
      for (int i = 0; i < in; ++i) acc += x[t * in + i] * w[o * in + i];
      y[t * out + o] = acc;
    }
  return y;
}

struct HeadRef {
  std::vector<double> out;      // [B, S, D]
  std::vector<double> weights;  // [B, S, S]
};

/// One head of self-attention with a key-padding mask: keys j >= lengths[b] are invisible.
HeadRef ref_head(const std::vector<double>& x, int B, int S, int E, int D, const std::vector<float>& wq,
                 const std::vector<float>& bq, const std::vector<float>& wk, const std::vector<float>& bk,
                 const std::vector<float>& wv, const std::vector<float>& bv, const std::vector<int>& lengths) {
  const auto Q = ref_linear(x, B * S, E, wq, bq, D), K = ref_linear(x, B * S, E, wk, bk, D),
             V = ref_linear(x, B * S, E, wv, bv, D);
  HeadRef r{std::vector<double>(static_cast<std::size_t>(B * S * D)),
            std::vector<double>(static_cast<std::size_t>(B * S * S))};
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < S; ++i) {
      std::vector<double> score(static_cast<std::size_t>(S));
      double mx = -1e300;
      for (int j = 0; j < lengths[b]; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += Q[(b * S + i) * D + d] * K[(b * S + j) * D + d];
        score[j] = dot / std::sqrt(double(D));
        mx = std::max(mx, score[j]);
      }
      double z = 0;
      for (int j = 0; j < lengths[b]; ++j) z += std::exp(score[j] - mx);
      for (int j = 0; j < S; ++j) r.weights[(b * S + i) * S + j] = j < lengths[b] ? std::exp(score[j] - mx) / z : 0.0;
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (int j = 0; j < S; ++j) acc += r.weights[(b * S + i) * S + j] * V[(b * S + j) * D + d];
        r.out[(b * S + i) * D + d] = acc;
      }
    }
  return r;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

/// Rows [first, first + n) of a row-major [rows, cols] matrix (or of a vector when cols == 1).
std::vector<float> rows(const std::vector<float>& m, int first, int n, int cols) {
  return {m.begin() + first * cols, m.begin() + (first + n) * cols};
}

constexpr int kB = 2, kS = 4, kE = 16;
const std::vector<int> kLengths = {3, 4};
const std::vector<int> kPadding = {1, 1, 1, 0, 1, 1, 1, 1};  // keep-mask [Batch, Key]

struct SelfAttentionRun {
  std::vector<float> out, weights;
};

SelfAttentionRun run_self_attention(const Feeds& feeds) {
  Graph g;
  auto x = input<Tensor<f32, Batch<kB>, Seq<kS>, Model<kE>>>(g, "x");
  auto mask = input<KeyPaddingMask<Batch<kB>, Key<kS>>>(g, "key_padding_mask");
  auto sa = nn::SelfAttention<16, 16, 16>::make(g);
  auto [out, weights] = sa(x, mask);
  output(out, "out");
  output(weights, "weights");
  const auto r = interpret(g, feeds);
  EXPECT_EQ(r.outputs.at("out").shape, (std::vector<std::int64_t>{kB, kS, kE}));
  EXPECT_EQ(r.outputs.at("weights").shape, (std::vector<std::int64_t>{kB, kS, kS}));
  return {r.outputs.at("out").to_f32(), r.outputs.at("weights").to_f32()};
}

Feeds self_attention_feeds(unsigned seed) {
  Feeds f{{"x", random_array({kB, kS, kE}, seed)}, {"key_padding_mask", bool_array(kPadding, {kB, kS})}};
  unsigned s = seed;
  for (const char* p : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
    f[std::string(p) + ".weight"] = random_array({kE, kE}, ++s, -0.5f, 0.5f);
    f[std::string(p) + ".bias"] = random_array({kE}, ++s, -0.5f, 0.5f);
  }
  return f;
}

TEST(Attention, SelfAttentionMatchesAPlainReference) {
  const Feeds f = self_attention_feeds(100);
  const auto r = run_self_attention(f);
  auto w = [&](const std::string& name) { return f.at(name).to_f32(); };
  const HeadRef ref = ref_head(to_double(w("x")), kB, kS, kE, kE, w("q_proj.weight"), w("q_proj.bias"),
                               w("k_proj.weight"), w("k_proj.bias"), w("v_proj.weight"), w("v_proj.bias"), kLengths);
  const auto out = ref_linear(ref.out, kB * kS, kE, w("out_proj.weight"), w("out_proj.bias"), kE);
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(r.out[i], out[i], 1e-5) << i;
  for (std::size_t i = 0; i < ref.weights.size(); ++i) EXPECT_NEAR(r.weights[i], ref.weights[i], 1e-5) << i;
  for (int b = 0; b < kB; ++b)
    for (int i = 0; i < kS; ++i) {
      double sum = 0;
      for (int j = 0; j < kS; ++j) {
        const float p = r.weights[(b * kS + i) * kS + j];
        EXPECT_GE(p, 0.0f);
        sum += p;
        if (j >= kLengths[b]) {
          EXPECT_EQ(p, 0.0f) << "padded key " << j << " of batch " << b;
        }
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
}

TEST(Attention, ZeroQueryAndKeyWeightsGiveUniformWeightsOverVisibleKeys) {
  Feeds f = self_attention_feeds(200);
  for (const char* name : {"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias"})
    f[name] = NdArray::zeros(DType::f32, f[name].shape);
  const auto r = run_self_attention(f);
  for (int b = 0; b < kB; ++b)
    for (int i = 0; i < kS; ++i)
      for (int j = 0; j < kS; ++j)
        EXPECT_NEAR(r.weights[(b * kS + i) * kS + j], j < kLengths[b] ? 1.0 / kLengths[b] : 0.0, 1e-7);
}

TEST(Attention, MultiHeadAttentionEqualsHeadsAsModulesAndTheReference) {
  constexpr int H = 2, D = kE / H;
  const NdArray x = random_array({kB, kS, kE}, 300), mask = bool_array(kPadding, {kB, kS});
  const NdArray in_w = random_array({3 * kE, kE}, 301, -0.5f, 0.5f), in_b = random_array({3 * kE}, 302, -0.5f, 0.5f);
  const NdArray out_w = random_array({kE, kE}, 303, -0.5f, 0.5f), out_b = random_array({kE}, 304, -0.5f, 0.5f);

  Graph mha_graph;
  {
    auto xi = input<Tensor<f32, Batch<kB>, Seq<kS>, Model<kE>>>(mha_graph, "x");
    auto m = input<KeyPaddingMask<Batch<kB>, Key<kS>>>(mha_graph, "key_padding_mask");
    auto [out, weights] = nn::MultiHeadAttention<kE, H>::make(mha_graph)(xi, m);
    output(out, "out");
    output(weights, "weights");
  }
  const auto mha = interpret(mha_graph, {{"x", x},
                                         {"key_padding_mask", mask},
                                         {"in_proj_weight", in_w},
                                         {"in_proj_bias", in_b},
                                         {"out_proj.weight", out_w},
                                         {"out_proj.bias", out_b}});

  Graph heads_graph;
  {
    auto xi = input<Tensor<f32, Batch<kB>, Seq<kS>, Model<kE>>>(heads_graph, "x");
    auto m = input<KeyPaddingMask<Batch<kB>, Key<kS>>>(heads_graph, "key_padding_mask");
    output(nn::HeadsAsModules<kE, H>::make(heads_graph)(xi, m), "out");
  }
  const auto wv = in_w.to_f32(), bv = in_b.to_f32();
  Feeds heads_feeds{{"x", x}, {"key_padding_mask", mask}, {"out_proj.weight", out_w}, {"out_proj.bias", out_b}};
  for (int h = 0; h < H; ++h) {
    const std::string p = "heads." + std::to_string(h) + ".";
    int part = 0;
    for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {  // rows of in_proj: q, then k, then v
      const int first = part++ * kE + h * D;
      heads_feeds[p + proj + ".weight"] = NdArray::from_f32(rows(wv, first, D, kE), {D, kE});
      heads_feeds[p + proj + ".bias"] = NdArray::from_f32(rows(bv, first, D, 1), {D});
    }
  }
  const auto heads = interpret(heads_graph, heads_feeds);

  const auto a = mha.outputs.at("out").to_f32(), b = heads.outputs.at("out").to_f32();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << i;

  // The reference: heads side by side, then the out-projection; weights averaged over heads.
  const auto xd = to_double(x.to_f32());
  std::vector<double> concat(static_cast<std::size_t>(kB * kS * kE)),
      mean_weights(static_cast<std::size_t>(kB * kS * kS));
  const auto mw = mha.outputs.at("weights").to_f32();
  ASSERT_EQ(mha.outputs.at("weights").shape, (std::vector<std::int64_t>{kB, H, kS, kS}));
  for (int h = 0; h < H; ++h) {
    const HeadRef r =
        ref_head(xd, kB, kS, kE, D, rows(wv, h * D, D, kE), rows(bv, h * D, D, 1), rows(wv, kE + h * D, D, kE),
                 rows(bv, kE + h * D, D, 1), rows(wv, 2 * kE + h * D, D, kE), rows(bv, 2 * kE + h * D, D, 1), kLengths);
    for (int t = 0; t < kB * kS; ++t)
      for (int d = 0; d < D; ++d) concat[t * kE + h * D + d] = r.out[t * D + d];
    for (int b2 = 0; b2 < kB; ++b2)
      for (int ij = 0; ij < kS * kS; ++ij) {
        EXPECT_NEAR(mw[(b2 * H + h) * kS * kS + ij], r.weights[b2 * kS * kS + ij], 1e-5);
        mean_weights[b2 * kS * kS + ij] += r.weights[b2 * kS * kS + ij] / H;
      }
  }
  const auto want = ref_linear(concat, kB * kS, kE, out_w.to_f32(), out_b.to_f32(), kE);
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(a[i], want[i], 1e-5) << i;

  const NdArray avg = mean_over_axis(mha.outputs.at("weights"), 1);
  ASSERT_EQ(avg.shape, (std::vector<std::int64_t>{kB, kS, kS}));
  const auto av = avg.to_f32();
  for (std::size_t i = 0; i < av.size(); ++i) EXPECT_NEAR(av[i], mean_weights[i], 1e-5);
}

// --- dropout ---------------------------------------------------------------------------------------

template <std::uint64_t Seed>
NdArray run_dropout(const NdArray& x, double p) {
  Graph g;
  auto xi = input<Tensor<f32, Batch<2>, Heads<3>, Seq<128>, Key<128>>>(g, "x");
  output(dropout(xi, p, Seed), "y");
  return interpret(g, {{"x", x}}).outputs.at("y");
}

TEST(Dropout, KeepRateScaleAndMaskFollowTheGenerator) {
  const double p = 0.25;
  const NdArray ones = NdArray::from_f32(std::vector<float>(2 * 3 * 128 * 128, 1.0f), {2, 3, 128, 128});
  const auto y = run_dropout<1234>(ones, p).to_f32();
  long kept = 0;
  bool mask_matches = true;
  for (std::uint32_t b = 0; b < 2; ++b)
    for (std::uint32_t h = 0; h < 3; ++h)
      for (std::uint32_t r = 0; r < 128; ++r)
        for (std::uint32_t c = 0; c < 128; ++c) {
          const float v = y[((b * 3 + h) * 128 + r) * 128 + c];
          const bool keep = dropout_keep(p, 1234, b, h, r, c);
          mask_matches = mask_matches && (v != 0.0f) == keep;
          if (v != 0.0f) {
            ++kept;
            EXPECT_FLOAT_EQ(v, static_cast<float>(1.0 / (1.0 - p)));
          }
        }
  EXPECT_TRUE(mask_matches);
  const double n = static_cast<double>(y.size()), rate = static_cast<double>(kept) / n;
  EXPECT_NEAR(rate, 1.0 - p, 6 * std::sqrt(p * (1 - p) / n));
}

TEST(Dropout, KeptValuesAreRescaledAndSeedsAreReproducible) {
  const double p = 0.5;
  const NdArray x = random_array({2, 3, 128, 128}, 400);
  const auto xv = x.to_f32();
  const auto a = run_dropout<7>(x, p).to_f32(), again = run_dropout<7>(x, p).to_f32(),
             other = run_dropout<8>(x, p).to_f32();
  EXPECT_EQ(a, again);
  long differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != 0.0f) {
      EXPECT_FLOAT_EQ(a[i], static_cast<float>(xv[i] / (1 - p)));
    }
    differ += (a[i] != 0.0f) != (other[i] != 0.0f);
  }
  // Two independent masks with keep-rate 1/2 disagree on half the entries.
  const double n = static_cast<double>(a.size());
  EXPECT_NEAR(differ / n, 0.5, 6 * 0.5 / std::sqrt(n));
  EXPECT_EQ(run_dropout<7>(x, 0.0), x);  // p == 0: the identity
}

/// The kept entries of a dropout node over a tensor with the given axes (all ones in).
std::vector<int> dropout_kept(const std::vector<std::int64_t>& shape, double p, std::uint64_t seed) {
  Graph g;
  std::vector<Axis> axes;
  for (std::size_t k = 0; k < shape.size(); ++k) axes.push_back(ax("A" + std::to_string(k), shape[k]));
  const int x = leaf(g, "x", axes);
  Node d;
  d.op = Op::dropout;
  d.inputs = {x};
  d.axes = axes;
  d.scalar = p;
  d.seed = seed;
  const int id = g.add(d);
  std::vector<int> kept;
  for (float v : value_of(g, {{"x", NdArray::from_f32(std::vector<float>(count(shape), 1.0f), shape)}}, id))
    kept.push_back(v != 0.0f);
  return kept;
}

TEST(Dropout, IndexConventionForEveryRank) {
  const double p = 0.5;
  const std::uint64_t seed = 99;
  {  // rank 2: [row, col]
    const auto k = dropout_kept({5, 7}, p, seed);
    for (std::uint32_t r = 0; r < 5; ++r)
      for (std::uint32_t c = 0; c < 7; ++c) EXPECT_EQ(k[r * 7 + c], dropout_keep(p, seed, 0, 0, r, c));
  }
  {  // rank 3: [batch, row, col], head 0
    const auto k = dropout_kept({2, 3, 4}, p, seed);
    for (std::uint32_t b = 0; b < 2; ++b)
      for (std::uint32_t r = 0; r < 3; ++r)
        for (std::uint32_t c = 0; c < 4; ++c) EXPECT_EQ(k[(b * 3 + r) * 4 + c], dropout_keep(p, seed, b, 0, r, c));
  }
  {  // rank 5: [batch, g, h, row, col], head = g * 3 + h
    const auto k = dropout_kept({2, 2, 3, 4, 5}, p, seed);
    std::size_t i = 0;
    for (std::uint32_t b = 0; b < 2; ++b)
      for (std::uint32_t gg = 0; gg < 2; ++gg)
        for (std::uint32_t h = 0; h < 3; ++h)
          for (std::uint32_t r = 0; r < 4; ++r)
            for (std::uint32_t c = 0; c < 5; ++c) EXPECT_EQ(k[i++], dropout_keep(p, seed, b, gg * 3 + h, r, c));
  }
  {  // rank 1: [col]
    const auto k = dropout_kept({9}, p, seed);
    for (std::uint32_t c = 0; c < 9; ++c) EXPECT_EQ(k[c], dropout_keep(p, seed, 0, 0, 0, c));
  }
}

// --- mean_over_axis -----------------------------------------------------------------------------

TEST(MeanOverAxis, AveragesOneDimension) {
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[i] = static_cast<float>(i);
  const NdArray a = NdArray::from_f32(v, {2, 3, 4});
  const NdArray m1 = mean_over_axis(a, 1);
  ASSERT_EQ(m1.shape, (std::vector<std::int64_t>{2, 4}));
  const auto m1v = m1.to_f32();
  for (int b = 0; b < 2; ++b)
    for (int k = 0; k < 4; ++k)
      EXPECT_FLOAT_EQ(m1v[b * 4 + k], (v[b * 12 + k] + v[b * 12 + 4 + k] + v[b * 12 + 8 + k]) / 3.0f);
  EXPECT_EQ(mean_over_axis(a, 0).to_f32(), (std::vector<float>{6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}));
  EXPECT_EQ(mean_over_axis(a, 2).to_f32(), (std::vector<float>{1.5f, 5.5f, 9.5f, 13.5f, 17.5f, 21.5f}));
  EXPECT_THROW((void)mean_over_axis(a, 3), std::invalid_argument);
}

}  // namespace
}  // namespace qkv
