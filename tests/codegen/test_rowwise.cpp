// The JIT'd row-wise kernels (layer norm over the last axis, GELU, ReLU, equal-shape add)
// against double-precision loops: rows and columns over {1, 7, 33, 513} (vector tails in every
// loop), on 1 and 2 threads; GELU over a dense grid of [-10, 10] with 0 and ±large |x| included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include <qkv/codegen/cpu/rowwise.hpp>
#include <qkv/runtime/interpreter.hpp>

namespace qkv {
namespace {

using namespace codegen::cpu;

std::vector<float> random_vec(std::size_t n, std::mt19937& gen, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

double gelu_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

const std::int64_t kSizes[] = {1, 7, 33, 513};

TEST(Rowwise, LayerNormMatchesDouble) {
  for (std::int64_t rows : kSizes)
    for (std::int64_t n : kSizes)
      for (int threads : {1, 2}) {
        std::mt19937 gen(static_cast<unsigned>(rows * 1009 + n));
        // An offset mean (3) so that a one-pass E[x²] − E[x]² formula would lose digits.
        const auto x = random_vec(static_cast<std::size_t>(rows * n), gen, 2.0f, 4.0f);
        const auto gamma = random_vec(static_cast<std::size_t>(n), gen, 0.5f, 1.5f);
        const auto beta = random_vec(static_cast<std::size_t>(n), gen);
        std::vector<float> y(x.size(), std::nanf(""));
        const double eps = 1e-5;
        run_layer_norm(x.data(), gamma.data(), beta.data(), y.data(), rows, n, eps, threads);
        int bad = 0;
        for (std::int64_t r = 0; r < rows; ++r) {
          double mean = 0, var = 0;
          for (std::int64_t k = 0; k < n; ++k) mean += x[static_cast<std::size_t>(r * n + k)];
          mean /= static_cast<double>(n);
          for (std::int64_t k = 0; k < n; ++k) {
            const double d = x[static_cast<std::size_t>(r * n + k)] - mean;
            var += d * d;
          }
          var /= static_cast<double>(n);
          const double inv = 1.0 / std::sqrt(var + eps);
          for (std::int64_t k = 0; k < n; ++k) {
            const auto i = static_cast<std::size_t>(r * n + k), kk = static_cast<std::size_t>(k);
            const double want = (x[i] - mean) * inv * gamma[kk] + beta[kk];
            // 1e-5 relative to the row's scale (|z|·|gamma| + |beta| with |z| up to ~2).
            const double tol = 1e-5 * (std::fabs((x[i] - mean) * inv * gamma[kk]) + std::fabs(beta[kk]) + 1.0);
            if (!(std::fabs(y[i] - want) <= tol) && bad++ < 5)
              ADD_FAILURE() << "rows " << rows << " n " << n << " threads " << threads << " at (" << r << ", " << k
                            << "): " << y[i] << " vs " << want;
          }
        }
        EXPECT_EQ(bad, 0);
      }
}

TEST(Rowwise, LayerNormInPlaceAndEmpty) {
  std::mt19937 gen(7);
  auto x = random_vec(33 * 7, gen);
  const auto gamma = random_vec(33, gen), beta = random_vec(33, gen);
  std::vector<float> y(x.size());
  run_layer_norm(x.data(), gamma.data(), beta.data(), y.data(), 7, 33, 1e-5, 2);
  run_layer_norm(x.data(), gamma.data(), beta.data(), x.data(), 7, 33, 1e-5, 2);
  EXPECT_EQ(x, y);
  run_layer_norm(nullptr, nullptr, nullptr, nullptr, 0, 33, 1e-5);  // nothing to do
  EXPECT_THROW(run_layer_norm(x.data(), gamma.data(), beta.data(), y.data(), -1, 33, 1e-5), std::invalid_argument);
  EXPECT_THROW(run_layer_norm(x.data(), nullptr, beta.data(), y.data(), 7, 33, 1e-5), std::invalid_argument);
}

TEST(Rowwise, GeluMatchesErfOverRange) {
  // A dense grid over [-10, 10] (0 exactly included), odd counts so the scalar tail runs too.
  std::vector<float> x;
  for (int i = -200000; i <= 200000; ++i) x.push_back(static_cast<float>(i) * 5e-5f);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 5.5f, -5.5f, 13.0f, -13.0f, 30.0f, -30.0f, 1e6f, -1e6f, 3e38f, -3e38f})
    x.push_back(v);
  for (int threads : {1, 2}) {
    std::vector<float> y(x.size(), std::nanf(""));
    run_gelu(x.data(), y.data(), static_cast<std::int64_t>(x.size()), threads);
    double worst = 0;  // abs error on [-10, 10]; relative past it (where an ulp exceeds 1e-6)
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double want = gelu_ref(x[i]);
      const double err = std::fabs(y[i] - want) / std::max(1.0, std::fabs(want));
      if (!(err < 1e-6)) ADD_FAILURE() << "gelu(" << x[i] << ") = " << y[i] << ", want " << want;
      worst = std::max(worst, err);
    }
    EXPECT_LT(worst, 1e-6);
    EXPECT_EQ(y[200000], 0.0f);  // x == 0 exactly
  }
  const float special[] = {std::numeric_limits<float>::infinity(), std::nanf(""),
                           -std::numeric_limits<float>::infinity()};
  float out[3];
  run_gelu(special, out, 3, 1);
  EXPECT_EQ(out[0], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], 0.0f);  // the limit, as the reference interpreter (docs/semantics.md)

  // The interpreter agrees on all three.
  Graph g;
  Node in;
  in.op = Op::input;
  in.name = "x";
  in.axes = {{"N", Extent::fixed(3)}};
  g.add(in);
  Node act;
  act.op = Op::gelu;
  act.inputs = {0};
  act.axes = in.axes;
  g.mark_output(g.add(act), "y");
  const auto ref =
      interpret(g, {{"x", NdArray::from_f32({special[0], special[1], special[2]}, {3})}}).outputs.at("y").to_f32();
  EXPECT_EQ(ref[0], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(ref[1]));
  EXPECT_EQ(ref[2], 0.0f);
}

TEST(Rowwise, GeluOddSizes) {
  for (std::int64_t rows : kSizes)
    for (std::int64_t n : kSizes)
      for (int threads : {1, 2}) {
        std::mt19937 gen(static_cast<unsigned>(rows * 31 + n));
        const auto x = random_vec(static_cast<std::size_t>(rows * n), gen, -10.0f, 10.0f);
        std::vector<float> y(x.size(), std::nanf(""));
        run_gelu(x.data(), y.data(), rows * n, threads);
        for (std::size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], gelu_ref(x[i]), 1e-6) << "x = " << x[i];
      }
}

TEST(Rowwise, ReluAndAdd) {
  for (std::int64_t rows : kSizes)
    for (std::int64_t n : kSizes)
      for (int threads : {1, 2}) {
        std::mt19937 gen(static_cast<unsigned>(rows * 7 + n));
        auto a = random_vec(static_cast<std::size_t>(rows * n), gen);
        const auto b = random_vec(a.size(), gen);
        a[0] = -0.0f;
        if (a.size() > 1) a[1] = std::nanf("");
        std::vector<float> r(a.size(), 42.0f), s(a.size(), 42.0f);
        run_relu(a.data(), r.data(), rows * n, threads);
        run_add(a.data(), b.data(), s.data(), rows * n, threads);
        for (std::size_t i = 0; i < a.size(); ++i) {
          if (std::isnan(a[i])) {
            EXPECT_TRUE(std::isnan(r[i]));
            EXPECT_TRUE(std::isnan(s[i]));
            continue;
          }
          const float want = a[i] > 0.0f ? a[i] : 0.0f;
          EXPECT_EQ(r[i], want) << i;
          EXPECT_FALSE(std::signbit(r[i])) << i;
          EXPECT_EQ(s[i], a[i] + b[i]) << i;  // one rounding, as the reference's float add
        }
      }
  std::vector<float> x{1.0f, -2.0f, 3.0f};
  run_add(x.data(), x.data(), x.data(), 3, 1);  // in place
  EXPECT_EQ(x, (std::vector<float>{2.0f, -4.0f, 6.0f}));
  EXPECT_THROW(run_relu(nullptr, x.data(), 3), std::invalid_argument);
  EXPECT_THROW(run_add(x.data(), x.data(), x.data(), -1), std::invalid_argument);
}

}  // namespace
}  // namespace qkv
