// The fused attention backward (fused_attention_backward, made by the gradient of a
// fused_attention: qkv/ir/grad.hpp) on the reference interpreter, against the gradient of the
// unfused graph (contract/softmax/contract, differentiated op by op) on the same interpreter.
//
// Each case builds the DSL attention with output y and the loss Σ y ⊙ r (r a random probe), then
// (a) differentiates that graph as it is, (b) fuses it (canonicalize + fuse-attention, as the
// pipeline does) and differentiates the fused graph. (b) must contain the fused backward node
// (or, for what it does not cover — dropout, score modifications — the recomputed unfused
// backward), and its dq, dk, dv must equal (a)'s within fp32 rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <qkv/codegen/passes/canonicalize.hpp>
#include <qkv/codegen/passes/fuse_attention.hpp>
#include <qkv/ir/grad.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>

namespace qkv::nn {
namespace {

struct Case {
  std::string name;
  std::int64_t batch = 2, hkv = 2, group = 1, len_q = 5, len_k = 5, dk = 4, dv = 4;
  bool causal = false;
  CausalAlign align = CausalAlign::top_left;
  bool key_padding = false;
  double scale = 0.0;  // 0: 1/sqrt(dk)
  bool bias = false;   // a score modification: the fused backward does not cover it
  double dropout = 0.0;
  bool fused_backward = true;  // whether (b) has a fused_attention_backward node
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

NdArray random_array(const std::vector<std::int64_t>& shape, std::mt19937& rng, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = u(rng);
  return NdArray::from_f32(std::move(v), shape);
}

template <class S, class V>
void finish(const Case& c, Graph& g, S s, const V& v) {
  if (c.bias) s = biased(s, input<Tensor<f32, Seq<dyn>, Key<dyn>>>(g, "bias"));
  if (c.key_padding) s = masked(s, input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep"));
  if (c.causal)
    s = c.align == CausalAlign::top_left ? causal<Seq, Key>(s, top_left) : causal<Seq, Key>(s, bottom_right);
  auto p = softmax<Key>(s);
  if (c.dropout > 0) p = dropout(p, c.dropout, 0x5eedull);
  output(contract<Key>(p, v), "y");
}

std::optional<double> custom_scale(const Case& c) {
  return c.scale != 0.0 ? std::optional<double>(c.scale) : std::nullopt;
}

/// The forward graph (output "y") and its feeds.
Graph forward(const Case& c, Feeds& feeds, std::mt19937& rng) {
  Graph g;
  if (c.group > 1) {
    auto q = input<Tensor<f32, Batch<dyn>, KvHeads<dyn>, Group<dyn>, Seq<dyn>, HeadDim<dyn>>>(g, "q");
    auto k = input<Tensor<f32, Batch<dyn>, KvHeads<dyn>, Key<dyn>, HeadDim<dyn>>>(g, "k");
    auto v = input<Tensor<f32, Batch<dyn>, KvHeads<dyn>, Key<dyn>, ValueDim<dyn>>>(g, "v");
    finish(c, g, scaled(contract<HeadDim>(q, k), custom_scale(c)), v);
    feeds["q"] = random_array({c.batch, c.hkv, c.group, c.len_q, c.dk}, rng, -2, 2);
  } else {
    auto q = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Seq<dyn>, HeadDim<dyn>>>(g, "q");
    auto k = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Key<dyn>, HeadDim<dyn>>>(g, "k");
    auto v = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Key<dyn>, ValueDim<dyn>>>(g, "v");
    finish(c, g, scaled(contract<HeadDim>(q, k), custom_scale(c)), v);
    feeds["q"] = random_array({c.batch, c.hkv, c.len_q, c.dk}, rng, -2, 2);
  }
  feeds["k"] = random_array({c.batch, c.hkv, c.len_k, c.dk}, rng, -2, 2);
  feeds["v"] = random_array({c.batch, c.hkv, c.len_k, c.dv}, rng);
  if (c.bias) feeds["bias"] = random_array({c.len_q, c.len_k}, rng);
  if (c.key_padding) {
    NdArray keep = NdArray::zeros(DType::boolean, {c.batch, c.len_k});
    for (std::int64_t b = 0; b < c.batch; ++b)
      for (std::int64_t j = 0; j < c.len_k; ++j)  // batch row b sees its first len_k − 2b keys (0: none)
        keep.bytes[static_cast<std::size_t>(b * c.len_k + j)] = std::byte{j < c.len_k - 2 * b ? std::uint8_t{1} : std::uint8_t{0}};
    feeds["keep"] = keep;
  }
  return g;
}

int leaf_named(const Graph& g, const std::string& name) {
  for (std::size_t i = 0; i < g.size(); ++i)
    if (is_array_leaf(g.node(static_cast<int>(i))) && g.node(static_cast<int>(i)).name == name)
      return static_cast<int>(i);
  return -1;
}

/// g with the probe and the loss appended (output "loss").
void add_loss(Graph& g, Feeds& feeds, std::mt19937& rng) {
  int y = -1;
  for (const auto& o : g.outputs())
    if (o.name == "y") y = o.node;
  const NdArray y0 = interpret(g, feeds).outputs.at("y");
  Node probe;
  probe.op = Op::input;
  probe.name = "probe";
  probe.axes = g.node(y).axes;
  const int r = g.add(std::move(probe));
  feeds["probe"] = random_array(y0.shape, rng);
  grad_detail::Builder b(g);
  std::vector<std::string> all;
  for (const auto& a : g.node(y).axes) all.push_back(a.name);
  g.mark_output(b.sum_over(b.binary(Op::mul, y, r), all), "loss");
}

/// Appends the gradients of "loss" by q, k and v as outputs dq, dk, dv.
void add_grads(Graph& g) {
  int loss = -1;
  for (const auto& o : g.outputs())
    if (o.name == "loss") loss = o.node;
  const std::vector<int> grads = append_gradients(g, loss, {leaf_named(g, "q"), leaf_named(g, "k"), leaf_named(g, "v")});
  g.mark_output(grads[0], "dq");
  g.mark_output(grads[1], "dk");
  g.mark_output(grads[2], "dv");
}

int count(const Graph& g, Op op) {
  return static_cast<int>(std::count_if(g.nodes().begin(), g.nodes().end(), [&](const Node& n) { return n.op == op; }));
}

class AttentionBackward : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionBackward, FusedGradientEqualsTheUnfusedOne) {
  const Case& c = GetParam();
  std::mt19937 rng(42);
  Feeds feeds;
  Graph g = forward(c, feeds, rng);
  add_loss(g, feeds, rng);
  Graph fused = codegen::fuse_attention(codegen::canonicalize(g));
  ASSERT_EQ(count(fused, Op::fused_attention), 1) << fused.table();
  add_grads(g);
  add_grads(fused);
  EXPECT_EQ(count(fused, Op::fused_attention_backward), c.fused_backward ? 1 : 0) << fused.table();
  const RunResult want = interpret(g, feeds), got = interpret(fused, feeds);
  EXPECT_NEAR(want.outputs.at("loss").to_f32()[0], got.outputs.at("loss").to_f32()[0], 1e-5);
  for (const char* name : {"dq", "dk", "dv"}) {
    const std::vector<float> a = want.outputs.at(name).to_f32(), b = got.outputs.at(name).to_f32();
    ASSERT_EQ(want.outputs.at(name).shape, got.outputs.at(name).shape) << name;
    double scale = 1e-6, diff = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(std::isfinite(b[i])) << name << "[" << i << "]";
      scale = std::max(scale, static_cast<double>(std::abs(a[i])));
      diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
    }
    EXPECT_LE(diff, 2e-5 * scale) << name << " (largest entry " << scale << ")";
  }
}

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back({.name = "plain"});
  v.push_back({.name = "causal", .len_q = 7, .len_k = 7, .causal = true});
  v.push_back({.name = "causal_top_left_l_lt_s", .len_q = 4, .len_k = 9, .causal = true});
  v.push_back({.name = "causal_bottom_right_l_gt_s",
               .len_q = 9,
               .len_k = 4,
               .causal = true,
               .align = CausalAlign::bottom_right});  // rows with no visible key: zero gradients
  v.push_back({.name = "key_padding", .len_k = 6, .key_padding = true});  // batch row 1 sees 2 keys
  v.push_back({.name = "padding_all_keys", .batch = 4, .len_k = 5, .key_padding = true});  // row 3: none
  v.push_back({.name = "l_ne_s", .len_q = 3, .len_k = 8});
  v.push_back({.name = "dk_ne_dv", .dk = 6, .dv = 3});
  v.push_back({.name = "gqa", .hkv = 2, .group = 3, .len_q = 4, .len_k = 6});
  v.push_back({.name = "mqa_causal", .hkv = 1, .group = 4, .len_q = 6, .len_k = 6, .causal = true});
  v.push_back({.name = "scale", .scale = 0.3});
  v.push_back({.name = "bias_falls_back", .bias = true, .fused_backward = false});
  v.push_back({.name = "dropout_falls_back", .dropout = 0.25, .fused_backward = false});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionBackward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace qkv::nn
