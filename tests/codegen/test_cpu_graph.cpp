// The graph the CPU module is built from and the copies it makes: a chain of element-wise nodes
// (as the gradient rules write them: add, mul, scale, pointwise) computed as one loop with the
// same bits as node by node; a permuted contraction written in the permuted order; transposes
// copied in tiles, exactly; a whole tensor's sum and a long log-sum-exp on the tasks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/lowering/select.hpp>
#include <qkv/codegen/passes/canonicalize.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/dsl/grad.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>

namespace qkv {
namespace {

Axis ax(const std::string& name, std::int64_t n) { return Axis{name, Extent::fixed(n)}; }

int leaf(Graph& g, const std::string& name, std::vector<Axis> axes) {
  Node n;
  n.op = Op::input;
  n.name = name;
  n.axes = std::move(axes);
  return g.add(n);
}

int node(Graph& g, Op op, std::vector<int> inputs, std::vector<Axis> axes, double scalar = 0.0) {
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.axes = std::move(axes);
  n.scalar = scalar;
  return g.add(n);
}

std::vector<float> ramp(std::size_t n, float scale, float shift) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 37) % 101) + shift;
  return v;
}

int count(const Graph& g, Op op) {
  int n = 0;
  for (const Node& x : g.nodes()) n += x.op == op;
  return n;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// A layer norm's backward as the gradient rules write it, on [Row, Col]: dy·w (w [Col],
/// broadcast), + the same times a [Row] factor, scaled by 0.5, + x, then a pointwise exp. With
/// `keep` every intermediate is an output too (read twice: nothing is fused), for the reference.
Graph chain(bool keep) {
  Graph g;
  const std::vector<Axis> rc{ax("Row", 48), ax("Col", 40)};
  const int x = leaf(g, "x", rc), dy = leaf(g, "dy", rc), w = leaf(g, "w", {ax("Col", 40)});
  const int r = leaf(g, "r", {ax("Row", 48)});
  const int a = node(g, Op::mul, {dy, w}, rc);
  const int b = node(g, Op::mul, {a, r}, rc);
  const int c = node(g, Op::add, {a, b}, rc);  // a is read twice: it stays a node of its own
  const int d = node(g, Op::scale, {c}, rc, 0.5);
  const int e = node(g, Op::add, {x, d}, rc);  // d read in place, as the second operand
  Node p;
  p.op = Op::pointwise;
  p.inputs = {e};
  p.axes = rc;
  ModExpr ex;
  ex.score = ex.add(mod_node(ModOp::exp, ex.add(mod_node(ModOp::score))));
  p.mod = ex;
  const int f = g.add(p);
  const int s = node(g, Op::scale, {f}, rc, 0.1);  // 0.1 is no f32: the double product stays its own node
  g.mark_output(s, "out");
  if (keep) {
    g.mark_output(b, "b");
    g.mark_output(c, "c");
    g.mark_output(d, "d");
    g.mark_output(e, "e");
    g.mark_output(f, "f");
  }
  return g;
}

TEST(CpuModuleGraph, AnElementwiseChainIsOneLoopWithTheSameBits) {
  const Feeds feeds{{"x", NdArray::from_f32(ramp(48 * 40, 0.01f, -0.3f), {48, 40})},
                    {"dy", NdArray::from_f32(ramp(48 * 40, -0.013f, 0.6f), {48, 40})},
                    {"w", NdArray::from_f32(ramp(40, 0.07f, -1.1f), {40})},
                    {"r", NdArray::from_f32(ramp(48, 0.003f, 0.2f), {48})}};
  const Graph fused = codegen::fuse_elementwise(codegen::lower(chain(false)));
  // mul(dy, w) stays (read twice); mul, add, scale 0.5, add, exp become one pointwise node; the
  // scale by 0.1 stays.
  EXPECT_EQ(count(fused, Op::mul), 1);
  EXPECT_EQ(count(fused, Op::add), 0);
  EXPECT_EQ(count(fused, Op::pointwise), 1);
  EXPECT_EQ(count(fused, Op::scale), 1);
  const Graph unfused = codegen::fuse_elementwise(codegen::lower(chain(true)));
  EXPECT_EQ(count(unfused, Op::pointwise), 1);  // the exp alone
  EXPECT_EQ(count(unfused, Op::add), 2);
  const auto got = codegen::cpu::run(chain(false), feeds, 2).outputs.at("out").to_f32();
  const auto want = codegen::cpu::run(chain(true), feeds, 2).outputs.at("out").to_f32();
  EXPECT_TRUE(same_bits(got, want));
  const auto ref = interpret(chain(false), feeds).outputs.at("out").to_f32();
  ASSERT_EQ(ref.size(), got.size());
  for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-6 * (1 + std::abs(ref[i]))) << i;
}

TEST(CpuModuleGraph, APermutedContractionIsWrittenInThePermutedOrder) {
  // Σ_K a[K, M] b[K, N], M renamed P, permuted to [N, P]: a weight's gradient into [in, out].
  Graph g;
  const int a = leaf(g, "a", {ax("K", 70), ax("M", 24)}), b = leaf(g, "b", {ax("K", 70), ax("N", 36)});
  Node c;
  c.op = Op::contract;
  c.inputs = {a, b};
  c.attr_axes = {"K"};
  c.axes = {ax("M", 24), ax("N", 36)};
  const int ci = g.add(c);
  Node r;
  r.op = Op::rename;
  r.inputs = {ci};
  r.attr_axes = {"M", "P"};
  r.axes = {ax("P", 24), ax("N", 36)};
  const int ri = g.add(r);
  g.mark_output(node(g, Op::permute, {ri}, {ax("N", 36), ax("P", 24)}), "out");
  const Graph lowered = codegen::lower(g);
  EXPECT_EQ(count(lowered, Op::permute), 0);
  for (const Node& n : lowered.nodes())
    if (n.op == Op::contract) {
      EXPECT_EQ(n.axes.front().name, "N");
    }
  const Feeds feeds{{"a", NdArray::from_f32(ramp(70 * 24, 0.02f, -0.9f), {70, 24})},
                    {"b", NdArray::from_f32(ramp(70 * 36, -0.01f, 0.5f), {70, 36})}};
  const auto ref = interpret(g, feeds).outputs.at("out").to_f32();
  const auto got = codegen::cpu::run(g, feeds, 2).outputs.at("out").to_f32();
  ASSERT_EQ(ref.size(), got.size());
  for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-5 * (1 + std::abs(ref[i]))) << i;
}

TEST(CpuModuleGraph, TransposesInTilesMatchTheInterpreterExactly) {
  // Sizes that are no multiple of the tile: [37, 53] -> [53, 37]; [5, 19, 33] with its inner
  // axis moved first; and one keeping its inner axis (copied row by row, as before).
  struct Case {
    std::vector<Axis> in, out;
  };
  const std::vector<Case> cases{
      {{ax("A", 37), ax("B", 53)}, {ax("B", 53), ax("A", 37)}},
      {{ax("A", 5), ax("B", 19), ax("C", 33)}, {ax("C", 33), ax("A", 5), ax("B", 19)}},
      {{ax("A", 5), ax("B", 19), ax("C", 33)}, {ax("B", 19), ax("C", 33), ax("A", 5)}},
      {{ax("A", 5), ax("B", 19), ax("C", 33)}, {ax("B", 19), ax("A", 5), ax("C", 33)}},
  };
  for (const Case& c : cases) {
    Graph g;
    const int x = leaf(g, "x", c.in);
    g.mark_output(node(g, Op::permute, {x}, c.out), "out");
    std::vector<std::int64_t> shape;
    std::size_t n = 1;
    for (const Axis& a : c.in) {
      shape.push_back(a.extent.value);
      n *= static_cast<std::size_t>(a.extent.value);
    }
    const Feeds feeds{{"x", NdArray::from_f32(ramp(n, 0.5f, -7.0f), shape)}};
    const auto ref = interpret(g, feeds).outputs.at("out").to_f32();
    EXPECT_TRUE(same_bits(codegen::cpu::run(g, feeds, 2).outputs.at("out").to_f32(), ref)) << c.out.front().name;
    EXPECT_TRUE(same_bits(codegen::cpu::run(g, feeds, 1).outputs.at("out").to_f32(), ref)) << c.out.front().name;
  }
}

TEST(CpuModuleGraph, AWholeTensorsSumIsSplitIntoPartsInAFixedOrder) {
  // Σ x² over a [300, 4000] tensor (a gradient's squared norm, as clipping takes it): the sum of
  // a fill, one output, its run in parts on the tasks and the parts added in order — the same bits
  // on 1 and 2 threads, the interpreter's value (fp64 sums) within f32 rounding.
  Graph g;
  const std::vector<Axis> xy{ax("In", 300), ax("Out", 4000)};
  const int x = leaf(g, "x", xy);
  const int sq = node(g, Op::mul, {x, x}, xy);
  const int ones = node(g, Op::fill, {}, xy, 1.0);
  Node c;
  c.op = Op::contract;
  c.inputs = {sq, ones};
  c.attr_axes = {"In", "Out"};
  g.mark_output(g.add(c), "norm2");
  const Feeds feeds{{"x", NdArray::from_f32(ramp(300 * 4000, 0.002f, -0.1f), {300, 4000})}};
  const float ref = interpret(g, feeds).outputs.at("norm2").to_f32()[0];
  const auto one = codegen::cpu::run(g, feeds, 1).outputs.at("norm2").to_f32();
  const auto two = codegen::cpu::run(g, feeds, 2).outputs.at("norm2").to_f32();
  EXPECT_TRUE(same_bits(one, two));
  EXPECT_NEAR(one[0], ref, 1e-6 * ref);
}

TEST(CpuModuleGraph, ALongLogSumExpRunsOnTheTasksAsTheInterpreterComputesIt) {
  // A language model's loss: a row of a 5 000-entry vocabulary per token, 40 tokens — the rows
  // shared among the tasks, each row's max and sum in vectors. Row 1 holds a NaN (NaN wins),
  // row 2 is all −inf (−inf), row 3 holds +inf (+inf), row 4 large values (no overflow).
  constexpr std::int64_t kRows = 40, kVocab = 5000;
  Graph g;
  const int x = leaf(g, "x", {ax("Tok", kRows), ax("Vocab", kVocab)});
  Node l;
  l.op = Op::logsumexp;
  l.inputs = {x};
  l.attr_axes = {"Vocab"};
  l.axes = {ax("Tok", kRows)};
  g.mark_output(g.add(l), "lse");
  std::vector<float> v = ramp(kRows * kVocab, 0.013f, -0.6f);
  const float inf = std::numeric_limits<float>::infinity();
  v[1 * kVocab + 4321] = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t k = 0; k < kVocab; ++k) v[static_cast<std::size_t>(2 * kVocab + k)] = -inf;
  v[3 * kVocab + 17] = inf;
  for (std::int64_t k = 0; k < kVocab; ++k) v[static_cast<std::size_t>(4 * kVocab + k)] += 80.0f;
  const Feeds feeds{{"x", NdArray::from_f32(v, {kRows, kVocab})}};
  const auto ref = interpret(g, feeds).outputs.at("lse").to_f32();
  const auto one = codegen::cpu::run(g, feeds, 1).outputs.at("lse").to_f32();
  const auto two = codegen::cpu::run(g, feeds, 2).outputs.at("lse").to_f32();
  EXPECT_TRUE(same_bits(one, two));
  EXPECT_TRUE(std::isnan(one[1]));
  EXPECT_EQ(one[2], -inf);
  EXPECT_EQ(one[3], inf);
  for (std::size_t i = 0; i < ref.size(); ++i)
    if (std::isfinite(ref[i])) {
      EXPECT_NEAR(one[i], ref[i], 2e-6 * std::abs(ref[i])) << i;
    }
}

/// Σ of fill-weighted entries of `x` over `over` (a contraction with a fill of ones).
int fill_sum(Graph& g, int x, const std::vector<Axis>& fill_axes, std::vector<std::string> over,
             std::vector<Axis> out) {
  Node c;
  c.op = Op::contract;
  c.inputs = {x, node(g, Op::fill, {}, fill_axes, 1.0)};
  c.attr_axes = std::move(over);
  c.axes = std::move(out);
  return g.add(c);
}

TEST(CpuModuleGraph, ElementwiseValuesOnlySummedAreComputedByTheSums) {
  // A norm's backward sums products it writes nowhere else: row sums of a pointwise expression of
  // two [Row, Col] values, column sums of their product, a whole sum of a pointwise over [Row]
  // (a loss's mean: the masked per-token losses), each computed entry by entry by the sums; a
  // value read by a sum and by another node is written out as before. Against the interpreter,
  // and the same bits on 1 and 2 threads.
  Graph g;
  const std::vector<Axis> rc{ax("Row", 300), ax("Col", 56)};
  const int x = leaf(g, "x", rc), y = leaf(g, "y", rc), m = leaf(g, "m", {ax("Row", 300)});
  const int t = leaf(g, "t", {ax("Row", 300)});
  Node p;
  p.op = Op::pointwise;
  p.inputs = {x, y};
  p.axes = rc;
  ModExpr ex;
  ModNode cols = mod_node(ModOp::length);
  cols.axis = "Col";
  const int exp_x = ex.add(mod_node(ModOp::exp, ex.add(mod_node(ModOp::score))));
  ex.score =
      ex.add(mod_node(ModOp::div, ex.add(mod_node(ModOp::mul, exp_x, mod_load_in_place(ex, 1, rc))), ex.add(cols)));
  p.mod = ex;
  const int e = g.add(p);  // e^x · y / N (a mean's 1/N: the axis's length)
  g.mark_output(fill_sum(g, e, {ax("Col", 56)}, {"Col"}, {ax("Row", 300)}), "row_sums");
  const int xy = node(g, Op::mul, {x, y}, rc);
  g.mark_output(fill_sum(g, xy, {ax("Row", 300)}, {"Row"}, {ax("Col", 56)}), "column_sums");
  Node q;
  q.op = Op::pointwise;
  q.inputs = {t, m};
  q.axes = {ax("Row", 300)};
  ModExpr qe;
  qe.score = qe.add(mod_node(ModOp::sub, qe.add(mod_node(ModOp::score)), mod_load_in_place(qe, 1, q.axes)));
  q.mod = qe;
  const int d = g.add(q);  // t − m
  g.mark_output(fill_sum(g, d, {ax("Row", 300)}, {"Row"}, {}), "whole_sum");
  // The inputs of a summed value live until the sums run: a (computed, read only by the product)
  // is still read there, after z, which would otherwise have taken a's memory.
  const int a = node(g, Op::scale, {x}, rc, 0.1);
  const int ay = node(g, Op::mul, {a, y}, rc);
  const int z = node(g, Op::relu, {y}, rc);
  g.mark_output(fill_sum(g, ay, {ax("Col", 56)}, {"Col"}, {ax("Row", 300)}), "after_z");
  g.mark_output(node(g, Op::scale, {z}, rc, 0.7), "z");
  const int twice = node(g, Op::add, {x, y}, rc);  // summed and an output: written out
  g.mark_output(fill_sum(g, twice, {ax("Row", 300)}, {"Row"}, {ax("Col", 56)}), "summed_too");
  g.mark_output(twice, "x_plus_y");

  const Graph lowered = codegen::fuse_elementwise(codegen::lower(g));
  int inlined = 0;
  for (int id = 0; id < static_cast<int>(lowered.size()); ++id)
    inlined += codegen::elementwise_only_summed(lowered, id);
  EXPECT_EQ(inlined, 4);
  const Feeds feeds{{"x", NdArray::from_f32(ramp(300 * 56, 0.01f, -0.4f), {300, 56})},
                    {"y", NdArray::from_f32(ramp(300 * 56, -0.02f, 0.9f), {300, 56})},
                    {"m", NdArray::from_f32(ramp(300, 0.05f, -2.0f), {300})},
                    {"t", NdArray::from_f32(ramp(300, -0.03f, 1.0f), {300})}};
  const RunResult ref = interpret(g, feeds);
  const RunResult one = codegen::cpu::run(g, feeds, 1), two = codegen::cpu::run(g, feeds, 2);
  for (const char* name : {"row_sums", "column_sums", "whole_sum", "summed_too", "x_plus_y", "after_z", "z"}) {
    const auto want = ref.outputs.at(name).to_f32(), got = two.outputs.at(name).to_f32();
    EXPECT_TRUE(same_bits(one.outputs.at(name).to_f32(), got)) << name;
    ASSERT_EQ(want.size(), got.size()) << name;
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << name << "[" << i << "]";
  }
}

TEST(CpuModuleGraph, AHalfValueOnlySummedIsRoundedAsItsStoreWouldRoundIt) {
  // bf16 products summed (a bf16 model's norm backward): computed by the sums, each rounded to
  // bf16 as writing it would round it — the same bits as when the product is also an output (and
  // so written and read back).
  auto build = [](bool written) {
    Graph g;
    auto x = input<Tensor<bf16, nn::Seq<300>, nn::Model<56>>>(g, "x");
    auto y = input<Tensor<bf16, nn::Seq<300>, nn::Model<56>>>(g, "y");
    auto p = mul(x, y);
    auto q = add(x, y);
    output(sum<nn::Model>(p), "row_sums");
    output(sum<nn::Seq>(q), "column_sums");
    if (written) {
      output(p, "p");
      output(q, "q");
    }
    return g;
  };
  const Graph lowered = codegen::fuse_elementwise(codegen::lower(build(false)));
  int inlined = 0;
  for (int id = 0; id < static_cast<int>(lowered.size()); ++id)
    inlined += codegen::elementwise_only_summed(lowered, id);
  EXPECT_EQ(inlined, 2);
  const Feeds feeds{{"x", NdArray::from_f32_as(DType::bf16, ramp(300 * 56, 0.0137f, -0.41f), {300, 56})},
                    {"y", NdArray::from_f32_as(DType::bf16, ramp(300 * 56, -0.0211f, 0.93f), {300, 56})}};
  const RunResult summed = codegen::cpu::run(build(false), feeds, 2),
                  written = codegen::cpu::run(build(true), feeds, 2);
  for (const char* name : {"row_sums", "column_sums"})
    EXPECT_TRUE(same_bits(summed.outputs.at(name).to_f32(), written.outputs.at(name).to_f32())) << name;
}

}  // namespace
}  // namespace qkv
