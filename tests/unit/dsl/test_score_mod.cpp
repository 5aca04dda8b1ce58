// Score and mask mods (score_mod.hpp): every built-in and three hand-written mods, run through the
// reference interpreter, against the same attention written with a bias tensor [.., Seq, Key]
// materialised here from the formula (−inf where masked), or with plain loops (softcap). Odd
// L and S, L != S under both alignments, GQA scores, padding and empty rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

namespace qkv::nn {
namespace {

QKV_AXIS(RelPos);  // relative positions j - i' + S - 1 of a learned bias table

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr int B = 2, H = 3, D = 4;

NdArray random_array(std::vector<std::int64_t> shape, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return NdArray::from_f32(std::move(v), std::move(shape));
}

NdArray f32_array(std::vector<float> v, std::vector<std::int64_t> shape) {
  return NdArray::from_f32(std::move(v), std::move(shape));
}

NdArray i32_array(const std::vector<std::int32_t>& v, std::vector<std::int64_t> shape) {
  NdArray a = NdArray::zeros(DType::i32, std::move(shape));
  auto out = a.as<std::int32_t>();
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = v[i];
  return a;
}

/// bias(b, h, i, j) over [Batch, Heads, Seq, Key] as an array (−inf for a masked entry).
using BiasFn = std::function<double(int, int, int, int)>;
NdArray bias_array(int L, int S, const BiasFn& f) {
  std::vector<float> v;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < L; ++i)
        for (int j = 0; j < S; ++j) v.push_back(static_cast<float>(f(b, h, i, j)));
  return f32_array(std::move(v), {B, H, L, S});
}

template <int L, int S>
struct Attn {
  using Q = Tensor<f32, Batch<B>, Heads<H>, Seq<L>, HeadDim<D>>;
  using K = Tensor<f32, Batch<B>, Heads<H>, Key<S>, HeadDim<D>>;
  Feeds feeds{{"q", random_array({B, H, L, D}, 1, -2.0f, 2.0f)}, {"k", random_array({B, H, S, D}, 2, -2.0f, 2.0f)}};

  /// softmax<Key>(make(g, scaled(q k^T))) through the interpreter.
  template <class Make>
  std::vector<float> modded_weights(Make make) const {
    Graph g;
    auto q = input<Q>(g, "q");
    auto k = input<K>(g, "k");
    output(softmax<Key>(make(g, scaled(contract<HeadDim>(q, k)))), "p");
    return interpret(g, feeds).outputs.at("p").to_f32();
  }
  /// softmax<Key>(biased(scaled(q k^T), bias)) through the interpreter: the reference.
  std::vector<float> biased_weights(const BiasFn& f) const {
    Graph g;
    auto q = input<Q>(g, "q");
    auto k = input<K>(g, "k");
    auto bias = input<Tensor<f32, Batch<B>, Heads<H>, Seq<L>, Key<S>>>(g, "bias");
    output(softmax<Key>(biased(scaled(contract<HeadDim>(q, k)), bias)), "p");
    Feeds f2 = feeds;
    f2.insert_or_assign("bias", bias_array(L, S, f));
    return interpret(g, f2).outputs.at("p").to_f32();
  }
  /// The aligned query position i'.
  static int pos(int i, CausalAlign a) { return a == CausalAlign::bottom_right ? i + S - L : i; }
};

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << "entry " << i;
}

/// Rows of `w` [.., rows, S] that are all zero (a query that sees no key).
int zero_rows(const std::vector<float>& w, int S) {
  int n = 0;
  for (std::size_t r = 0; r < w.size() / static_cast<std::size_t>(S); ++r) {
    bool zero = true;
    for (int j = 0; j < S; ++j) zero = zero && w[r * static_cast<std::size_t>(S) + static_cast<std::size_t>(j)] == 0.0f;
    n += zero;
  }
  return n;
}

TEST(ScoreMod, CausalBothAlignmentsAndUnalignedSquare) {
  Attn<5, 7> a;
  auto top = a.modded_weights([](Graph&, auto s) { return modded(s, mods::causal(top_left)); });
  expect_near_all(top, a.biased_weights([](int, int, int i, int j) { return j <= i ? 0.0 : kNegInf; }));
  auto br = a.modded_weights([](Graph&, auto s) { return modded(s, mods::causal(bottom_right)); });
  expect_near_all(br, a.biased_weights([](int, int, int i, int j) { return j <= i + 2 ? 0.0 : kNegInf; }));
  Attn<5, 5> sq;
  auto un = sq.modded_weights([](Graph&, auto s) { return modded(s, mods::causal()); });
  expect_near_all(un, sq.biased_weights([](int, int, int i, int j) { return j <= i ? 0.0 : kNegInf; }));
}

TEST(ScoreMod, SlidingWindow) {
  Attn<5, 7> a;
  for (auto [left, right] : {std::pair{2, 1}, std::pair{-1, 0}, std::pair{1, -1}, std::pair{0, 0}}) {
    auto keep = [&](int ip, int j) { return (left < 0 || j >= ip - left) && (right < 0 || j <= ip + right); };
    auto br =
        a.modded_weights([&](Graph&, auto s) { return modded(s, mods::sliding_window(left, right, bottom_right)); });
    expect_near_all(br, a.biased_weights([&](int, int, int i, int j) { return keep(i + 2, j) ? 0.0 : kNegInf; }));
    auto tl = a.modded_weights([&](Graph&, auto s) { return modded(s, mods::sliding_window(left, right, top_left)); });
    expect_near_all(tl, a.biased_weights([&](int, int, int i, int j) { return keep(i, j) ? 0.0 : kNegInf; }));
  }
  // A window right of every key of the first rows (top-left, left = 0, right = 0 over L < S is
  // fine); a window that leaves rows empty: keys strictly ahead only, by 6 or more.
  auto far = a.modded_weights([](Graph&, auto s) {
    return modded(s, mask_mod([](auto, auto, auto q, auto k) { return k >= q + 6; }, top_left));
  });
  EXPECT_EQ(zero_rows(far, 7), B * H * 4);  // only query 0 sees key 6
}

TEST(ScoreMod, BlocksTakeModsAmongTheirMasks) {
  // MultiHeadAttention(x, mods...) applies each mod like a mask: the same weights as the same
  // window given as an explicit bias.
  constexpr int L = 6;
  auto weights = [&](auto... masks) {
    Graph g;
    auto x = input<Tensor<f32, Batch<B>, Seq<L>, Model<8>>>(g, "x");
    output(MultiHeadAttention<8, 2>::make(g)(x, masks...).second, "w");
    return g;
  };
  Graph with_mod = weights(mods::sliding_window(2, 0));
  Feeds feeds = random_feeds(with_mod, {}, 3);
  std::vector<float> bias;
  for (int i = 0; i < L; ++i)
    for (int j = 0; j < L; ++j) bias.push_back(j <= i && j >= i - 2 ? 0.0f : -INFINITY);
  Graph g2;
  {
    auto x = input<Tensor<f32, Batch<B>, Seq<L>, Model<8>>>(g2, "x");
    auto b = input<Tensor<f32, Seq<L>, Key<L>>>(g2, "bias");
    output(MultiHeadAttention<8, 2>::make(g2)(x, b).second, "w");
  }
  Feeds f2 = feeds;
  f2.insert_or_assign("bias", f32_array(bias, {L, L}));
  expect_near_all(interpret(with_mod, feeds).outputs.at("w").to_f32(), interpret(g2, f2).outputs.at("w").to_f32());
}

TEST(ScoreMod, Alibi) {
  Attn<5, 7> a;
  a.feeds.insert_or_assign("slopes", f32_array({0.5f, 0.25f, 0.125f}, {H}));
  auto w = a.modded_weights(
      [](Graph& g, auto s) { return modded(s, mods::alibi(input<Tensor<f32, Heads<H>>>(g, "slopes"), bottom_right)); });
  const double slope[] = {0.5, 0.25, 0.125};
  expect_near_all(w, a.biased_weights([&](int, int h, int i, int j) { return -slope[h] * std::abs(i + 2 - j); }));

  // Per-batch slopes [Batch, Heads], top-left.
  std::vector<float> sl;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) sl.push_back(0.1f * static_cast<float>(1 + b * H + h));
  a.feeds.insert_or_assign("slopes2", f32_array(sl, {B, H}));
  auto w2 = a.modded_weights([](Graph& g, auto s) {
    return modded(s, mods::alibi(input<Tensor<f32, Batch<B>, Heads<H>>>(g, "slopes2"), top_left));
  });
  expect_near_all(w2, a.biased_weights([&](int b, int h, int i, int j) {
    return -static_cast<double>(sl[static_cast<std::size_t>(b * H + h)]) * std::abs(i - j);
  }));
}

TEST(ScoreMod, SoftcapComesFirstWhereverWritten) {
  Attn<5, 7> a;
  a.feeds.insert_or_assign("slopes", f32_array({0.5f, 0.25f, 0.125f}, {H}));
  // softcap written after ALiBi still caps the raw scaled score, and ALiBi applies to the result.
  auto w = a.modded_weights([](Graph& g, auto s) {
    return modded(s, mods::alibi(input<Tensor<f32, Heads<H>>>(g, "slopes"), top_left), mods::softcap(0.3));
  });
  // Reference by plain loops: scores, softcap, alibi, softmax.
  const auto q = a.feeds.at("q").to_f32(), k = a.feeds.at("k").to_f32();
  const double slope[] = {0.5, 0.25, 0.125};
  std::vector<float> want;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < 5; ++i) {
        std::vector<double> row;
        for (int j = 0; j < 7; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d)
            dot += static_cast<double>(q[static_cast<std::size_t>(((b * H + h) * 5 + i) * D + d)]) *
                   k[static_cast<std::size_t>(((b * H + h) * 7 + j) * D + d)];
          const double s = dot / std::sqrt(double(D));
          row.push_back(0.3 * std::tanh(s / 0.3) - slope[h] * std::abs(i - j));
        }
        double m = row[0], sum = 0;
        for (double x : row) m = std::max(m, x);
        for (double& x : row) sum += (x = std::exp(x - m));
        for (double x : row) want.push_back(static_cast<float>(x / sum));
      }
  expect_near_all(w, want);
}

TEST(ScoreMod, DocumentMaskWithEmptyRows) {
  Attn<5, 7> a;
  // Batch 0: queries in docs 0 0 1 1 9, keys 0 0 0 1 1 1 2; query 4 (doc 9) sees no key.
  // Batch 1: every query and key in doc 3.
  const std::vector<std::int32_t> qd = {0, 0, 1, 1, 9, 3, 3, 3, 3, 3}, kd = {0, 0, 0, 1, 1, 1, 2, 3, 3, 3, 3, 3, 3, 3};
  a.feeds.insert_or_assign("q_doc", i32_array(qd, {B, 5}));
  a.feeds.insert_or_assign("kv_doc", i32_array(kd, {B, 7}));
  auto w = a.modded_weights([](Graph& g, auto s) {
    auto q_doc = input<Tensor<i32, Batch<B>, Seq<5>>>(g, "q_doc");
    auto kv_doc = input<Tensor<i32, Batch<B>, Key<7>>>(g, "kv_doc");
    return modded(s, mods::document_mask(q_doc, kv_doc));
  });
  expect_near_all(w, a.biased_weights([&](int b, int, int i, int j) {
    return qd[static_cast<std::size_t>(b * 5 + i)] == kd[static_cast<std::size_t>(b * 7 + j)] ? 0.0 : kNegInf;
  }));
  EXPECT_EQ(zero_rows(w, 7), H);  // batch 0, query 4, every head: zero weights, not NaN
}

TEST(ScoreMod, PrefixLm) {
  Attn<5, 7> a;
  auto w = a.modded_weights([](Graph&, auto s) { return modded(s, mods::prefix_lm(3, bottom_right)); });
  expect_near_all(w, a.biased_weights([](int, int, int i, int j) { return j < 3 || j <= i + 2 ? 0.0 : kNegInf; }));
  // Per-batch prefix lengths [Batch], top-left.
  a.feeds.insert_or_assign("prefix", i32_array({4, 0}, {B}));
  auto w2 = a.modded_weights(
      [](Graph& g, auto s) { return modded(s, mods::prefix_lm(input<Tensor<i32, Batch<B>>>(g, "prefix"), top_left)); });
  const int prefix[] = {4, 0};
  expect_near_all(w2,
                  a.biased_weights([&](int b, int, int i, int j) { return j < prefix[b] || j <= i ? 0.0 : kNegInf; }));
}

TEST(ScoreMod, RelativeBiasWithClamping) {
  Attn<5, 7> a;
  constexpr int R = 2 * 7 - 1;
  a.feeds.insert_or_assign("table", random_array({H, R}, 7));
  const auto table = a.feeds.at("table").to_f32();
  for (auto align : {CausalAlign::top_left, CausalAlign::bottom_right}) {
    auto w = a.modded_weights([&](Graph& g, auto s) {
      auto t = input<Tensor<f32, Heads<H>, RelPos<R>>>(g, "table");
      if (align == CausalAlign::top_left) return modded(s, mods::relative_bias(t, top_left));
      return modded(s, mods::relative_bias(t, bottom_right));
    });
    expect_near_all(w, a.biased_weights([&](int, int h, int i, int j) {
      return static_cast<double>(table[static_cast<std::size_t>(h * R + (j - Attn<5, 7>::pos(i, align) + 7 - 1))]);
    }));
  }
  // A table shorter than 2 S - 1: indices are clamped into range (the nearest end of the table).
  a.feeds.insert_or_assign("short", random_array({H, 3}, 8));
  const auto sh = a.feeds.at("short").to_f32();
  auto w = a.modded_weights([](Graph& g, auto s) {
    auto t = input<Tensor<f32, Heads<H>, RelPos<3>>>(g, "short");
    return modded(s, mods::relative_bias(t, top_left));
  });
  expect_near_all(w, a.biased_weights([&](int, int h, int i, int j) {
    return static_cast<double>(sh[static_cast<std::size_t>(h * 3 + std::clamp(j - i + 6, 0, 2))]);
  }));
}

// --- hand-written mods ---------------------------------------------------------------------------

TEST(ScoreMod, HandWrittenAlibiWindowAndDocuments) {  // the example of score_mod.hpp's header
  Attn<5, 7> a;
  a.feeds.insert_or_assign("slopes", f32_array({0.5f, 0.25f, 0.125f}, {H}));
  const std::vector<std::int32_t> qd = {0, 0, 1, 1, 1, 0, 1, 1, 1, 1}, kd = {0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1};
  a.feeds.insert_or_assign("q_doc", i32_array(qd, {B, 5}));
  a.feeds.insert_or_assign("kv_doc", i32_array(kd, {B, 7}));
  auto w = a.modded_weights([](Graph& g, auto scores) {
    auto slopes = input<Tensor<f32, Heads<H>>>(g, "slopes");
    auto q_doc = input<Tensor<i32, Batch<B>, Seq<5>>>(g, "q_doc");
    auto kv_doc = input<Tensor<i32, Batch<B>, Key<7>>>(g, "kv_doc");
    auto alibi =
        score_mod([&](auto s, auto, auto h, auto q, auto k) { return s - slopes[h] * abs(q - k); }, bottom_right);
    auto window = mask_mod([](auto, auto, auto q, auto k) { return abs(q - k) <= 2; }, bottom_right);
    auto docs = mask_mod([&](auto b, auto, auto q, auto k) { return q_doc[b][q] == kv_doc[b][k]; });
    return modded(scores, alibi, window && docs);
  });
  const double slope[] = {0.5, 0.25, 0.125};
  expect_near_all(w, a.biased_weights([&](int b, int h, int i, int j) {
    const bool keep =
        std::abs(i + 2 - j) <= 2 && qd[static_cast<std::size_t>(b * 5 + i)] == kd[static_cast<std::size_t>(b * 7 + j)];
    return keep ? -slope[h] * std::abs(i + 2 - j) : kNegInf;
  }));
}

TEST(ScoreMod, HandWrittenPaddingWithOrAndNot) {
  // Keys past each sequence's length are padding; additionally key 0 is a "sink" every query
  // sees, and head 1 does not see the key equal to their query position.
  Attn<5, 7> a;
  a.feeds.insert_or_assign("kv_len", i32_array({4, 7}, {B}));
  auto w = a.modded_weights([](Graph& g, auto scores) {
    auto kv_len = input<Tensor<i32, Batch<B>>>(g, "kv_len");
    auto padding = mask_mod([kv_len](auto b, auto, auto, auto k) { return k < kv_len[b]; });
    auto sink = mask_mod([](auto, auto, auto, auto k) { return k == 0; });
    auto self = mask_mod([](auto, auto h, auto q, auto k) { return h == 1 && k == q; }, bottom_right);
    return modded(scores, (padding || sink) && !self);
  });
  const int len[] = {4, 7};
  expect_near_all(w, a.biased_weights([&](int b, int h, int i, int j) {
    const bool keep = (j < len[b] || j == 0) && !(h == 1 && j == i + 2);
    return keep ? 0.0 : kNegInf;
  }));
}

TEST(ScoreMod, HandWrittenWhereMinMaxExpLog) {
  Attn<5, 5> a;
  auto w = a.modded_weights([](Graph&, auto scores) {
    auto f = score_mod([](auto s, auto, auto, auto q, auto k) {
      return where(k > q, min(s, 0.25) - log(exp(1.0 + 0 * s)), max(s, -0.5) / 2);
    });
    return modded(scores, f);
  });
  // The reference: the same formula by hand over the scaled scores, as a bias s' - s.
  const auto q = a.feeds.at("q").to_f32(), k = a.feeds.at("k").to_f32();
  expect_near_all(w, a.biased_weights([&](int b, int h, int i, int j) {
    double dot = 0;
    for (int d = 0; d < D; ++d)
      dot += static_cast<double>(q[static_cast<std::size_t>(((b * H + h) * 5 + i) * D + d)]) *
             k[static_cast<std::size_t>(((b * H + h) * 5 + j) * D + d)];
    const double s = static_cast<float>(static_cast<float>(dot) * (1.0 / std::sqrt(double(D))));
    const double m = j > i ? std::min(s, 0.25) - 1.0 : std::max(s, -0.5) / 2;
    return m - s;
  }));
}

// --- GQA scores [Batch, KvHeads, Group, Seq, Key] ------------------------------------------------

TEST(ScoreMod, GqaAlibiSpansBothHeadAxesAndCausal) {
  constexpr int KH = 2, G = 2, L = 3, S = 5;
  Graph g;
  auto q = input<Tensor<f32, Batch<B>, KvHeads<KH>, Group<G>, Seq<L>, HeadDim<D>>>(g, "q");
  auto k = input<Tensor<f32, Batch<B>, KvHeads<KH>, Key<S>, HeadDim<D>>>(g, "k");
  auto slopes = input<Tensor<f32, KvHeads<KH>, Group<G>>>(g, "slopes");
  auto kv_head_bias = input<Tensor<f32, KvHeads<KH>>>(g, "kvb");
  auto s = scaled(contract<HeadDim>(q, k));
  auto extra = score_mod([&](auto x, auto, auto h, auto, auto) { return x + kv_head_bias[h]; });
  output(softmax<Key>(modded(s, mods::alibi(slopes, bottom_right), extra, mods::causal(bottom_right))), "p");
  Feeds feeds{{"q", random_array({B, KH, G, L, D}, 11)},
              {"k", random_array({B, KH, S, D}, 12)},
              {"slopes", f32_array({0.5f, 0.25f, 0.125f, 0.0625f}, {KH, G})},
              {"kvb", f32_array({0.0f, 3.0f}, {KH})}};
  const auto got = interpret(g, feeds).outputs.at("p").to_f32();

  Graph r;
  auto rq = input<Tensor<f32, Batch<B>, KvHeads<KH>, Group<G>, Seq<L>, HeadDim<D>>>(r, "q");
  auto rk = input<Tensor<f32, Batch<B>, KvHeads<KH>, Key<S>, HeadDim<D>>>(r, "k");
  auto bias = input<Tensor<f32, Batch<B>, KvHeads<KH>, Group<G>, Seq<L>, Key<S>>>(r, "bias");
  output(softmax<Key>(biased(scaled(contract<HeadDim>(rq, rk)), bias)), "p");
  std::vector<float> bv;
  const float sl[] = {0.5f, 0.25f, 0.125f, 0.0625f}, kvb[] = {0.0f, 3.0f};
  for (int b = 0; b < B; ++b)
    for (int kh = 0; kh < KH; ++kh)
      for (int gi = 0; gi < G; ++gi)
        for (int i = 0; i < L; ++i)
          for (int j = 0; j < S; ++j)
            bv.push_back(j <= i + S - L ? kvb[kh] - sl[kh * G + gi] * static_cast<float>(std::abs(i + S - L - j))
                                        : -std::numeric_limits<float>::infinity());
  feeds.insert_or_assign("bias", f32_array(bv, {B, KH, G, L, S}));
  expect_near_all(got, interpret(r, feeds).outputs.at("p").to_f32());
}

// --- the expression the DSL records ------------------------------------------------------------

TEST(ScoreMod, RecordsOneNodeWithTheExpression) {
  Graph g;
  auto q_ = input<Tensor<f32, Batch<B>, Heads<H>, Seq<5>, HeadDim<D>>>(g, "q");
  auto k_ = input<Tensor<f32, Batch<B>, Heads<H>, Key<7>, HeadDim<D>>>(g, "k");
  auto slopes = input<Tensor<f32, Heads<H>>>(g, "slopes");
  auto kv_doc = input<Tensor<i32, Batch<B>, Key<7>>>(g, "kv_doc");
  auto alibi =
      score_mod([&](auto s, auto, auto h, auto q, auto k) { return s - slopes[h] * abs(q - k); }, bottom_right);
  auto docs = mask_mod([&](auto b, auto, auto, auto k) { return kv_doc[b][k] == 1; });
  auto causal = mods::causal(bottom_right);
  auto m = modded(scaled(contract<HeadDim>(q_, k_)), alibi, docs, causal, alibi);
  const Node& n = m.node();
  ASSERT_EQ(n.op, Op::score_mod);
  EXPECT_EQ(n.inputs, (std::vector<int>{m.id() - 1, slopes.id(), kv_doc.id()}));  // captured once each
  EXPECT_EQ(n.axes, g.node(m.id() - 1).axes);
  ASSERT_TRUE(n.mod.has_value());
  const ModExpr& e = *n.mod;
  EXPECT_EQ(e.query, "Seq");
  EXPECT_EQ(e.key, "Key");
  EXPECT_EQ(e.align, CausalAlign::bottom_right);
  auto node = [&](int id) { return e.nodes.at(static_cast<std::size_t>(id)); };
  // score: alibi applied twice: (s - slope*|q'-k|) - slope*|q'-k|
  const ModNode top = node(e.score);
  ASSERT_EQ(top.op, ModOp::sub);
  const ModNode first = node(top.a);
  ASSERT_EQ(first.op, ModOp::sub);
  EXPECT_EQ(node(first.a).op, ModOp::score);
  EXPECT_EQ(top.b, first.b);  // the same slope * distance node, not traced twice
  const ModNode prod = node(first.b);
  ASSERT_EQ(prod.op, ModOp::mul);
  const ModNode load = node(prod.a);
  ASSERT_EQ(load.op, ModOp::load);
  EXPECT_EQ(load.input, 1);
  ASSERT_EQ(load.at.size(), 1u);
  EXPECT_EQ(node(load.at[0]).op, ModOp::index);
  EXPECT_EQ(node(load.at[0]).axis, "Heads");
  const ModNode dist = node(node(prod.b).a);  // abs(q - k)
  ASSERT_EQ(dist.op, ModOp::sub);
  EXPECT_EQ(node(dist.a).op, ModOp::position);  // the query as an aligned position
  EXPECT_EQ(node(dist.a).axis, "Seq");
  EXPECT_EQ(node(dist.b).op, ModOp::index);
  EXPECT_EQ(node(dist.b).axis, "Key");
  // keep: docs && causal
  const ModNode keep = node(e.keep);
  ASSERT_EQ(keep.op, ModOp::logical_and);
  const ModNode eq = node(keep.a);
  ASSERT_EQ(eq.op, ModOp::eq);
  const ModNode doc = node(eq.a);
  ASSERT_EQ(doc.op, ModOp::load);
  EXPECT_EQ(doc.input, 2);
  EXPECT_EQ(node(doc.at[0]).axis, "Batch");
  EXPECT_EQ(node(doc.at[1]).op, ModOp::index);  // raw, unaligned: a load index
  EXPECT_EQ(node(eq.b).op, ModOp::constant);
  EXPECT_EQ(node(keep.b).op, ModOp::le);
  for (std::size_t i = 0; i < e.nodes.size(); ++i)  // topological and typed
    for (int x : {e.nodes[i].a, e.nodes[i].b, e.nodes[i].c}) EXPECT_LT(x, static_cast<int>(i));
}

TEST(ScoreMod, RuntimeChecks) {
  // A tensor from another graph.
  Graph g, other;
  auto q = input<Tensor<f32, Seq<3>, HeadDim<D>>>(g, "q");
  auto k = input<Tensor<f32, Key<3>, HeadDim<D>>>(g, "k");
  auto foreign = input<Tensor<f32, Key<3>>>(other, "b");
  auto s = scaled(contract<HeadDim>(q, k));
  EXPECT_THROW((void)modded(s, score_mod([&](auto x, auto, auto, auto, auto kk) { return x + foreign[kk]; })),
               std::invalid_argument);
  // Rank 2: b and h are 0.
  auto m = modded(s, mask_mod([](auto b, auto h, auto, auto kk) { return kk + b + h >= 0; }));
  EXPECT_EQ(m.node().mod->nodes.size(), 5u);  // index k, constant 0 (shared), add, add, ge
  // Dynamic L and S: an unaligned mod that reads query positions checks L == S at bind time.
  Graph d;
  auto dq = input<Tensor<f32, Seq<dyn>, HeadDim<D>>>(d, "q");
  auto dk = rename<Mem, Key>(input<Tensor<f32, Mem<dyn>, HeadDim<D>>>(d, "k"));
  output(softmax<Key>(modded(scaled(contract<HeadDim>(dq, dk)), mods::causal())), "p");
  EXPECT_NO_THROW(d.check({{"Seq", 4}, {"Mem", 4}}));
  try {
    d.check({{"Seq", 4}, {"Mem", 6}});
    ADD_FAILURE() << "no ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_EQ(std::string(e.what()),
              "modded: `Seq` (4) != `Key` (6), so the alignment of a mod that reads query positions matters; fix: "
              "score_mod(f, top_left) / mask_mod(f, top_left) as in PyTorch is_causal, or bottom_right as in "
              "FlashAttention");
  }
}

}  // namespace
}  // namespace qkv::nn
