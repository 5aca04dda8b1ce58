// The pass pipeline (verify → canonicalize → fuse-attention → layout → cleanup) and the CPU
// executor, checked against the reference interpreter on the graphs the DSL's blocks build.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

#include <qkv/codegen/cpu/compiled_graph.hpp>
#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/jit.hpp>
#include <qkv/codegen/lowering/lifetimes.hpp>
#include <qkv/codegen/lowering/select.hpp>
#include <qkv/codegen/passes/canonicalize.hpp>
#include <qkv/codegen/passes/fuse_attention.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/codegen/passes/verify.hpp>
#include <qkv/dsl/grad.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/decoder_session.hpp>
#include <qkv/runtime/random_feeds.hpp>

#include "../support/cases.hpp"
#include "backend_cases.hpp"

using ::testing::HasSubstr;

namespace qkv::nn {
namespace {

const Node* find_op(const Graph& g, Op op) {
  for (const auto& n : g.nodes())
    if (n.op == op) return &n;
  return nullptr;
}

int count_op(const Graph& g, Op op) {
  int c = 0;
  for (const auto& n : g.nodes()) c += n.op == op;
  return c;
}

/// Every output of the CPU backend against the interpreter: max |a - b| <= tol * max(1, |b|).
void expect_backends_agree(const Graph& g, const Feeds& feeds, double tol = 2e-5) {
  const RunResult want = interpret(g, feeds);
  const RunResult got = codegen::cpu::run(g, feeds, 2);
  ASSERT_EQ(got.outputs.size(), want.outputs.size());
  for (const auto& [name, w] : want.outputs) {
    const NdArray& a = got.outputs.at(name);
    ASSERT_EQ(a.shape, w.shape) << name;
    const auto av = a.to_f32(), wv = w.to_f32();
    double err = 0;
    for (std::size_t i = 0; i < wv.size(); ++i) {
      if (std::isinf(wv[i]) || std::isnan(wv[i])) {  // the same infinity, or NaN where the reference has NaN
        EXPECT_TRUE(std::isnan(wv[i]) ? std::isnan(av[i]) : av[i] == wv[i]) << name << "[" << i << "] " << av[i];
        continue;
      }
      const double e =
          std::abs(static_cast<double>(av[i]) - wv[i]) / std::max(1.0, std::abs(static_cast<double>(wv[i])));
      err = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(err, e);  // a NaN is no match
    }
    EXPECT_LE(err, tol) << name;
  }
}

/// Runs `g` at 64 sequence lengths on the CPU backend; returns the LLVM modules compiled after the
/// first length (the first compiles the graph once). Every 16th length is checked against the
/// interpreter.
std::int64_t modules_after_first_length(const Graph& g, std::int64_t batch, bool key_axis) {
  std::int64_t first = -1;
  for (std::int64_t seq = 1; seq <= 64; ++seq) {
    Bindings sizes{{"Batch", batch}, {"Seq", seq}};
    if (key_axis) sizes["Key"] = seq;
    const Feeds feeds = random_feeds(g, sizes, static_cast<std::uint64_t>(seq), 0.5f);
    if (seq % 16 == 1) {
      expect_backends_agree(g, feeds, 5e-5);
    } else {
      (void)codegen::cpu::run(g, feeds, 2);
    }
    if (seq == 1) first = codegen::jit_stats().modules;
  }
  return codegen::jit_stats().modules - first;
}

TEST(Executor, CompilesOncePerShapeClassNotPerLength) {
  {  // a multi-head attention layer with padding, every size but the head width dynamic
    Graph g;
    auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<32>>>(g, "x");
    auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
    auto [out, w] = MultiHeadAttention<32, 4>::make(g, "mha.")(x, keep);
    output(out, "out");
    output(w, "weights");
    EXPECT_EQ(modules_after_first_length(g, 2, true), 0);
  }
  {  // an encoder layer (GEMMs, layer norms, GELU, residual adds) with a causal mask
    Graph g;
    auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<48>>>(g, "x");
    output(EncoderLayer<48, 3, 96, Activation::gelu>::make(g, "enc.")(x, causal_mask), "out");
    EXPECT_EQ(modules_after_first_length(g, 3, false), 0);
  }
  {  // the head width specialises: a new width is a new shape class
    const std::int64_t before = codegen::jit_stats().modules;
    for (std::int64_t e : {16, 24}) {
      Graph g;
      auto q = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Seq<dyn>, HeadDim<dyn>>>(g, "q");
      auto k = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Key<dyn>, HeadDim<dyn>>>(g, "k");
      auto v = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Key<dyn>, HeadDim<dyn>>>(g, "v");
      output(attention(q, k, v).first, "out");
      const Graph lowered = codegen::lower(g);
      EXPECT_THAT(codegen::cpu::specialised_sizes(lowered), ::testing::UnorderedElementsAre("Heads", "HeadDim"));
      for (std::int64_t seq : {3, 9, 17})
        (void)codegen::cpu::run(
            g, random_feeds(g, {{"Batch", 1}, {"Heads", 2}, {"Seq", seq}, {"Key", seq}, {"HeadDim", e}}, 5), 2);
    }
    EXPECT_EQ(codegen::jit_stats().modules - before, 2);
  }
}

TEST(Verify, LaidOutGrammarChecksTheKernelsOperandOrders) {
  const auto c = cases::mha_with_padding_and_weights({5, 3, 1});
  Graph lowered = codegen::lower(c.graph);
  EXPECT_THAT(codegen::verify(lowered, codegen::Stage::laid_out), ::testing::IsEmpty());
  // The same graph with the fused node's output axes swapped: still a valid graph, but not the
  // layout the kernel writes.
  Graph broken;
  for (Node n : lowered.nodes()) {
    if (n.op == Op::fused_attention) std::swap(n.axes[n.axes.size() - 1], n.axes[n.axes.size() - 2]);
    broken.add(std::move(n));
  }
  for (const auto& o : lowered.outputs()) broken.mark_output(o.node, o.name);
  const auto problems = codegen::verify(broken, codegen::Stage::laid_out);
  ASSERT_FALSE(problems.empty());
  EXPECT_THAT(problems.front(), HasSubstr("(fused_attention): the output is"));
  EXPECT_THAT(problems.front(), HasSubstr("not laid out as"));
}

TEST(Verify, AcceptsDslGraphsAndNamesTheBrokenNode) {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  output(MultiHeadAttention<16, 2>::make(g)(x).first, "out");
  EXPECT_TRUE(codegen::verify(g).empty());

  Graph bad;
  Node in;
  in.op = Op::input;
  in.name = "x";
  in.axes = {{"A", Extent::fixed(2)}};
  bad.add(in);
  Node r;
  r.op = Op::relu;
  r.inputs = {0};
  r.axes = {{"B", Extent::fixed(2)}};
  bad.add(r);
  const auto problems = codegen::verify(bad);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_THAT(problems[0], HasSubstr("%1 (relu): changes the axes of its input [A=2]"));
  EXPECT_THROW(codegen::verify_or_throw(bad, "test"), std::logic_error);
}

TEST(Canonicalize, FoldsPermuteChainsScalesAndDeadNodes) {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<3>, Model<4>>>(g, "x");
  auto y = permute<Batch, Seq, Model>(permute<Model, Seq, Batch>(permute<Seq, Batch, Model>(x)));  // back to x
  auto z = scale(scale(y, 2.0), 3.0);
  auto unused = relu(x);
  (void)unused;
  output(z, "z");
  const Graph c = codegen::canonicalize(g);
  EXPECT_EQ(count_op(c, Op::permute), 0);
  EXPECT_EQ(count_op(c, Op::relu), 0);
  ASSERT_EQ(count_op(c, Op::scale), 1);
  EXPECT_DOUBLE_EQ(find_op(c, Op::scale)->scalar, 6.0);
  const Feeds f = random_feeds(g, {}, 1);
  EXPECT_EQ(interpret(g, f).outputs.at("z"), interpret(c, f).outputs.at("z"));
}

TEST(FuseAttention, MultiHeadAttentionBecomesOneNodeWithItsRoles) {
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<16>>>(g, "x");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  auto [out, w] = MultiHeadAttention<16, 2>::make(g)(x, keep);
  output(out, "out");
  output(w, "weights");
  std::ostringstream log;
  const Graph lowered =
      codegen::lower(g, {.dump_after = "fuse-attention", .time_passes = true, .verify_each = true, .log = &log});
  EXPECT_THAT(log.str(), HasSubstr("--- after fuse-attention ---"));
  EXPECT_THAT(log.str(), HasSubstr("pass layout:"));
  EXPECT_EQ(count_op(lowered, Op::fused_attention), 1);
  EXPECT_EQ(count_op(lowered, Op::softmax), 0);
  EXPECT_EQ(count_op(lowered, Op::attention_weights), 1);
  const AttentionAttrs& a = *find_op(lowered, Op::fused_attention)->attention;
  EXPECT_EQ(a.batch, (std::vector<std::string>{"Batch"}));
  EXPECT_EQ(a.heads, (std::vector<std::string>{"Heads"}));
  EXPECT_TRUE(a.group.empty());
  EXPECT_EQ(a.query, "Seq");
  EXPECT_EQ(a.key, "Key");
  EXPECT_EQ(a.dk, "HeadDim");
  EXPECT_DOUBLE_EQ(a.scale, 1.0 / std::sqrt(8.0));
  EXPECT_TRUE(a.write_weights);
  EXPECT_EQ(find_op(lowered, Op::fused_attention)->inputs.size(), 4u);  // q, k, v, key padding
}

TEST(FuseAttention, GroupedQueryAttentionKeepsItsGroups) {
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<32>>>(g, "x");
  output(GroupedQueryAttention<32, 4, 2>::make(g)(x).first, "out");
  const Graph lowered = codegen::lower(g);
  ASSERT_EQ(count_op(lowered, Op::fused_attention), 1);
  const AttentionAttrs& a = *find_op(lowered, Op::fused_attention)->attention;
  EXPECT_EQ(a.heads, (std::vector<std::string>{"KvHeads"}));
  EXPECT_EQ(a.group, (std::vector<std::string>{"Group"}));
}

TEST(FuseAttention, APerHeadBiasFusesAsALoadOfTheModExpression) {
  // A bias over [Heads, Seq, Key] once left the chain unfused; every mask over the score axes is
  // now a load in the fused node's mod expression.
  const auto c = cases::mha_with_per_head_bias();
  EXPECT_EQ(codegen::cpu::fused_attention_count(c.graph), 1);
  expect_backends_agree(c.graph, c.feeds);
}

TEST(FuseAttention, AModThatReadsNoPositionTakesTheAlignmentOfTheOneThatDoes) {
  // A softcap (no positions, aligned top-left by default) and then ALiBi aligned bottom-right on
  // L != S: one mod expression, the ALiBi's alignment. They were once left unfused.
  Graph g;
  auto q = input<Tensor<f32, Batch<dyn>, Heads<2>, Seq<dyn>, HeadDim<16>>>(g, "q");
  auto k = input<Tensor<f32, Batch<dyn>, Heads<2>, Key<dyn>, HeadDim<16>>>(g, "k");
  auto v = input<Tensor<f32, Batch<dyn>, Heads<2>, Key<dyn>, HeadDim<16>>>(g, "v");
  auto s = scaled(contract<HeadDim>(q, k));
  s = decltype(s)(g, modded(s, mods::softcap(5.0)).id());
  s = decltype(s)(g, modded(s, mods::alibi(input<Tensor<f32, Heads<2>>>(g, "slopes"), bottom_right)).id());
  output(contract<Key>(softmax<Key>(s), v), "out");
  const Feeds feeds = random_feeds(g, {{"Batch", 2}, {"Seq", 9}, {"Key", 14}}, 3);
  ASSERT_EQ(codegen::cpu::fused_attention_count(g), 1) << g.table();
  EXPECT_EQ(find_op(codegen::lower(g), Op::fused_attention)->attention->mod.align, CausalAlign::bottom_right);
  expect_backends_agree(g, feeds);
}

TEST(FuseAttention, ALogSumExpBesideTheSoftmaxIsWrittenByTheKernel) {
  // logsumexp<Key> of the softmax's input: an attention_lse node reading the fused node (laid
  // out as the kernel writes it), whichever of the two the program traced first.
  for (const bool lse_first : {false, true}) {
    Graph g;
    auto q = input<Tensor<f32, Batch<dyn>, Heads<2>, Seq<dyn>, HeadDim<16>>>(g, "q");
    auto k = input<Tensor<f32, Batch<dyn>, Heads<2>, Key<dyn>, HeadDim<16>>>(g, "k");
    auto v = input<Tensor<f32, Batch<dyn>, Heads<2>, Key<dyn>, HeadDim<16>>>(g, "v");
    auto s = modded(scaled(contract<HeadDim>(q, k)), mods::causal(bottom_right));
    if (lse_first) output(permute<Batch, Seq, Heads>(logsumexp<Key>(s)), "lse");
    output(contract<Key>(softmax<Key>(s), v), "out");
    if (!lse_first) output(permute<Batch, Seq, Heads>(logsumexp<Key>(s)), "lse");
    const Graph lowered = codegen::lower(g);
    ASSERT_EQ(count_op(lowered, Op::fused_attention), 1) << lowered.table();
    ASSERT_EQ(count_op(lowered, Op::attention_lse), 1) << lowered.table();
    EXPECT_EQ(count_op(lowered, Op::logsumexp), 0) << lowered.table();
    EXPECT_TRUE(find_op(lowered, Op::fused_attention)->attention->write_lse);
    // L > S, bottom-right: the first L - S queries see no key (lse -inf).
    expect_backends_agree(g, random_feeds(g, {{"Batch", 2}, {"Seq", 23}, {"Key", 17}}, 31));
  }
}

TEST(CpuBackend, LogSumExpOutsideAnAttention) {
  // Over the contiguous axis and over a strided one, with rows that are all -inf.
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Key<dyn>>>(g, "x");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  auto visible = masked(x, keep);
  output(logsumexp<Key>(visible), "over_keys");
  output(logsumexp<Seq>(visible), "over_queries");
  Feeds feeds = random_feeds(g, {{"Batch", 2}, {"Seq", 7}, {"Key", 12}}, 32);
  NdArray kept = NdArray::zeros(DType::boolean, {2, 12});
  for (std::size_t j = 0; j < 12; ++j) kept.bytes[j] = std::byte{j != 3};  // batch 1 keeps no key
  feeds["keep"] = kept;
  expect_backends_agree(g, feeds);
  const RunResult r = interpret(g, feeds);
  EXPECT_TRUE(std::isinf(r.outputs.at("over_keys").to_f32()[7]));  // batch 1, query 0
}

TEST(BufferPlan, ReusesDeadIntermediates) {
  Graph g;
  auto x = input<Tensor<f32, Seq<dyn>, Model<64>>>(g, "x");
  output(relu(relu(relu(relu(x)))), "y");
  const auto plan = codegen::plan_buffers(g, {{"Seq", 10}});
  EXPECT_EQ(plan.unshared_bytes, 4u * 10 * 64 * 4);
  EXPECT_EQ(plan.peak_bytes, 2u * 10 * 64 * 4);  // two buffers ping-pong
}

// --- the CPU backend against the interpreter ----------------------------------------------------

TEST(CpuBackend, MultiHeadAttentionWithPaddingAndWeights) {
  const auto c = cases::mha_with_padding_and_weights({33, 7, 1});
  EXPECT_EQ(codegen::cpu::fused_attention_count(c.graph), 1);
  expect_backends_agree(c.graph, c.feeds);
}

TEST(CpuBackend, CausalBottomRightOnUnequalLengths) {
  const auto c = cases::causal_bottom_right_on_unequal_lengths();
  EXPECT_EQ(codegen::cpu::fused_attention_count(c.graph), 1);
  expect_backends_agree(c.graph, c.feeds);
}

TEST(CpuBackend, GroupedQueryAttention) {
  const auto c = cases::grouped_query_causal();
  expect_backends_agree(c.graph, c.feeds);
}

TEST(CpuBackend, DropoutMasksAreIdentical) {
  const auto c = cases::dropout_with_weights();
  EXPECT_EQ(codegen::cpu::fused_attention_count(c.graph), 1);
  const auto want = interpret(c.graph, c.feeds).outputs.at("weights").to_f32();
  const auto got = codegen::cpu::run(c.graph, c.feeds, 2).outputs.at("weights").to_f32();
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(want[i] == 0.0f, got[i] == 0.0f) << i;
  expect_backends_agree(c.graph, c.feeds);
}

TEST(CpuBackend, TinyLlamaMatchesTheInterpreter) {
  const auto c = cases::tiny_llama();
  EXPECT_EQ(codegen::cpu::fused_attention_count(c.graph), 2);
  expect_backends_agree(c.graph, c.feeds, 5e-5);
}

/// The tiny Llama's weights (the params of its full-forward graph) as a session's feeds.
Feeds tiny_llama_weights(const cases::GraphCase& c) {
  Feeds w;
  for (const auto& n : c.graph.nodes())
    if (n.op == Op::param) w[n.name] = c.feeds.at(n.name);
  return w;
}

/// Logits [B, n, V] of a session, row by row, against the full forward's rows [from, from + n).
double max_row_error(const NdArray& step, const NdArray& full, std::int64_t from) {
  const auto s = step.as<float>(), f = full.as<float>();
  const std::int64_t B = step.shape[0], n = step.shape[1], V = step.shape[2], L = full.shape[1];
  double err = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t v = 0; v < V; ++v) {
        const double x = s[static_cast<std::size_t>((b * n + t) * V + v)];
        const double y = f[static_cast<std::size_t>((b * L + from + t) * V + v)];
        const double e = std::abs(x - y) / std::max(1.0, std::abs(y));
        err = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(err, e);  // a NaN is no match
      }
  return err;
}

/// The columns [from, from + n) of ids [B, L], as [B, n].
NdArray columns(const NdArray& ids, std::int64_t from, std::int64_t n) {
  const std::int64_t B = ids.shape[0], L = ids.shape[1];
  NdArray out = NdArray::zeros(DType::i64, {B, n});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < n; ++t)
      out.as<std::int64_t>()[static_cast<std::size_t>(b * n + t)] =
          ids.as<std::int64_t>()[static_cast<std::size_t>(b * L + from + t)];
  return out;
}

TEST(DecoderSession, IncrementalDecodingGivesTheFullForwardsLogits) {
  auto c = cases::tiny_llama();
  const NdArray tokens = cases::int_feed(2, 9, 50, 12);
  c.feeds["tokens"] = tokens;
  c.feeds["positions"] = cases::int_feed(2, 9, 0, 0, 0);
  for (int backend = 0; backend < 2; ++backend) {
    DecoderSession::Runner runner;
    const codegen::cpu::BoundRunner bound(2);
    if (backend == 1) runner = bound;  // the weights packed once, the caches written in place
    const NdArray full = backend ? codegen::cpu::run(c.graph, c.feeds, 2).outputs.at("out")
                                 : interpret(c.graph, c.feeds).outputs.at("out");
    DecoderSession s(cases::tiny_llama_step(), tiny_llama_weights(c),
                     {.layers = 2, .kv_heads = 2, .head_dim = 8, .batch = 2, .capacity = 9}, runner);
    // A prefill of 4, a step of 2 (speculative-style), then one token at a time.
    EXPECT_LE(max_row_error(s.prefill(columns(tokens, 0, 4)), full, 0), backend ? 1e-5 : 0.0);
    EXPECT_LE(max_row_error(s.decode(columns(tokens, 4, 2)), full, 4), backend ? 1e-5 : 0.0);
    std::int64_t modules = codegen::jit_stats().modules;
    for (std::int64_t t = 6; t < 9; ++t) {
      EXPECT_LE(max_row_error(s.decode(columns(tokens, t, 1)), full, t), backend ? 1e-5 : 0.0) << t;
      if (t == 6) modules = codegen::jit_stats().modules;  // the first one-token step compiles its shape class
    }
    EXPECT_EQ(codegen::jit_stats().modules, modules) << "decode steps after the first compile nothing";
    if (backend == 1) {
      EXPECT_EQ(bound.prepared(), 1) << "one handle for the weights, packed once";
    }
    EXPECT_EQ(s.position(), 9);
    try {
      (void)s.decode(columns(tokens, 0, 1));
      ADD_FAILURE() << "no error past the capacity";
    } catch (const InputError& e) {
      EXPECT_THAT(e.what(), HasSubstr("1 more token(s) after position 9 exceed the cache's capacity of 9 positions"));
    }
    EXPECT_EQ(s.position(), 9);
    s.reset();
    EXPECT_EQ(s.position(), 0);
    EXPECT_LE(max_row_error(s.decode(columns(tokens, 0, 3)), full, 0), backend ? 1e-5 : 0.0);
  }
}

TEST(DecoderSession, ALastPositionStepGivesTheFullForwardsLastRow) {
  // StepLogits::last_position (what qkv generate declares): the LM head on each step's last row.
  auto c = cases::tiny_llama();
  const NdArray tokens = cases::int_feed(2, 9, 50, 12);
  c.feeds["tokens"] = tokens;
  c.feeds["positions"] = cases::int_feed(2, 9, 0, 0, 0);
  Graph step;
  declare_cached_step<StepLogits::last_position>(step, CausalLm<32>::make(step, cases::tiny_llama_config()));
  for (int backend = 0; backend < 2; ++backend) {
    const codegen::cpu::BoundRunner bound(2);
    const NdArray full = backend ? codegen::cpu::run(c.graph, c.feeds, 2).outputs.at("out")
                                 : interpret(c.graph, c.feeds).outputs.at("out");
    DecoderSession s(step, tiny_llama_weights(c),
                     {.layers = 2, .kv_heads = 2, .head_dim = 8, .batch = 2, .capacity = 9},
                     backend ? DecoderSession::Runner(bound) : DecoderSession::Runner());
    const NdArray first = s.prefill(columns(tokens, 0, 4));
    EXPECT_EQ(first.shape, (std::vector<std::int64_t>{2, 1, 50}));
    EXPECT_LE(max_row_error(first, full, 3), backend ? 1e-5 : 0.0);
    EXPECT_LE(max_row_error(s.decode(columns(tokens, 4, 2)), full, 5), backend ? 1e-5 : 0.0);
    EXPECT_LE(max_row_error(s.decode(columns(tokens, 6, 1)), full, 6), backend ? 1e-5 : 0.0);
  }
}

TEST(DecoderSession, Bf16IncrementalDecodingGivesTheFullForwardsLogits) {
  // The tiny Llama with head width 16 (whole vectors: the split-KV decode kernel runs the steps
  // of <= 4 tokens, the fused kernel the full forward of 9), moved to bf16 as a whole: weights,
  // activations and the KV cache bf16, read in place by the decode kernel.
  LlamaConfig cfg = cases::tiny_llama_config();
  cfg.attention.heads = 2;
  cfg.attention.kv_heads = 1;
  cfg.attention.head_dim = 16;
  Graph full32;
  {
    const auto model = CausalLm<32>::make(full32, cfg);
    auto tokens = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(full32, "tokens");
    auto positions = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(full32, "positions");
    output(model(tokens, positions), "out");
  }
  Graph step32;
  declare_cached_step(step32, CausalLm<32>::make(step32, cfg));
  const Graph full = with_float_dtype(full32, DType::bf16), step = with_float_dtype(step32, DType::bf16);
  cases::GraphCase c{.graph = full32, .feeds = {}};
  c.feeds = random_feeds(
      full32, {{"Batch", 2}, {"Seq", 9}, {"Vocab", 50}, {"Hidden", 64}, {"QProj", 32}, {"KvProj", 16}}, 7, 0.5f);
  const NdArray tokens = cases::int_feed(2, 9, 50, 12);
  c.feeds["tokens"] = tokens;
  c.feeds["positions"] = cases::int_feed(2, 9, 0, 0, 0);
  Feeds weights = tiny_llama_weights(c), feeds16 = c.feeds;
  for (auto* f : {&weights, &feeds16})
    for (auto& [name, a] : *f)
      if (a.dtype == DType::f32) a = a.converted(DType::bf16);
  const NdArray want = codegen::cpu::run(full, feeds16, 2).outputs.at("out").converted(DType::f32);
  ASSERT_EQ(codegen::cpu::run(full, feeds16, 2).outputs.at("out").dtype, DType::bf16);
  // The scale of bf16's own error here: the bf16 full forward against the f32 one.
  const double dtype_error = max_row_error(want, codegen::cpu::run(full32, c.feeds, 2).outputs.at("out"), 0);
  const codegen::cpu::BoundRunner bound(2);
  DecoderSession s(step, weights, {.layers = 2, .kv_heads = 1, .head_dim = 16, .batch = 2, .capacity = 9}, bound);
  std::vector<double> errors;
  auto check = [&](const NdArray& logits, std::int64_t from) {
    ASSERT_EQ(logits.dtype, DType::bf16);
    errors.push_back(max_row_error(logits.converted(DType::f32), want, from));
  };
  check(s.prefill(columns(tokens, 0, 4)), 0);
  check(s.decode(columns(tokens, 4, 2)), 4);
  for (std::int64_t t = 6; t < 9; ++t) check(s.decode(columns(tokens, t, 1)), t);
  const double worst = *std::max_element(errors.begin(), errors.end());
  RecordProperty("incremental_error", std::to_string(worst));
  RecordProperty("bf16_vs_f32_error", std::to_string(dtype_error));
  // Both sides round every activation to bf16 (u = 2^-8), from sums taken in other orders (the
  // decode kernel keeps P f32; the fused kernel rounds it): a few bf16 ulps of the logits, of
  // the order bf16 itself moves them from f32 (measured: 0.0117 = 1.5 ulps, against 0.0096).
  EXPECT_LE(worst, 4.0 / 128);
  EXPECT_LE(worst, 2 * dtype_error) << "bf16 vs f32: " << dtype_error;
}

TEST(CpuBackend, KvCacheAppendWritesOnlyTheStepsRowsAndAttendsTheCacheInPlace) {
  const Graph g = test::cached_attention_layer();
  const Graph lowered = codegen::lower(g);
  EXPECT_EQ(count_op(lowered, Op::fused_attention), 1);
  EXPECT_EQ(count_op(lowered, Op::update_slice), 2);
  for (std::int64_t seq : {1, 3, 7}) {  // the split-KV decode kernel (<= 4 queries) and the fused one
    SCOPED_TRACE("seq " + std::to_string(seq));
    const std::int64_t past = 10, slots = 24;
    Feeds f = random_feeds(g,
                           {{"Batch", 2},
                            {"Seq", seq},
                            {"Slot", slots},
                            {"Past", past},
                            {"KvHeads", 2},
                            {"HeadDim", 8},
                            {"QProj", 32},
                            {"KvProj", 16}},
                           31 + static_cast<unsigned>(seq), 0.5f);
    f["positions"] = cases::int_feed(2, seq, 1, 0, past);
    // Positions past the step's rows hold NaN: an attention that read them would return NaN.
    for (const char* name : {"cache_k", "cache_v"}) {
      auto c = f[name].as<float>();
      for (std::size_t i = 0; i < c.size(); ++i)
        if (static_cast<std::int64_t>(i / 8) % slots >= past + seq) c[i] = std::nanf("");
    }
    const RunResult want = interpret(g, f);
    expect_backends_agree(g, f, 2e-5);

    // The caches as their own destinations: written in place.
    const Feeds before = f;
    RunResult got = codegen::cpu::run(g, f, 2, {{"present_k", &f["cache_k"]}, {"present_v", &f["cache_v"]}});
    EXPECT_EQ(got.outputs.count("present_k"), 0u);
    EXPECT_LE(max_row_error(got.outputs.at("out"), want.outputs.at("out"), 0), 2e-5);
    for (const char* name : {"k", "v"}) {
      const auto now = f.at(std::string("cache_") + name).as<float>();
      const auto old = before.at(std::string("cache_") + name).as<float>();
      const auto ref = want.outputs.at(std::string("present_") + name).as<float>();
      for (std::size_t i = 0; i < now.size(); ++i) {
        const std::int64_t row = static_cast<std::int64_t>(i / 8) % slots;
        if (row < past || row >= past + seq)  // untouched, bit for bit (NaN stays NaN)
          ASSERT_EQ(std::memcmp(&now[i], &old[i], 4), 0) << name << " " << i;
        else
          ASSERT_NEAR(now[i], ref[i], 2e-5) << name << " " << i;
      }
    }
  }
  // Past + Seq beyond the capacity: the compiled graph refuses the sizes; so does the interpreter.
  Feeds f = random_feeds(g,
                         {{"Batch", 1},
                          {"Seq", 3},
                          {"Slot", 8},
                          {"Past", 6},
                          {"KvHeads", 2},
                          {"HeadDim", 8},
                          {"QProj", 32},
                          {"KvProj", 16}},
                         5);
  f["positions"] = cases::int_feed(1, 3, 1, 0, 6);
  EXPECT_THROW((void)codegen::cpu::run(g, f, 2), ShapeError);
  try {
    (void)interpret(g, f);
    ADD_FAILURE() << "no error past the capacity";
  } catch (const ShapeError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rows [6, 9) do not fit `Slot`, which holds 8"));
  }
}

TEST(CpuBackend, DecoderOpsOnTheirOwn) {
  // rms_norm over a non-contiguous axis, silu, rope with positions over the sequence only, argmax.
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Model<24>, Seq<dyn>>>(g, "x");
  auto q = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Heads<3>, HeadDim<10>>>(g, "q");
  auto pos = input<Tensor<i32, Seq<dyn>>>(g, "pos");
  output(rms_norm(x, rms_norm_params<Model<24>>(g, "norm", 1e-5)), "norm");
  output(silu(x), "silu");
  output(rope<HeadDim, Seq>(q, pos, {.theta = 500.0}), "rope");
  output(argmax<Model>(x), "argmax");
  Feeds feeds = random_feeds(g, {{"Batch", 2}, {"Seq", 7}}, 21, 3.0f);
  NdArray p = NdArray::zeros(DType::i32, {7});
  for (int i = 0; i < 7; ++i) p.as<std::int32_t>()[static_cast<std::size_t>(i)] = 1000 * i * i;  // up to 36000
  feeds["pos"] = p;
  expect_backends_agree(g, feeds, 2e-5);
}

TEST(CpuBackend, LinearLayersWithAFewRowsReadTheirWeightsInPlace) {
  // Rows 1..4 take the GEMV kernel (one variant per row count up to 2, then 4), 5 the packed
  // GEMM; K = 37 and 16 end mid-vector and on it, N = 45 and 3 mid output group, with and
  // without a bias.
  Graph g;
  auto x = input<Tensor<f32, Seq<dyn>, Model<37>>>(g, "x");
  auto z = input<Tensor<f32, Seq<dyn>, HeadDim<16>>>(g, "z");
  output(linear(x, linear_params<Model<37>, Hidden<45>>(g, "a")), "a");
  output(linear(x, linear_params<Model<37>, Hidden<3>>(g, "b", /*bias=*/false)), "b");
  output(linear(z, linear_params<HeadDim<16>, Hidden<45>>(g, "c")), "c");
  for (std::int64_t rows : {1, 2, 3, 4, 5}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    expect_backends_agree(g, random_feeds(g, {{"Seq", rows}}, 40 + static_cast<unsigned>(rows), 1.0f), 2e-5);
  }
}

TEST(CpuBackend, AConv1DLinearIsTheLinearOfTheTransposedWeightOnTheGemm) {
  // Hugging Face's Conv1D (GPT-2): the weight stored [in, out]. The same values as torch.nn.Linear
  // with W transposed, on the interpreter and the CPU backend, at 1 row (GEMV) and 9 (GEMM); the
  // lowered graph runs it as a strided copy of W and the GEMM kernel, no contraction loop nest.
  Graph g;
  auto x = input<Tensor<f32, Seq<dyn>, Model<37>>>(g, "x");
  const auto conv = conv1d_params<Model<37>, Hidden<45>>(g, "c_attn");
  output(linear(x, conv), "conv1d");
  output(linear(x, linear_params<Model<37>, Hidden<45>>(g, "linear")), "linear");
  const Graph lowered = codegen::lower(g);
  int gemms = 0, loops = 0;
  for (int id = 0; id < static_cast<int>(lowered.size()); ++id) {
    gemms += codegen::select_kernel(lowered, id) == codegen::KernelKind::gemm;
    loops += codegen::select_kernel(lowered, id) == codegen::KernelKind::contract ||
             codegen::select_kernel(lowered, id) == codegen::KernelKind::linear_strided;
  }
  EXPECT_EQ(gemms, 2);
  EXPECT_EQ(loops, 0);
  for (std::int64_t rows : {1, 9}) {
    Feeds f = random_feeds(g, {{"Seq", rows}}, 60 + static_cast<unsigned>(rows), 1.0f);
    ASSERT_EQ(f.at("c_attn.weight").shape, (std::vector<std::int64_t>{37, 45}));  // as GPT-2 stores it
    // The same layer as a Linear: W transposed into [out, in], the same bias.
    const auto wt = f.at("c_attn.weight").to_f32();
    std::vector<float> w(wt.size());
    for (std::size_t i = 0; i < 37; ++i)
      for (std::size_t o = 0; o < 45; ++o) w[o * 37 + i] = wt[i * 45 + o];
    f["linear.weight"] = NdArray::from_f32(w, {45, 37});
    f["linear.bias"] = f.at("c_attn.bias");
    const RunResult want = interpret(g, f);
    EXPECT_EQ(want.outputs.at("conv1d"), want.outputs.at("linear")) << "rows " << rows;
    expect_backends_agree(g, f, 2e-5);
  }
}

/// Contractions of x [Batch, Seq, Model], y [Batch, Seq, Hidden], w [Hidden, Model] and v [Model,
/// Hidden] of dtype DT in every operand layout the GEMM path reads; returns x and y.
template <class DT>
auto contraction_layouts(Graph& g) {
  auto x = input<Tensor<DT, Batch<3>, Seq<100>, Model<14>>>(g, "x");
  auto y = input<Tensor<DT, Batch<3>, Seq<100>, Hidden<37>>>(g, "y");
  auto w = input<Tensor<DT, Hidden<37>, Model<14>>>(g, "w");
  auto v = input<Tensor<DT, Model<14>, Hidden<37>>>(g, "v");
  output(contract<Batch, Seq>(x, y), "k_leading");     // [Model, Hidden]: A [K, M], B [K, N]
  output(contract<Model>(x, w), "rows");               // [Batch, Seq, Hidden]: A [M, K], B [N, K]
  output(contract<Model>(v, x), "columns_then_rows");  // [Hidden, Batch, Seq]: A [K, M], B [N, K]
  output(contract<Seq>(x, y), "batched");              // [Batch, Model, Hidden]: copies
  return std::pair{x, y};
}

TEST(CpuBackend, ContractionsOnTheGemmReadTheirOperandsInEveryLayout) {
  // The GEMM path reads an operand where it is when it is a matrix: A as [M, K] rows or [K, M]
  // (a weight's gradient, Σ over Batch and Seq), B as [N, K] or [K, N], C into [M, N]; a batch
  // axis (Batch in both) copies. M = 14 and N = 37 leave partial tiles (of 2 rows) and panels; K = 300
  // crosses a K block. Sums of a fill (a bias's gradient: columns; a norm's: rows) beside them.
  Graph g;
  const auto [x, y] = contraction_layouts<f32>(g);
  output(sum<Batch, Seq>(x), "column_sums");  // contract(x, fill of ones)
  output(sum<Hidden>(y), "row_sums");
  auto z = input<Tensor<f32, Batch<2>, Seq<3>, Vocab<300>>>(g, "z");
  output(sum<Batch, Seq>(z), "wide_column_sums");  // more outputs than one task sums
  expect_backends_agree(g, random_feeds(g, {}, 81, 1.0f));
}

TEST(CpuBackend, Bf16ContractionsRunOnTheBf16GemmInEveryLayout) {
  // The same layouts in bf16 (a bf16 model's backward: dX = dY·W, dW = Σ dYᵀ·X, a bias's Σ dY):
  // legalize-dtypes leaves both operands bf16 for the GEMM kernel (vdpbf16ps where the host has
  // it; widened otherwise), which packs A from rows or from columns and Bᵀ's panels from [N, K] or
  // [K, N], and x bf16 for a fill's sums; the f32 value is rounded once. Against the interpreter:
  // one bf16 rounding of the output.
  Graph g;
  const auto [x, y] = contraction_layouts<bf16>(g);
  output(sum<Batch, Seq>(x), "column_sums");  // a fill's sums: x read as stored
  output(sum<Hidden>(y), "row_sums");
  auto o = input<Tensor<bf16, Seq<7>, Model<13>>>(g, "o");
  auto p = input<Tensor<bf16, Seq<7>, Hidden<5>>>(g, "p");
  output(contract<Seq>(o, p), "odd_k");  // K = 7: the last pair's second half is zero
  const Graph lowered = codegen::lower(g);
  for (int id = 0; id < static_cast<int>(lowered.size()); ++id) {
    const Node& n = lowered.node(id);
    if (n.op != Op::contract) continue;
    for (int in : n.inputs) EXPECT_NE(lowered.node(in).op, Op::convert) << "operands widened before the kernel";
  }
  expect_backends_agree(g, random_feeds(g, {}, 82, 1.0f), 1e-2);
}

TEST(CpuBackend, SliceSelectArangeAndPrependMatchTheirDefinitions) {
  // Issue 31 item 2 on the interpreter and the CPU backend: a slice at an element start, a select
  // of the first and of the last axis, position ids as a value, a CLS token put before every
  // sequence; a slice past the end of a dynamic axis is a shape error on both.
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<8>>>(g, "x");
  auto ids = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "ids");
  auto cls = input<Tensor<f32, Seq<1>, Model<8>>>(g, "cls");
  output(slice<Seq, 2, 3>(x), "slice");
  output(last<Seq>(x), "last_position");  // a run-time axis: from Seq - 1
  output(last<Model>(x), "last_feature_kept");
  output(select<Seq, 0>(x), "first");
  output(select<Model, 7>(x), "last_feature");
  output(arange<Seq>(ids), "positions");
  output(prepend<Seq>(x, cls), "with_cls");
  output(broadcast_like(select<Seq, 0>(cls), x), "cls_everywhere");  // [Model] over [Batch, Seq, Model]
  const Feeds f = random_feeds(g, {{"Batch", 2}, {"Seq", 6}}, 71, 1.0f);
  const RunResult r = interpret(g, f);
  const auto xv = f.at("x").to_f32(), cv = f.at("cls").to_f32();
  auto at = [&](std::int64_t b, std::int64_t t, std::int64_t m) {
    return xv[static_cast<std::size_t>((b * 6 + t) * 8 + m)];
  };
  const auto sl = r.outputs.at("slice").to_f32(), first = r.outputs.at("first").to_f32(),
             last = r.outputs.at("last_feature").to_f32(), pos = r.outputs.at("positions").to_f32(),
             wc = r.outputs.at("with_cls").to_f32(), every = r.outputs.at("cls_everywhere").to_f32();
  EXPECT_EQ(r.outputs.at("slice").shape, (std::vector<std::int64_t>{2, 3, 8}));
  EXPECT_EQ(r.outputs.at("last_position").shape, (std::vector<std::int64_t>{2, 1, 8}));
  EXPECT_EQ(r.outputs.at("last_feature_kept").shape, (std::vector<std::int64_t>{2, 6, 1}));
  const auto lp = r.outputs.at("last_position").to_f32(), lf = r.outputs.at("last_feature_kept").to_f32();
  EXPECT_EQ(r.outputs.at("first").shape, (std::vector<std::int64_t>{2, 8}));
  EXPECT_EQ(r.outputs.at("last_feature").shape, (std::vector<std::int64_t>{2, 6}));
  static_assert(std::is_same_v<decltype(arange<Seq>(ids))::dtype, i64>, "positions are integers");
  EXPECT_EQ(r.outputs.at("with_cls").shape, (std::vector<std::int64_t>{2, 7, 8}));
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t m = 0; m < 8; ++m) {
      for (std::int64_t t = 0; t < 3; ++t)
        EXPECT_EQ(sl[static_cast<std::size_t>((b * 3 + t) * 8 + m)], at(b, 2 + t, m));
      EXPECT_EQ(first[static_cast<std::size_t>(b * 8 + m)], at(b, 0, m));
      EXPECT_EQ(lp[static_cast<std::size_t>(b * 8 + m)], at(b, 5, m));
      EXPECT_EQ(wc[static_cast<std::size_t>((b * 7) * 8 + m)], cv[static_cast<std::size_t>(m)]);
      for (std::int64_t t = 0; t < 6; ++t) {
        EXPECT_EQ(wc[static_cast<std::size_t>((b * 7 + 1 + t) * 8 + m)], at(b, t, m));
        EXPECT_EQ(every[static_cast<std::size_t>((b * 6 + t) * 8 + m)], cv[static_cast<std::size_t>(m)]);
        if (m == 0) {
          EXPECT_EQ(last[static_cast<std::size_t>(b * 6 + t)], at(b, t, 7));
          EXPECT_EQ(lf[static_cast<std::size_t>(b * 6 + t)], at(b, t, 7));
          EXPECT_EQ(pos[static_cast<std::size_t>(b * 6 + t)], static_cast<float>(t));
        }
      }
    }
  expect_backends_agree(g, f, 0.0);
  // Seq = 4: [2, 5) is past its end.
  const Feeds short_f = random_feeds(g, {{"Batch", 2}, {"Seq", 4}}, 72, 1.0f);
  for (int backend : {0, 1}) {
    try {
      (void)(backend ? codegen::cpu::run(g, short_f, 2) : interpret(g, short_f));
      ADD_FAILURE() << "a slice past the end ran (backend " << backend << ")";
    } catch (const ShapeError& e) {
      EXPECT_THAT(e.what(), HasSubstr("slice: [2, 5) is outside `Seq` (4); fix: a longer input, or a range inside it"));
    }
  }
}

TEST(CpuBackend, AnEmbeddingIdOutsideTheTableIsAnInputErrorOnBothBackends) {
  Graph g;
  auto table = embedding_params<Vocab<dyn>, Model<8>>(g, "embed");
  auto ids = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "tokens");
  output(embedding(table, ids), "out");
  Feeds feeds = random_feeds(g, {{"Batch", 1}, {"Seq", 4}, {"Vocab", 10}}, 3);
  NdArray t = cases::int_feed(1, 4, 10, 5);
  t.as<std::int64_t>()[2] = 10;
  feeds["tokens"] = t;
  for (int backend = 0; backend < 2; ++backend) {
    try {
      (void)(backend ? codegen::cpu::run(g, feeds, 2) : interpret(g, feeds));
      ADD_FAILURE() << "no error on backend " << backend;
    } catch (const InputError& e) {
      EXPECT_THAT(e.what(), HasSubstr("id 10 (at flat index 2 of `tokens`) is outside the table's 10 rows")) << backend;
    }
  }
  t.as<std::int64_t>()[2] = 9;
  feeds["tokens"] = t;
  expect_backends_agree(g, feeds, 0.0);
}

TEST(CpuBackend, EncoderLayerAndCrossAttention) {
  const auto c = cases::encoder_layer_then_cross_attention();
  EXPECT_EQ(codegen::cpu::fused_attention_count(c.graph), 2);
  expect_backends_agree(c.graph, c.feeds);
}

}  // namespace
}  // namespace qkv::nn

namespace qkv::nn {
namespace {

TEST(FuseAttention, ABiasAddedAfterScalingFusesButNotBefore) {
  auto build = [](bool bias_first) {
    Graph g;
    auto q = input<Tensor<f32, Seq<dyn>, HeadDim<8>>>(g, "q");
    auto k = input<Tensor<f32, Key<dyn>, HeadDim<8>>>(g, "k");
    auto v = input<Tensor<f32, Key<dyn>, HeadDim<8>>>(g, "v");
    auto b = input<Tensor<f32, Seq<dyn>, Key<dyn>>>(g, "b");
    auto s = contract<HeadDim>(q, k);
    auto p = bias_first ? softmax<Key>(scale(biased(unscaled(s), b), 0.5)) : softmax<Key>(biased(scaled(s), b));
    output(contract<Key>(p, v), "out");
    return g;
  };
  EXPECT_EQ(codegen::cpu::fused_attention_count(build(false)), 1);
  EXPECT_EQ(codegen::cpu::fused_attention_count(build(true)), 0);  // (s + b) * c is not scale * s + b
  const Graph g = build(true);
  expect_backends_agree(g, random_feeds(g, {{"Seq", 5}, {"Key", 6}}, 10));
}

}  // namespace
}  // namespace qkv::nn

namespace qkv::nn {
namespace {

// Score and mask modifications (issue #14): every built-in and a hand-written mod, fused into the
// CPU kernel, against the reference interpreter (cases::mods; the AOT test runs the same).
TEST(CpuBackend, BuiltInAndHandWrittenModsMatchTheInterpreter) {
  for (const auto& c : {cases::mods<4, 2, 32>(2, 37, 37, false), cases::mods<4, 4, 64>(1, 29, 71, true),
                        cases::mods<2, 1, 80>(2, 45, 23, false), cases::mods<4, 2, 128>(1, 17, 40, true)}) {
    ASSERT_EQ(codegen::cpu::fused_attention_count(c.graph), 1) << c.graph.table();
    expect_backends_agree(c.graph, c.feeds, 5e-5);
  }
}

}  // namespace
}  // namespace qkv::nn
