// The fused attention backward (fused_attention_backward, made by the gradient of a
// fused_attention: qkv/ir/grad.hpp) on the reference interpreter, against the gradient of the
// unfused graph (contract/softmax/contract, differentiated op by op) on the same interpreter.
//
// Each case builds the DSL attention with output y and the loss Σ y ⊙ r (r a random probe), then
// (a) differentiates that graph as it is, (b) fuses it (canonicalize + fuse-attention, as the
// pipeline does) and differentiates the fused graph. (b) must contain the fused backward node
// (or, for what it does not cover — dropout — the recomputed unfused backward), and its dq, dk,
// dv must equal (a)'s within fp32 rounding. Score modifications (a bias, ALiBi, a softcap) are
// differentiated inside the fused backward; (a) differentiates them op by op.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/cpu/run_attention.hpp>
#include <qkv/codegen/cpu/run_attention_backward.hpp>
#include <qkv/codegen/lowering/attention_call.hpp>
#include <qkv/codegen/passes/canonicalize.hpp>
#include <qkv/codegen/passes/fuse_attention.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
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
  double scale = 0.0;    // 0: 1/sqrt(dk)
  bool bias = false;     // an additive bias [Seq, Key] (a score modification)
  bool alibi = false;    // ALiBi with slopes [Heads] (group 1 only)
  double softcap = 0.0;  // c · tanh(s / c) when > 0
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
  if (c.softcap > 0) s = decltype(s)(g, modded(s, mods::softcap(c.softcap)).id());
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
    auto s = scaled(contract<HeadDim>(q, k), custom_scale(c));
    if (c.alibi) {
      s = decltype(s)(g, modded(s, mods::alibi(input<Tensor<f32, Heads<dyn>>>(g, "slopes"), top_left)).id());
      feeds["slopes"] = random_array({c.hkv}, rng, 0.1f, 1.0f);
    }
    finish(c, g, s, v);
    feeds["q"] = random_array({c.batch, c.hkv, c.len_q, c.dk}, rng, -2, 2);
  }
  feeds["k"] = random_array({c.batch, c.hkv, c.len_k, c.dk}, rng, -2, 2);
  feeds["v"] = random_array({c.batch, c.hkv, c.len_k, c.dv}, rng);
  if (c.bias) feeds["bias"] = random_array({c.len_q, c.len_k}, rng);
  if (c.key_padding) {
    NdArray keep = NdArray::zeros(DType::boolean, {c.batch, c.len_k});
    for (std::int64_t b = 0; b < c.batch; ++b)
      for (std::int64_t j = 0; j < c.len_k; ++j)  // batch row b sees its first len_k − 2b keys (0: none)
        keep.bytes[static_cast<std::size_t>(b * c.len_k + j)] =
            std::byte{j < c.len_k - 2 * b ? std::uint8_t{1} : std::uint8_t{0}};
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

/// g with the probe and the loss appended (output "loss"); the probe is drawn from rng unless
/// feeds has one already.
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
  if (!feeds.count("probe")) feeds["probe"] = random_array(y0.shape, rng);
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
  const std::vector<int> grads =
      append_gradients(g, loss, {leaf_named(g, "q"), leaf_named(g, "k"), leaf_named(g, "v")});
  g.mark_output(grads[0], "dq");
  g.mark_output(grads[1], "dk");
  g.mark_output(grads[2], "dv");
}

int count(const Graph& g, Op op) {
  return static_cast<int>(std::count_if(g.nodes().begin(), g.nodes().end(), [&](const Node& n) { return n.op == op; }));
}

/// The largest |a − b| over the largest |a| (at least 1e-6), names checked to be finite in b.
double relative_error(const std::vector<float>& a, const std::vector<float>& b, const std::string& name) {
  EXPECT_EQ(a.size(), b.size()) << name;
  double scale = 1e-6, diff = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_TRUE(std::isfinite(b[i])) << name << "[" << i << "]";
    scale = std::max(scale, static_cast<double>(std::abs(a[i])));
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
  }
  return diff / scale;
}

/// Case c's forward graph with its loss, fused (canonicalize + fuse-attention, as the pipeline
/// does) and then differentiated: outputs loss, dq, dk, dv.
Graph fused_with_grads(const Case& c, Feeds& feeds, unsigned seed) {
  std::mt19937 rng(seed);
  Graph g = forward(c, feeds, rng);
  add_loss(g, feeds, rng);
  Graph fused = codegen::fuse_attention(codegen::canonicalize(g));
  add_grads(fused);
  return fused;
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
    ASSERT_EQ(want.outputs.at(name).shape, got.outputs.at(name).shape) << name;
    EXPECT_LE(relative_error(want.outputs.at(name).to_f32(), got.outputs.at(name).to_f32(), name), 2e-5) << name;
  }
}

/// The fused graph's gradients compiled for the CPU (the backward node's kernel, D and the dQ
/// partial sums in the module) against the interpreter, and bit for bit on 1 and 3 threads.
void expect_compiled_matches(const Graph& fused, const Feeds& feeds) {
  const RunResult want = interpret(fused, feeds);
  const RunResult one = codegen::cpu::run(fused, feeds, 1), three = codegen::cpu::run(fused, feeds, 3);
  for (const char* name : {"loss", "dq", "dk", "dv"}) {
    const std::vector<float> a = want.outputs.at(name).to_f32(), b = one.outputs.at(name).to_f32();
    EXPECT_LE(relative_error(a, b, name), 1e-4) << name;
    EXPECT_EQ(b, three.outputs.at(name).to_f32()) << name << ": 1 and 3 threads differ";
  }
}

TEST_P(AttentionBackward, TheCompiledGraphMatchesTheInterpreterOnAnyThreadCount) {
  const Case& c = GetParam();
  Feeds feeds;
  const Graph fused = fused_with_grads(c, feeds, 11);
  ASSERT_EQ(count(fused, Op::fused_attention_backward), c.fused_backward ? 1 : 0);
  expect_compiled_matches(fused, feeds);
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
               .align = CausalAlign::bottom_right});                      // rows with no visible key: zero gradients
  v.push_back({.name = "key_padding", .len_k = 6, .key_padding = true});  // batch row 1 sees 2 keys
  v.push_back({.name = "padding_all_keys", .batch = 4, .len_k = 5, .key_padding = true});  // row 3: none
  v.push_back({.name = "l_ne_s", .len_q = 3, .len_k = 8});
  v.push_back({.name = "dk_ne_dv", .dk = 6, .dv = 3});
  v.push_back({.name = "gqa", .hkv = 2, .group = 3, .len_q = 4, .len_k = 6});
  v.push_back({.name = "mqa_causal", .hkv = 1, .group = 4, .len_q = 6, .len_k = 6, .causal = true});
  v.push_back({.name = "scale", .scale = 0.3});
  v.push_back({.name = "bias", .bias = true});
  v.push_back({.name = "softcap", .len_q = 6, .len_k = 7, .softcap = 1.5});
  v.push_back({.name = "alibi_softcap_causal", .len_q = 7, .len_k = 7, .causal = true, .alibi = true, .softcap = 2.0});
  v.push_back({.name = "gqa_softcap_padding", .group = 3, .len_k = 6, .key_padding = true, .softcap = 1.0});
  v.push_back({.name = "alibi_bias_tiles",
               .batch = 1,
               .hkv = 2,
               .len_q = 40,
               .len_k = 90,
               .dk = 16,
               .dv = 8,
               .bias = true,
               .alibi = true,
               .softcap = 3.0});
  v.push_back({.name = "dropout", .dropout = 0.25});
  v.push_back({.name = "dropout_causal_softcap_gqa",
               .group = 2,
               .len_q = 6,
               .len_k = 6,
               .causal = true,
               .softcap = 2.0,
               .dropout = 0.4});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionBackward, ::testing::ValuesIn(cases()),
                         [](const auto& test) { return test.param.name; });

// --- gradients of the tensors a score modification reads (attention_dtensor)

QKV_AXIS(RelPos);  // j − i + S − 1, the index of a relative-position bias table

/// ALiBi slopes [Heads], a bias [Seq, Key] and a relative-position table [Heads, RelPos] read at
/// computed coordinates, then a softcap (and a causal mask), differentiated by every input.
/// `table`: the fused graph reads the table; otherwise (the reference) a full bias
/// relfull [Heads, Seq, Key] in its place, whose gradient the test scatters into the table's.
Graph tensor_mods(bool table, bool causal_mask) {
  Graph g;
  auto q = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Seq<dyn>, HeadDim<dyn>>>(g, "q");
  auto k = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Key<dyn>, HeadDim<dyn>>>(g, "k");
  auto v = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Key<dyn>, ValueDim<dyn>>>(g, "v");
  auto s = scaled(contract<HeadDim>(q, k));
  s = decltype(s)(g, modded(s, mods::alibi(input<Tensor<f32, Heads<dyn>>>(g, "slopes"), top_left)).id());
  s = biased(s, input<Tensor<f32, Seq<dyn>, Key<dyn>>>(g, "bias"));
  if (table)
    s = decltype(s)(
        g, modded(s, mods::relative_bias(input<Tensor<f32, Heads<dyn>, RelPos<dyn>>>(g, "table"), top_left)).id());
  else
    s = biased(s, input<Tensor<f32, Heads<dyn>, Seq<dyn>, Key<dyn>>>(g, "relfull"));
  s = decltype(s)(g, modded(s, mods::softcap(2.5)).id());
  if (causal_mask) s = causal<Seq, Key>(s, top_left);
  output(contract<Key>(softmax<Key>(s), v), "y");
  return g;
}

/// Appends the gradients of g's "loss" by the leaves `wrt`, as outputs "d" + name.
void differentiate(Graph& g, const std::vector<std::string>& wrt) {
  int loss = -1;
  for (const auto& o : g.outputs())
    if (o.name == "loss") loss = o.node;
  std::vector<int> ids;
  for (const auto& name : wrt) ids.push_back(leaf_named(g, name));
  const std::vector<int> grads = append_gradients(g, loss, ids);
  for (std::size_t k = 0; k < grads.size(); ++k) g.mark_output(grads[k], "d" + wrt[k]);
}

/// The slots of each tensor gradient of fused's backward node, by the tensor's name.
std::map<std::string, codegen::cpu::AttentionSpec::TensorGrad> grad_slots(const Graph& fused, const Bindings& fixed) {
  std::map<std::string, codegen::cpu::AttentionSpec::TensorGrad> out;
  for (int id = 0; id < static_cast<int>(fused.size()); ++id) {
    if (fused.node(id).op != Op::fused_attention_backward) continue;
    for (const auto& t : codegen::describe_attention(fused, id, fixed).spec.tensor_grads)
      out[fused.node(fused.node(id).inputs[6 + static_cast<std::size_t>(t.tensor)]).name] = t;
  }
  return out;
}

/// The fused graph's gradients `names` compiled for the CPU against the interpreter's (`want`),
/// and bit for bit on 1 and 3 threads.
void expect_compiled_grads(const Graph& fused, const Feeds& feeds, const RunResult& want,
                           const std::vector<std::string>& names) {
  const RunResult one = codegen::cpu::run(fused, feeds, 1), three = codegen::cpu::run(fused, feeds, 3);
  for (const auto& name : names) {
    EXPECT_LE(relative_error(want.outputs.at(name).to_f32(), one.outputs.at(name).to_f32(), name), 1e-4) << name;
    EXPECT_EQ(one.outputs.at(name).to_f32(), three.outputs.at(name).to_f32()) << name << ": 1 and 3 threads differ";
  }
}

TEST(AttentionBackwardTensors, TheTensorsAModReadsGetTheUnfusedGradients) {
  for (const bool causal_mask : {false, true}) {
    SCOPED_TRACE(causal_mask ? "causal" : "dense");
    const std::int64_t B = 2, H = 2, L = 37, S = 70, D = 16;
    std::mt19937 rng(5);
    Feeds feeds;
    feeds["q"] = random_array({B, H, L, D}, rng, -2, 2);
    feeds["k"] = random_array({B, H, S, D}, rng, -2, 2);
    feeds["v"] = random_array({B, H, S, D}, rng);
    feeds["slopes"] = random_array({H}, rng, 0.05f, 0.5f);
    feeds["bias"] = random_array({L, S}, rng);
    feeds["table"] = random_array({H, 2 * S - 1}, rng);
    const std::vector<float> table = feeds.at("table").to_f32();
    std::vector<float> full(static_cast<std::size_t>(H * L * S));
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < L; ++i)
        for (std::int64_t j = 0; j < S; ++j)
          full[static_cast<std::size_t>((h * L + i) * S + j)] =
              table[static_cast<std::size_t>(h * (2 * S - 1) + j - i + S - 1)];
    feeds["relfull"] = NdArray::from_f32(full, {H, L, S});

    // (a) the reference: the unfused graph with the full bias, differentiated op by op.
    Graph ref = tensor_mods(false, causal_mask);
    add_loss(ref, feeds, rng);
    // (b) the fused graph with the table, differentiated: one fused backward.
    Graph fused = codegen::fuse_attention(codegen::canonicalize(tensor_mods(true, causal_mask)));
    add_loss(fused, feeds, rng);  // the same probe
    differentiate(ref, {"q", "k", "v", "slopes", "bias", "relfull"});
    differentiate(fused, {"q", "k", "v", "slopes", "bias", "table"});
    ASSERT_EQ(count(fused, Op::fused_attention_backward), 1) << fused.table();
    ASSERT_EQ(count(fused, Op::attention_dtensor), 3) << fused.table();
    // Where the partial sums are kept: the slopes [Heads] apart per batch and chunk of keys (not
    // per head: each kv head owns its slope), the bias [Seq, Key] per batch and head (each chunk
    // owns its keys' columns), the table per batch and chunk.
    const auto slots = grad_slots(fused, {{"Heads", H}, {"HeadDim", D}, {"ValueDim", D}});
    ASSERT_EQ(slots.size(), 3u);
    for (const auto& [name, t] : slots) {
      const bool bias = name == "bias";
      EXPECT_TRUE(t.per_batch) << name;
      EXPECT_EQ(t.per_kv_head, bias) << name;
      EXPECT_EQ(t.per_chunk, !bias) << name;
    }

    const RunResult want = interpret(ref, feeds), got = interpret(fused, feeds);
    // The table's gradient: the full bias's, scattered by relative position.
    std::vector<float> dtable(table.size(), 0.0f);
    const std::vector<float> dfull = want.outputs.at("drelfull").to_f32();
    std::vector<double> sum(table.size(), 0.0);
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < L; ++i)
        for (std::int64_t j = 0; j < S; ++j)
          sum[static_cast<std::size_t>(h * (2 * S - 1) + j - i + S - 1)] +=
              dfull[static_cast<std::size_t>((h * L + i) * S + j)];
    for (std::size_t e = 0; e < sum.size(); ++e) dtable[e] = static_cast<float>(sum[e]);
    for (const char* name : {"dq", "dk", "dv", "dslopes", "dbias"})
      EXPECT_LE(relative_error(want.outputs.at(name).to_f32(), got.outputs.at(name).to_f32(), name), 2e-5) << name;
    EXPECT_LE(relative_error(dtable, got.outputs.at("dtable").to_f32(), "dtable"), 2e-5);

    expect_compiled_grads(fused, feeds, got, {"dq", "dk", "dv", "dslopes", "dbias", "dtable"});
  }
}

/// GQA with ALiBi slopes per batch [Batch, KvHeads, Group] and a key bias per batch [Batch, Key]:
/// tensors the batch coordinate indexes (their slots do not run over the batch; the slopes' not
/// over the kv head either), under key padding; the reference is the same graph unfused.
TEST(AttentionBackwardTensors, PerBatchTensorsUnderGqa) {
  const std::int64_t B = 3, Hkv = 2, G = 2, L = 21, S = 75, D = 8;
  auto build = [] {
    Graph g;
    auto q = input<Tensor<f32, Batch<dyn>, KvHeads<dyn>, Group<dyn>, Seq<dyn>, HeadDim<dyn>>>(g, "q");
    auto k = input<Tensor<f32, Batch<dyn>, KvHeads<dyn>, Key<dyn>, HeadDim<dyn>>>(g, "k");
    auto v = input<Tensor<f32, Batch<dyn>, KvHeads<dyn>, Key<dyn>, ValueDim<dyn>>>(g, "v");
    auto s = scaled(contract<HeadDim>(q, k));
    auto slopes = input<Tensor<f32, Batch<dyn>, KvHeads<dyn>, Group<dyn>>>(g, "slopes");
    s = decltype(s)(g, modded(s, mods::alibi(slopes, bottom_right)).id());
    s = biased(s, input<Tensor<f32, Batch<dyn>, Key<dyn>>>(g, "keybias"));
    s = masked(s, input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep"));
    output(contract<Key>(softmax<Key>(s), v), "y");
    return g;
  };
  std::mt19937 rng(9);
  Feeds feeds;
  feeds["q"] = random_array({B, Hkv, G, L, D}, rng, -2, 2);
  feeds["k"] = random_array({B, Hkv, S, D}, rng, -2, 2);
  feeds["v"] = random_array({B, Hkv, S, D}, rng);
  feeds["slopes"] = random_array({B, Hkv, G}, rng, 0.05f, 0.5f);
  feeds["keybias"] = random_array({B, S}, rng);
  NdArray keep = NdArray::zeros(DType::boolean, {B, S});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t j = 0; j < S; ++j)
      keep.bytes[static_cast<std::size_t>(b * S + j)] = std::byte{j < S - 20 * b ? std::uint8_t{1} : std::uint8_t{0}};
  feeds["keep"] = keep;
  const std::vector<std::string> wrt{"q", "k", "v", "slopes", "keybias"};
  Graph ref = build();
  add_loss(ref, feeds, rng);
  Graph fused = codegen::fuse_attention(codegen::canonicalize(build()));
  add_loss(fused, feeds, rng);
  differentiate(ref, wrt);
  differentiate(fused, wrt);
  ASSERT_EQ(count(fused, Op::fused_attention_backward), 1) << fused.table();
  const auto slots = grad_slots(fused, {{"KvHeads", Hkv}, {"Group", G}, {"HeadDim", D}, {"ValueDim", D}});
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_FALSE(slots.at("slopes").per_batch);
  EXPECT_FALSE(slots.at("slopes").per_kv_head);  // indexed by the kv head (and its group)
  EXPECT_TRUE(slots.at("slopes").per_chunk);
  EXPECT_FALSE(slots.at("keybias").per_batch);
  EXPECT_FALSE(slots.at("keybias").per_chunk);
  const RunResult want = interpret(ref, feeds), got = interpret(fused, feeds);
  for (const auto& name : wrt)
    EXPECT_LE(relative_error(want.outputs.at("d" + name).to_f32(), got.outputs.at("d" + name).to_f32(), name), 2e-5)
        << name;
  expect_compiled_grads(fused, feeds, got, {"dq", "dk", "dv", "dslopes", "dkeybias"});
}

// --- bf16: q, k, v, the output and dO stored as bf16, read and written by the fused backward

TEST(AttentionBackwardBf16, TheCompiledBackwardReadsAndWritesBf16) {
  const std::int64_t B = 2, Hkv = 2, G = 2, L = 45, S = 77, D = 16;
  auto build = [](auto type_tag) {
    using T = decltype(type_tag);
    Graph g;
    auto q = input<Tensor<T, Batch<dyn>, KvHeads<dyn>, Group<dyn>, Seq<dyn>, HeadDim<dyn>>>(g, "q");
    auto k = input<Tensor<T, Batch<dyn>, KvHeads<dyn>, Key<dyn>, HeadDim<dyn>>>(g, "k");
    auto v = input<Tensor<T, Batch<dyn>, KvHeads<dyn>, Key<dyn>, ValueDim<dyn>>>(g, "v");
    auto s = scaled(contract<HeadDim>(q, k));
    s = decltype(s)(g, modded(s, mods::softcap(2.0)).id());
    output(contract<Key>(softmax<Key>(causal<Seq, Key>(s, bottom_right)), v), "y");
    return g;
  };
  std::mt19937 rng(3);
  Feeds f32_feeds;
  f32_feeds["q"] = random_array({B, Hkv, G, L, D}, rng, -2, 2);
  f32_feeds["k"] = random_array({B, Hkv, S, D}, rng, -2, 2);
  f32_feeds["v"] = random_array({B, Hkv, S, D}, rng);
  f32_feeds["probe"] = random_array({B, Hkv, G, L, D}, rng);
  Feeds feeds;
  for (const auto& [name, a] : f32_feeds) feeds[name] = a.converted(DType::bf16);
  const std::vector<std::string> wrt{"q", "k", "v"};
  Graph fused = codegen::fuse_attention(codegen::canonicalize(build(bf16{})));
  add_loss(fused, feeds, rng);
  differentiate(fused, wrt);
  ASSERT_EQ(count(fused, Op::fused_attention_backward), 1) << fused.table();
  // Lowered, the backward reads and writes bf16 itself: no conversion around it.
  const Graph lowered = codegen::lower(fused);
  for (const Node& n : lowered.nodes())
    if (n.op == Op::fused_attention_backward || n.op == Op::attention_dk || n.op == Op::attention_dv) {
      EXPECT_EQ(n.dtype, DType::bf16) << op_name(n.op);
    }
  EXPECT_EQ(count(lowered, Op::fused_attention_backward), 1);

  const RunResult want = interpret(fused, feeds);
  const RunResult one = codegen::cpu::run(fused, feeds, 1), three = codegen::cpu::run(fused, feeds, 3);
  // The same gradient in f32 from the bf16 values (the rounding of q, k, v and dO only).
  Feeds widened;
  for (const auto& [name, a] : feeds) widened[name] = a.converted(DType::f32);
  Graph f32_graph = codegen::fuse_attention(codegen::canonicalize(build(f32{})));
  add_loss(f32_graph, widened, rng);
  differentiate(f32_graph, wrt);
  const RunResult exact = interpret(f32_graph, widened);
  for (const auto& name : wrt) {
    const std::string d = "d" + name;
    ASSERT_EQ(one.outputs.at(d).dtype, DType::bf16) << d;
    // One bf16 rounding of each gradient (2⁻⁸ relative) apart from the interpreter, which rounds
    // the same node's exact value; a few from the f32 gradient.
    EXPECT_LE(relative_error(want.outputs.at(d).to_f32(), one.outputs.at(d).to_f32(), d), 8e-3) << d;
    EXPECT_LE(relative_error(exact.outputs.at(d).to_f32(), one.outputs.at(d).to_f32(), d), 2e-2) << d;
    EXPECT_EQ(one.outputs.at(d).to_f32(), three.outputs.at(d).to_f32()) << d << ": 1 and 3 threads differ";
  }
}

// --- the CPU kernel (codegen::cpu::run_attention_backward) against the interpreter

struct KernelGrads {
  std::vector<float> dq, dk, dv;
};

codegen::cpu::AttentionSpec spec_of(const Case& c) {
  codegen::cpu::AttentionSpec s;
  s.dk = c.dk;
  s.dv = c.dv;
  s.hq = c.hkv * c.group;
  s.hkv = c.hkv;
  s.scale = c.scale;
  s.causal = c.causal;
  s.align = c.align;
  s.key_padding = c.key_padding;
  s.bias = c.bias;
  s.dropout_p = c.dropout;
  if (c.softcap > 0) {  // c · tanh(s / c), written out
    ModExpr& e = s.mod;
    const int score = e.add(mod_node(ModOp::score)), cap = e.add(mod_constant(c.softcap));
    e.score = e.add(mod_node(ModOp::mul, cap, e.add(mod_node(ModOp::tanh, e.add(mod_node(ModOp::div, score, cap))))));
  }
  return s;
}

/// The forward kernel (with its log-sum-exp), then the backward kernel with dO = the probe; q, k,
/// v, the output, dO and the gradients stored as `storage` (f32, or bf16 rounded from the feeds).
KernelGrads run_kernels(const Case& c, const Feeds& feeds, int threads, DType storage = DType::f32) {
  codegen::cpu::AttentionSpec spec = spec_of(c);
  spec.storage = storage;
  const std::int64_t hq = spec.hq;
  std::vector<float> lse(static_cast<std::size_t>(c.batch * hq * c.len_q));
  std::vector<std::uint8_t> keep;
  if (c.key_padding)
    for (std::byte x : feeds.at("keep").bytes) keep.push_back(static_cast<std::uint8_t>(x));
  const NdArray q = feeds.at("q").converted(storage), k = feeds.at("k").converted(storage),
                v = feeds.at("v").converted(storage), dout = feeds.at("probe").converted(storage);
  NdArray out = NdArray::zeros(storage, {c.batch * hq * c.len_q * c.dv});
  codegen::cpu::AttentionArgs a;
  a.q = q.bytes.data();
  a.k = k.bytes.data();
  a.v = v.bytes.data();
  a.out = out.bytes.data();
  a.key_keep = keep.empty() ? nullptr : keep.data();
  const std::vector<float> bias = c.bias ? feeds.at("bias").to_f32() : std::vector<float>{};
  a.bias = c.bias ? bias.data() : nullptr;
  a.batch = c.batch;
  a.len_q = c.len_q;
  a.len_k = c.len_k;
  a.lse = lse.data();
  a.seed = 0x5eedull;  // the graph's dropout seed (finish)
  spec.write_lse = true;
  codegen::cpu::run_attention(spec, a, threads);
  spec.write_lse = false;
  NdArray grads[3] = {NdArray::zeros(storage, q.shape), NdArray::zeros(storage, k.shape),
                      NdArray::zeros(storage, v.shape)};
  for (NdArray& g : grads) std::fill(g.bytes.begin(), g.bytes.end(), std::byte{0xFF});  // NaN until written
  codegen::cpu::AttentionBackwardArgs b;
  b.forward = a;
  b.d_out = dout.bytes.data();
  b.dq = grads[0].bytes.data();
  b.dk = grads[1].bytes.data();
  b.dv = grads[2].bytes.data();
  codegen::cpu::run_attention_backward(spec, b, threads);
  return {grads[0].to_f32(), grads[1].to_f32(), grads[2].to_f32()};
}

class AttentionBackwardKernel : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionBackwardKernel, MatchesTheInterpreterAndIsTheSameOnAnyThreadCount) {
  const Case& c = GetParam();
  Feeds feeds;
  const Graph fused = fused_with_grads(c, feeds, 7);
  ASSERT_EQ(count(fused, Op::fused_attention_backward), 1);
  const RunResult want = interpret(fused, feeds);
  const KernelGrads one = run_kernels(c, feeds, 1), two = run_kernels(c, feeds, 2), three = run_kernels(c, feeds, 3);
  const std::vector<float>* got[] = {&one.dq, &one.dk, &one.dv};
  const char* names[] = {"dq", "dk", "dv"};
  for (int t = 0; t < 3; ++t)
    EXPECT_LE(relative_error(want.outputs.at(names[t]).to_f32(), *got[t], names[t]), 1e-4) << names[t];
  expect_compiled_matches(fused, feeds);
  // Bit for bit whatever the thread count.
  EXPECT_EQ(one.dq, two.dq);
  EXPECT_EQ(one.dk, two.dk);
  EXPECT_EQ(one.dv, two.dv);
  EXPECT_EQ(one.dq, three.dq);
  EXPECT_EQ(one.dk, three.dk);
  EXPECT_EQ(one.dv, three.dv);
}

// bf16 storage (on vdpbf16ps where the host has AVX512-BF16 and the head widths are whole vectors:
// P and dS rounded to bf16 for the products; else computed in f32 from the widened values) against
// the f32 kernel on the same bf16 values: within a few of bf16's roundings (2⁻⁹ relative each: P
// or dS, the sums, each gradient's own), the same on any thread count.
TEST_P(AttentionBackwardKernel, Bf16FollowsTheF32KernelOnTheSameValues) {
  const Case& c = GetParam();
  Feeds feeds;
  (void)fused_with_grads(c, feeds, 7);
  for (const char* name : {"q", "k", "v", "probe"})
    feeds[name] = feeds.at(name).converted(DType::bf16).converted(DType::f32);
  const KernelGrads want = run_kernels(c, feeds, 2);
  const KernelGrads one = run_kernels(c, feeds, 1, DType::bf16), three = run_kernels(c, feeds, 3, DType::bf16);
  const std::vector<float>* w[] = {&want.dq, &want.dk, &want.dv};
  const std::vector<float>* got[] = {&one.dq, &one.dk, &one.dv};
  const std::vector<float>* got3[] = {&three.dq, &three.dk, &three.dv};
  const char* names[] = {"dq", "dk", "dv"};
  for (int t = 0; t < 3; ++t) {
    const double err = relative_error(*w[t], *got[t], names[t]);
    RecordProperty(std::string(names[t]) + "_error", std::to_string(err));
    EXPECT_LE(err, 1e-2) << names[t];
    EXPECT_EQ(*got[t], *got3[t]) << names[t] << ": 1 and 3 threads differ";
  }
}

std::vector<Case> kernel_cases() {
  std::vector<Case> v;
  v.push_back({.name = "plain", .batch = 1, .hkv = 2, .len_q = 70, .len_k = 130, .dk = 64, .dv = 64});
  v.push_back({.name = "small", .batch = 2, .hkv = 1, .len_q = 5, .len_k = 3, .dk = 4, .dv = 4});
  v.push_back({.name = "causal", .batch = 1, .hkv = 2, .len_q = 150, .len_k = 150, .dk = 32, .dv = 32, .causal = true});
  v.push_back({.name = "causal_top_left_l_lt_s",
               .batch = 1,
               .hkv = 1,
               .len_q = 40,
               .len_k = 200,
               .dk = 16,
               .dv = 16,
               .causal = true});
  v.push_back({.name = "causal_bottom_right_l_gt_s",
               .batch = 1,
               .hkv = 1,
               .len_q = 200,
               .len_k = 40,
               .dk = 16,
               .dv = 16,
               .causal = true,
               .align = CausalAlign::bottom_right});
  v.push_back(
      {.name = "key_padding", .batch = 4, .hkv = 1, .len_q = 33, .len_k = 7, .dk = 8, .dv = 8, .key_padding = true});
  v.push_back({.name = "dk_ne_dv_odd", .batch = 1, .hkv = 2, .len_q = 45, .len_k = 77, .dk = 40, .dv = 20});
  v.push_back({.name = "gqa", .batch = 1, .hkv = 2, .group = 3, .len_q = 50, .len_k = 90, .dk = 32, .dv = 32});
  v.push_back({.name = "mqa_causal",
               .batch = 2,
               .hkv = 1,
               .group = 4,
               .len_q = 66,
               .len_k = 66,
               .dk = 16,
               .dv = 16,
               .causal = true});
  v.push_back({.name = "scale", .batch = 1, .hkv = 1, .len_q = 20, .len_k = 100, .dk = 24, .dv = 24, .scale = 0.3});
  v.push_back({.name = "many_chunks", .batch = 1, .hkv = 1, .len_q = 64, .len_k = 700, .dk = 8, .dv = 8});
  v.push_back({.name = "softcap_causal",
               .batch = 1,
               .hkv = 2,
               .len_q = 70,
               .len_k = 70,
               .dk = 32,
               .dv = 32,
               .causal = true,
               .softcap = 2.0});
  v.push_back({.name = "dropout_causal",
               .batch = 2,
               .hkv = 2,
               .len_q = 70,
               .len_k = 90,
               .dk = 16,
               .dv = 24,
               .causal = true,
               .dropout = 0.3});
  v.push_back({.name = "dropout_gqa_whole_vectors",  // bf16: dropout on vdpbf16ps (dk, dv multiples of 16)
               .batch = 1,
               .hkv = 1,
               .group = 2,
               .len_q = 40,
               .len_k = 70,
               .dk = 32,
               .dv = 16,
               .dropout = 0.2});
  v.push_back({.name = "bias_softcap_gqa",
               .batch = 1,
               .hkv = 1,
               .group = 2,
               .len_q = 45,
               .len_k = 77,
               .dk = 16,
               .dv = 16,
               .bias = true,
               .softcap = 1.5});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionBackwardKernel, ::testing::ValuesIn(kernel_cases()),
                         [](const auto& test) { return test.param.name; });

TEST(AttentionBackwardKernelApi, RefusesWhatItDoesNotCover) {
  codegen::cpu::AttentionSpec s;
  s.dropout_p = 0.1;  // replayed
  EXPECT_EQ(codegen::cpu::backward_unsupported(s), "");
  s.storage = DType::bf16;
  EXPECT_EQ(codegen::cpu::backward_unsupported(s), "");
  s.storage = DType::f16;
  EXPECT_NE(codegen::cpu::backward_unsupported(s), "");
  codegen::cpu::AttentionBackwardArgs a;
  EXPECT_THROW(codegen::cpu::run_attention_backward(s, a), std::invalid_argument);
  s.storage = DType::f32;
  EXPECT_EQ(codegen::cpu::backward_unsupported(s), "");
}

}  // namespace
}  // namespace qkv::nn
