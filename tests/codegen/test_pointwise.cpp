// Element-wise math (qkv/dsl/ops_pointwise.hpp): each function against its formula in double (the
// interpreter, within 1e-12 of it) and the CPU backend against the interpreter (within the f32
// approximations' error, stated per function), on values that reach every branch — 0, ±tiny,
// the series/erfc switch of erf at 0.5, large ±|x| where sigmoid and tanh saturate, negative
// bases of pow with integral and other exponents, ±inf and NaN; broadcasting by name; and the
// canonicalize pass merging a chain of them into one node with the same values.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>

namespace qkv {
namespace {

QKV_AXIS(Row);
QKV_AXIS(Col);

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// The test values, as a [Row = 4, Col = 16] tensor (row-major).
std::vector<float> values() {
  std::vector<float> v{0.0f,   -0.0f,  1e-6f, -1e-6f, 0.1f,  -0.3f,  0.49f,  0.5f,    0.51f,  -0.5f,   1.0f,
                       -1.0f,  2.5f,   -2.5f, 3.0f,   -3.0f, 5.0f,   -5.0f,  9.0f,    -9.0f,  12.0f,   -12.0f,
                       20.0f,  -20.0f, 40.0f, -40.0f, 88.0f, -88.0f, 100.0f, -100.0f, 1e-30f, -1e-30f, 0.7071f,
                       1.5f,   -1.5f,  0.25f, -0.25f, 7.0f,  -7.0f,  0.999f, 1.001f,  30.0f,  -30.0f,  0.0625f,
                       16.0f,  2.0f,   -2.0f, 4.0f,   -4.0f, 64.0f,  1e10f,  -1e10f,  1e-3f,  -1e-3f,  0.75f,
                       -0.75f, 6.0f,   -6.0f, 0.3f,   1.2f,  -1.2f};
  v.push_back(static_cast<float>(kInf));
  v.push_back(static_cast<float>(-kInf));
  v.push_back(static_cast<float>(kNaN));
  v.resize(64, 0.125f);
  return v;
}

NdArray matrix(const std::vector<float>& v) { return NdArray::from_f32(v, {4, 16}); }

/// max over entries of |got − want| / (abs + rel·|want|), NaN matching NaN and equal infinities
/// matching; anything else non-finite fails (returns inf).
double worst(const std::vector<float>& got, const std::vector<double>& want, double abs, double rel) {
  double w = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], e = want[i];
    if (std::isnan(e) || std::isnan(g)) {
      if (!(std::isnan(e) && std::isnan(g))) return kInf;
      continue;
    }
    if (std::isinf(e) || std::isinf(g)) {
      if (g != static_cast<double>(static_cast<float>(e))) return kInf;
      continue;
    }
    w = std::max(w, std::abs(g - e) / (abs + rel * std::abs(e)));
  }
  return w;
}

using Build = std::function<void(Graph&)>;

/// Runs `build` (inputs "x" [Row, Col], "y" [Col]) on the interpreter and the CPU backend.
struct Results {
  std::vector<float> interp, cpu;
};
Results run_both(const Build& build, const Feeds& feeds) {
  Graph g;
  build(g);
  Results r;
  r.interp = interpret(g, feeds).outputs.at("out").to_f32();
  r.cpu = codegen::cpu::run(g, feeds, 2).outputs.at("out").to_f32();
  return r;
}

struct Case {
  std::string name;
  std::function<void(Graph&)> build;
  std::function<double(double)> formula;
  double abs, rel;  // the CPU backend's tolerance against the interpreter
};

template <class F>
Case unary(std::string name, F f, std::function<double(double)> formula, double abs, double rel) {
  return {std::move(name),
          [f](Graph& g) {
            auto x = input<Tensor<f32, Row<4>, Col<16>>>(g, "x");
            output(f(x), "out");
          },
          std::move(formula), abs, rel};
}

TEST(Pointwise, EveryFunctionMatchesItsFormulaOnTheInterpreterAndTheCpuBackend) {
  const std::vector<float> x = values();
  const Feeds feeds{{"x", matrix(x)}};
  const double s2pi = std::sqrt(2.0 / std::acos(-1.0));
  const std::vector<Case> cases{
      unary(
          "tanh", [](auto t) { return tanh(t); }, [](double v) { return std::tanh(v); }, 3e-7, 0),
      unary(
          "sigmoid", [](auto t) { return sigmoid(t); }, [](double v) { return 1 / (1 + std::exp(-v)); }, 1e-30, 3e-6),
      unary(
          "exp", [](auto t) { return exp(t); }, [](double v) { return std::exp(v); }, 1e-30, 3e-6),
      unary(
          "log", [](auto t) { return log(t); }, [](double v) { return std::log(v); }, 3e-7, 1e-6),
      unary(
          "sqrt", [](auto t) { return sqrt(t); }, [](double v) { return std::sqrt(v); }, 1e-30, 2e-7),
      unary(
          "rsqrt", [](auto t) { return rsqrt(t); }, [](double v) { return 1 / std::sqrt(v); }, 1e-30, 3e-7),
      unary(
          "abs", [](auto t) { return abs(t); }, [](double v) { return std::abs(v); }, 0, 1e-7),
      unary(
          "erf", [](auto t) { return erf(t); }, [](double v) { return std::erf(v); }, 1e-30, 3e-7),
      unary(
          "pow 3", [](auto t) { return pow(t, 3.0); }, [](double v) { return v * v * v; }, 1e-30, 4e-7),
      unary(
          "pow 2.5", [](auto t) { return pow(t, 2.5); }, [](double v) { return std::pow(v, 2.5); }, 1e-30, 1e-5),
      unary(
          "pow -2", [](auto t) { return pow(t, -2.0); }, [](double v) { return std::pow(v, -2.0); }, 1e-30, 1e-5),
      unary(
          "pow -0.5", [](auto t) { return pow(t, -0.5); }, [](double v) { return std::pow(v, -0.5); }, 1e-30, 1e-5),
      unary(
          "gelu_tanh", [](auto t) { return gelu_tanh(t); },
          // 0.5·x·(1 + tanh u) = x / (1 + e^(−2u)), the form without cancellation
          [s2pi](double v) { return v / (1 + std::exp(-2 * s2pi * (v + 0.044715 * v * v * v))); }, 1e-6, 1e-6),
      unary(
          "clamp", [](auto t) { return clamp(t, -2.0, 3.0); },
          [](double v) { return std::isnan(v) ? v : std::min(std::max(v, -2.0), 3.0); }, 0, 1e-7),
      unary(
          "2 - x * 0.5 / 4 + 1", [](auto t) { return 2.0 - t * 0.5 / 4.0 + 1.0; },
          [](double v) { return 2.0 - v * 0.5 / 4.0 + 1.0; }, 1e-7, 1e-7),
      unary(
          "-x", [](auto t) { return -t; }, [](double v) { return -v; }, 0, 1e-7),
  };
  for (const Case& c : cases) {
    const Results r = run_both(c.build, feeds);
    std::vector<double> want, interp(r.interp.begin(), r.interp.end());
    for (float v : x) want.push_back(static_cast<double>(static_cast<float>(c.formula(v))));
    // The interpreter evaluates the formula in double and rounds once to f32.
    EXPECT_LE(worst(r.interp, want, 1e-37, 1e-7), 1.0) << c.name << ": the interpreter";
    EXPECT_LE(worst(r.cpu, interp, c.abs + 1e-37, c.rel), 1.0) << c.name << ": the CPU backend";
    for (std::size_t i = 0; i < x.size(); ++i)
      if (worst({r.cpu[i]}, {interp[i]}, c.abs + 1e-37, c.rel) > 1.0)
        ADD_FAILURE() << c.name << "(" << x[i] << "): CPU " << r.cpu[i] << ", interpreter " << interp[i];
  }
}

TEST(Pointwise, PowFollowsCOnNegativeBasesZeroAndOne) {
  // Bases down the rows, exponents across the columns (y broadcast into x by name).
  std::vector<float> base, expo{0.0f,
                                1.0f,
                                2.0f,
                                3.0f,
                                -1.0f,
                                -2.0f,
                                0.5f,
                                -0.5f,
                                2.5f,
                                1e9f,
                                static_cast<float>(kNaN),
                                static_cast<float>(kInf),
                                static_cast<float>(-kInf),
                                7.0f,
                                -3.0f,
                                0.0f};
  for (float b : {-2.0f, 0.0f, 1.0f, static_cast<float>(kNaN)})
    for (int k = 0; k < 16; ++k) base.push_back(b);
  const Feeds feeds{{"x", matrix(base)}, {"y", NdArray::from_f32(expo, {16})}};
  const Results r = run_both(
      [](Graph& g) {
        auto x = input<Tensor<f32, Row<4>, Col<16>>>(g, "x");
        auto y = input<Tensor<f32, Col<16>>>(g, "y");
        output(pow(x, y), "out");
      },
      feeds);
  std::vector<double> want;
  for (std::size_t i = 0; i < base.size(); ++i) want.push_back(static_cast<float>(std::pow(base[i], expo[i % 16])));
  EXPECT_LE(worst(r.interp, want, 1e-37, 1e-7), 1.0);
  EXPECT_LE(worst(r.cpu, want, 1e-37, 2e-5), 1.0);
}

TEST(Pointwise, MinMaxAndWhereBroadcastByNameAndKeepNaN) {
  std::vector<float> y(16);
  for (int k = 0; k < 16; ++k) y[static_cast<std::size_t>(k)] = k == 3 ? static_cast<float>(kNaN) : 0.5f * k - 2.0f;
  NdArray keep = NdArray::zeros(DType::boolean, {16});
  for (int k = 0; k < 16; k += 3) keep.as<std::uint8_t>()[static_cast<std::size_t>(k)] = 1;
  const std::vector<float> x = values();
  const Feeds feeds{{"x", matrix(x)}, {"y", NdArray::from_f32(y, {16})}, {"keep", keep}};
  for (const std::string which : {"max", "min", "where", "where number"}) {
    const Results r = run_both(
        [&](Graph& g) {
          auto xt = input<Tensor<f32, Row<4>, Col<16>>>(g, "x");
          auto yt = input<Tensor<f32, Col<16>>>(g, "y");
          auto kt = input<Tensor<boolean, Col<16>>>(g, "keep");
          if (which == "max") output(max(xt, yt), "out");
          if (which == "min") output(min(xt, yt), "out");
          if (which == "where") output(where(kt, xt, yt), "out");
          if (which == "where number") output(where(kt, xt, -1.5), "out");
        },
        feeds);
    std::vector<double> want;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double a = x[i], b = y[i % 16];
      const bool k = keep.as<std::uint8_t>()[i % 16] != 0;
      if (which == "max") want.push_back(std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b));
      if (which == "min") want.push_back(std::isnan(a) || std::isnan(b) ? kNaN : std::min(a, b));
      if (which == "where") want.push_back(k ? a : b);
      if (which == "where number") want.push_back(k ? a : -1.5);
    }
    EXPECT_LE(worst(r.interp, want, 0, 1e-7), 1.0) << which;
    EXPECT_LE(worst(r.cpu, want, 0, 1e-7), 1.0) << which;
  }
}

TEST(Pointwise, AChainIsOneNodeAfterCanonicalizeWithTheSameValues) {
  Graph g;
  auto x = input<Tensor<f32, Row<4>, Col<16>>>(g, "x");
  auto y = input<Tensor<f32, Col<16>>>(g, "y");
  auto z = sigmoid(max(gelu_tanh(x) * 2.0 + 1.0, y));
  output(z, "out");
  int before = 0, after = 0;
  for (const Node& n : g.nodes()) before += n.op == Op::pointwise;
  const Graph lowered = codegen::lower(g);
  for (const Node& n : lowered.nodes()) after += n.op == Op::pointwise;
  EXPECT_EQ(before, 5);
  EXPECT_EQ(after, 1);
  std::vector<float> yv(16, 0.25f);
  const Feeds feeds{{"x", matrix(values())}, {"y", NdArray::from_f32(yv, {16})}};
  const auto want = interpret(g, feeds).outputs.at("out").to_f32();
  const auto fused = interpret(lowered, feeds).outputs.at("out").to_f32();
  const auto cpu = codegen::cpu::run(g, feeds, 1).outputs.at("out").to_f32();
  EXPECT_LE(worst(fused, std::vector<double>(want.begin(), want.end()), 1e-37, 1e-6), 1.0);
  EXPECT_LE(worst(cpu, std::vector<double>(want.begin(), want.end()), 1e-6, 1e-6), 1.0);
  // Two chains on one input, joined by a product: one node (the second chain, read in place, is
  // inlined where the product loads it), the values unchanged.
  Graph j;
  auto jx = input<Tensor<f32, Row<4>, Col<16>>>(j, "x");
  output(tanh(jx * 0.5) * sigmoid(jx) + jx / 4.0, "out");  // one sign: no cancellation
  int joined = 0;
  const Graph j_lowered = codegen::lower(j);  // kept: a range-for over a temporary's nodes would dangle
  for (const Node& n : j_lowered.nodes()) joined += n.op == Op::pointwise;
  EXPECT_EQ(joined, 1);
  const Feeds jf{{"x", matrix(values())}};
  const auto jwant = interpret(j, jf).outputs.at("out").to_f32();
  EXPECT_LE(worst(interpret(j_lowered, jf).outputs.at("out").to_f32(), std::vector<double>(jwant.begin(), jwant.end()),
                  1e-37, 1e-6),
            1.0);
  EXPECT_LE(worst(codegen::cpu::run(j, jf, 2).outputs.at("out").to_f32(),
                  std::vector<double>(jwant.begin(), jwant.end()), 1e-6, 1e-6),
            1.0);
  // A value read twice is not merged into its readers (it would be computed twice).
  Graph h;
  auto hx = input<Tensor<f32, Row<4>, Col<16>>>(h, "x");
  auto t = tanh(hx);
  output(exp(t) + 1.0, "out");
  output(t, "t");
  int kept = 0;
  const Graph h_lowered = codegen::lower(h);
  for (const Node& n : h_lowered.nodes()) kept += n.op == Op::pointwise;
  EXPECT_EQ(kept, 2);  // tanh (an output too), then exp(t) + 1 merged
}

TEST(Pointwise, MergedExpressionsKeepTheirPositionsAlignment) {
  // A pointwise node reading bottom-right aligned positions (query i at i + S − L) fed by another
  // pointwise node: canonicalize merges the two, and the merged expression must keep the
  // alignment (it kept the inner node's, which reads no position, and the CPU backend then
  // compared unshifted positions: the gradient of a bottom-right causal mask came out wrong).
  Graph g;
  Node x;
  x.op = Op::input;
  x.name = "x";
  x.axes = {Axis{"Seq", Extent::fixed(3)}, Axis{"Key", Extent::fixed(5)}};
  const int xi = g.add(x);
  Node twice;
  twice.op = Op::pointwise;
  twice.inputs = {xi};
  twice.axes = x.axes;
  ModExpr t;
  t.score = t.add(mod_node(ModOp::mul, t.add(mod_node(ModOp::score)), t.add(mod_constant(2.0))));
  twice.mod = t;
  const int ti = g.add(twice);
  Node causal = twice;
  causal.inputs = {ti};
  ModExpr c;
  c.query = "Seq";
  c.key = "Key";
  c.align = CausalAlign::bottom_right;
  ModNode q, k;
  q.op = k.op = ModOp::position;
  q.axis = "Seq";
  k.axis = "Key";
  const int s = c.add(mod_node(ModOp::score));
  const int keep = c.add(mod_node(ModOp::le, c.add(k), c.add(q)));
  c.score = c.add(mod_node(ModOp::where, keep, s, c.add(mod_constant(0.0))));
  causal.mod = c;
  g.mark_output(g.add(causal), "y");
  const Feeds feeds{{"x", NdArray::from_f32(std::vector<float>(15, 1.0f), {3, 5})}};
  const auto ref = interpret(g, feeds).outputs.at("y").to_f32();
  // Row i keeps keys j <= i + 2: 3, 4 and 5 of them.
  EXPECT_EQ(ref, (std::vector<float>{2, 2, 2, 0, 0, 2, 2, 2, 2, 0, 2, 2, 2, 2, 2}));
  EXPECT_EQ(codegen::cpu::run(g, feeds).outputs.at("y").to_f32(), ref);
}

}  // namespace
}  // namespace qkv
