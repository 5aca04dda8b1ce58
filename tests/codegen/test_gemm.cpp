// The JIT'd GEMM (C = A·Bᵀ + bias, PyTorch's linear layout) against a double-precision loop:
// M, N, K over {1, 3, 17, 64, 100, 513} (tails in every dimension, K past one K block), with and
// without a bias, on 1 and 2 threads, plus forced small blockings (narrow vectors, odd micro-tile
// shapes, tiny K blocks) to reach every tail path. Prints one GFLOP/s figure at M=2048, N=K=512.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <qkv/codegen/cpu/gemm.hpp>
#include <qkv/codegen/target.hpp>

namespace qkv {
namespace {

using codegen::cpu::GemmSpec;
using codegen::cpu::run_linear;
using codegen::cpu::run_linear_bf16;

std::vector<float> random_vec(std::size_t n, std::mt19937& gen) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

/// Every element of C [m, n] against the fp64 loop over A [m, k] and B [n, k] (the values as the
/// kernel reads them), within 1e-5 of Σ|a||b| (+|bias|); `what` names the call in failures.
void expect_fp64_sums(const std::vector<double>& a, const std::vector<double>& b, const float* bias,
                      const std::vector<float>& c, std::int64_t m, std::int64_t n, std::int64_t k,
                      const std::string& what) {
  int bad = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double ref = bias ? bias[j] : 0.0, mag = std::fabs(ref);
      for (std::int64_t x = 0; x < k; ++x) {
        const double p = a[static_cast<std::size_t>(i * k + x)] * b[static_cast<std::size_t>(j * k + x)];
        ref += p;
        mag += std::fabs(p);
      }
      const double got = c[static_cast<std::size_t>(i * n + j)];
      if (!(std::fabs(got - ref) <= 1e-5 * mag + 1e-30) && bad++ < 5)
        ADD_FAILURE() << what << ": C[" << i << ", " << j << "] = " << got << ", expected " << ref;
    }
  EXPECT_EQ(bad, 0) << what;
}

std::string describe(const char* kind, std::int64_t m, std::int64_t n, std::int64_t k, bool with_bias, int threads) {
  return std::string(kind) + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
         " bias=" + std::to_string(with_bias) + " threads=" + std::to_string(threads);
}

/// bf16 values in [-1, 1) (the bits), drawn from `gen`.
std::vector<std::uint16_t> random_bf16(std::size_t n, std::mt19937& gen) {
  std::vector<std::uint16_t> v(n);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (auto& x : v) x = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(d(gen)) >> 16);
  return v;
}
/// The values as the kernel reads them, in double.
std::vector<double> widened(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<double> widened(const std::vector<std::uint16_t>& bits) {
  std::vector<double> out;
  for (std::uint16_t x : bits) out.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(x) << 16));
  return out;
}

/// Runs the GEMM on A and B drawn by `draw` (f32: run_linear; bf16 bits: run_linear_bf16, whose
/// products of two bf16 values are exact in f32, so only the f32 accumulation errs) and checks
/// every element against the fp64 loop, within 1e-5 of Σ|a||b| (+|bias|).
template <class T>
void check_linear(const char* kind, unsigned seed, std::vector<T> (*draw)(std::size_t, std::mt19937&), std::int64_t m,
                  std::int64_t n, std::int64_t k, bool with_bias, int threads, const GemmSpec& spec) {
  std::mt19937 gen(seed);
  const auto a = draw(static_cast<std::size_t>(m * k), gen);
  const auto b = draw(static_cast<std::size_t>(n * k), gen);
  const auto bias = random_vec(static_cast<std::size_t>(n), gen);
  std::vector<float> c(static_cast<std::size_t>(m * n), std::nanf(""));
  if constexpr (std::is_same_v<T, float>)
    run_linear(a.data(), b.data(), with_bias ? bias.data() : nullptr, c.data(), m, n, k, threads, spec);
  else
    run_linear_bf16(a.data(), b.data(), with_bias ? bias.data() : nullptr, c.data(), m, n, k, threads, spec);
  expect_fp64_sums(widened(a), widened(b), with_bias ? bias.data() : nullptr, c, m, n, k,
                   describe(kind, m, n, k, with_bias, threads));
}

void check(std::int64_t m, std::int64_t n, std::int64_t k, bool with_bias, int threads, const GemmSpec& spec = {}) {
  check_linear<float>("f32", static_cast<unsigned>(m * 1000003 + n * 1009 + k * 7 + with_bias), random_vec, m, n, k,
                      with_bias, threads, spec);
}

void check_bf16(std::int64_t m, std::int64_t n, std::int64_t k, bool with_bias, int threads,
                const GemmSpec& spec = {}) {
  check_linear<std::uint16_t>("bf16", static_cast<unsigned>(m * 7919 + n * 104729 + k * 13 + with_bias), random_bf16, m,
                              n, k, with_bias, threads, spec);
}

TEST(Gemm, MatchesFp64ReferenceOverOddShapes) {
  const std::int64_t sizes[] = {1, 3, 17, 64, 100, 513};
  for (std::int64_t m : sizes)
    for (std::int64_t n : sizes)
      for (std::int64_t k : sizes)
        for (int threads : {1, 2}) check(m, n, k, /*with_bias=*/(m + n + k + threads) % 2 == 0, threads);
}

TEST(Gemm, BiasAndNoBias) {
  for (bool with_bias : {false, true}) {
    check(100, 513, 17, with_bias, 2);
    check(513, 64, 513, with_bias, 1);
  }
}

TEST(Gemm, ForcedBlockings) {
  const GemmSpec specs[] = {
      {.vector_floats = 4, .rows = 3, .col_vectors = 1, .k_block = 5},
      {.vector_floats = 8, .rows = 6, .col_vectors = 2, .k_block = 16},
      {.vector_floats = 16, .rows = 5, .col_vectors = 3, .k_block = 7},
  };
  for (const auto& spec : specs)
    for (std::int64_t s : {1, 17, 100}) {
      check(s, 33, s, true, 2, spec);
      check(33, s, 65, false, 1, spec);
    }
}

TEST(Gemm, EmptyAndDegenerate) {
  std::vector<float> c(6, 7.0f);
  const float bias[3] = {1.0f, 2.0f, 3.0f};
  run_linear(nullptr, nullptr, bias, c.data(), 2, 3, 0, 1);  // K = 0: the bias alone
  EXPECT_EQ(c, (std::vector<float>{1, 2, 3, 1, 2, 3}));
  run_linear(nullptr, nullptr, nullptr, c.data(), 0, 3, 4, 1);  // nothing to do
  run_linear(nullptr, nullptr, nullptr, nullptr, 2, 0, 4, 1);
  EXPECT_THROW(run_linear(nullptr, nullptr, nullptr, c.data(), -1, 3, 4, 1), std::invalid_argument);
  EXPECT_THROW(run_linear(nullptr, nullptr, nullptr, c.data(), 2, 3, 4, 1), std::invalid_argument);
}

bool host_has_avx512bf16() {
  for (const auto& f : codegen::host_target().features)
    if (f == "+avx512bf16") return true;
  return false;
}

TEST(Gemm, Bf16MatchesFp64SumsOfTheSameProducts) {
  // Odd K leaves half a pair at the end of the last K block; N past a panel; M past a micro-tile.
  for (std::int64_t m : {1, 17, 100})
    for (std::int64_t n : {3, 64, 513})
      for (std::int64_t k : {1, 2, 17, 64, 513}) check_bf16(m, n, k, (m + n + k) % 2 == 0, 1 + (m + k) % 2);
}

TEST(Gemm, Bf16ForcedBlockings) {
  const GemmSpec specs[] = {
      {.k_block = 6},                                                    // pairs in several K blocks (k0 / 2 > 0)
      {.k_block = 5},                                                    // rounded up to whole pairs
      {.vector_floats = 8, .rows = 6, .col_vectors = 2, .k_block = 16},  // no vdpbf16ps: widened as packed
      {.vector_floats = 16, .rows = 5, .col_vectors = 3, .k_block = 7},
  };
  for (const auto& spec : specs)
    for (std::int64_t s : {1, 17, 100}) {
      check_bf16(s, 33, s, true, 2, spec);
      check_bf16(33, s, 65, false, 1, spec);
    }
}

TEST(Gemm, Bf16RunsOnVdpbf16psWhereTheHostHasIt) {
  GemmSpec spec;
  spec.bf16 = true;
  const auto info = codegen::cpu::prepare_linear(spec);
  const std::string ir = codegen::cpu::gemm_kernel_ir(spec, /*optimized=*/false);
  EXPECT_EQ(info.dpbf16, host_has_avx512bf16() && info.vector_floats == 16);
  EXPECT_EQ(ir.find("dpbf16ps") != std::string::npos, info.dpbf16);
  spec.vector_floats = 8;  // AVX2 widths: widened to f32
  EXPECT_FALSE(codegen::cpu::prepare_linear(spec).dpbf16);
  EXPECT_EQ(codegen::cpu::gemm_kernel_ir(spec, false).find("dpbf16ps"), std::string::npos);
  EXPECT_THROW(run_linear(nullptr, nullptr, nullptr, nullptr, 1, 1, 1, 1, GemmSpec{.bf16 = true}),
               std::invalid_argument);
}

TEST(Gemm, Throughput) {  // informative only
  const std::int64_t m = 2048, n = 512, k = 512;
  std::mt19937 gen(1);
  const auto a = random_vec(static_cast<std::size_t>(m * k), gen);
  const auto b = random_vec(static_cast<std::size_t>(n * k), gen);
  const auto bias = random_vec(static_cast<std::size_t>(n), gen);
  std::vector<float> c(static_cast<std::size_t>(m * n));
  for (int threads : {1, 2}) {
    run_linear(a.data(), b.data(), bias.data(), c.data(), m, n, k, threads);  // compile + warm up
    double best = 1e30;
    for (int rep = 0; rep < 10; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      run_linear(a.data(), b.data(), bias.data(), c.data(), m, n, k, threads);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("gemm M=%lld N=%lld K=%lld, %d thread(s): %.3f ms, %.1f GFLOP/s\n", static_cast<long long>(m),
                static_cast<long long>(n), static_cast<long long>(k), threads, best * 1e3,
                2.0 * m * n * k / best * 1e-9);
  }
}

}  // namespace
}  // namespace qkv
