// The dense GPU kernels' host emulations (emulated_gpu.hpp) against the CPU kernels (linear,
// layer norm, GELU/ReLU/add) or exact expectations (scale, strided copy).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <qkv/codegen/cpu/gemm.hpp>
#include <qkv/codegen/cpu/rowwise.hpp>
#include <qkv/codegen/nvptx.hpp>

#include "emulated_gpu.hpp"

namespace qkv {
namespace {

using namespace codegen::nvptx;
using emulation::emulate;
using emulation::Emulated;
using emulation::expect_close;
using emulation::random_vec;

// ------------------------------------------------------------------------------------------------
// the dense kernels

TEST(EmulatedDense, LinearMatchesCpuGemm) {
  std::mt19937 gen(7);
  for (const LinearKernel kernel : {LinearKernel{}, LinearKernel{32, 64, 8}}) {
    for (const bool with_bias : {true, false}) {
      const std::int64_t M = 70, N = 45, K = 37;
      const auto x = random_vec(static_cast<std::size_t>(M * K), gen);
      const auto w = random_vec(static_cast<std::size_t>(N * K), gen);
      const auto b = random_vec(static_cast<std::size_t>(N), gen);
      std::vector<float> want(static_cast<std::size_t>(M * N)), got(want.size(), NAN);
      codegen::cpu::run_linear(x.data(), w.data(), with_bias ? b.data() : nullptr, want.data(), M, N, K, 1);
      Emulated e = emulate(kernel);
      auto* fn =
          e.fn<void(const float*, const float*, const float*, float*, std::int64_t, std::int64_t, std::int64_t)>();
      e.launch(linear_grid(kernel, M, N),
               [&] { fn(x.data(), w.data(), with_bias ? b.data() : nullptr, got.data(), M, N, K); });
      expect_close(got, want, 1e-5, "linear");
    }
  }
}

TEST(EmulatedDense, LayerNormMatchesCpu) {
  std::mt19937 gen(8);
  const LayerNormKernel kernel{64};
  const std::int64_t rows = 5, n = 77;
  const auto x = random_vec(static_cast<std::size_t>(rows * n), gen, -3.0f, 5.0f);
  const auto gamma = random_vec(static_cast<std::size_t>(n), gen);
  const auto beta = random_vec(static_cast<std::size_t>(n), gen);
  std::vector<float> want(x.size()), got(x.size(), NAN);
  codegen::cpu::run_layer_norm(x.data(), gamma.data(), beta.data(), want.data(), rows, n, 1e-5, 1);
  Emulated e = emulate(kernel);
  auto* fn = e.fn<void(const float*, const float*, const float*, float*, std::int64_t, std::int64_t, float)>();
  e.launch(layer_norm_grid(kernel, rows), [&] { fn(x.data(), gamma.data(), beta.data(), got.data(), rows, n, 1e-5f); });
  expect_close(got, want, 1e-5, "layer_norm");
}

TEST(EmulatedDense, ElementwiseMatchesCpu) {
  std::mt19937 gen(9);
  const std::int64_t count = 1000;  // 3 blocks of 64 threads: the grid-stride loop wraps
  auto a = random_vec(static_cast<std::size_t>(count), gen, -8.0f, 8.0f);
  a[0] = -0.0f;
  a[1] = NAN;
  a[2] = INFINITY;
  a[3] = -INFINITY;
  const auto bvec = random_vec(static_cast<std::size_t>(count), gen);
  using Fn = void(const float*, const float*, float*, std::int64_t);
  for (const ElementwiseOp op : {ElementwiseOp::relu, ElementwiseOp::gelu, ElementwiseOp::add, ElementwiseOp::scale}) {
    std::vector<float> want(a.size()), got(a.size(), 123.0f);
    switch (op) {
      case ElementwiseOp::relu:
        codegen::cpu::run_relu(a.data(), want.data(), count, 1);
        break;
      case ElementwiseOp::gelu:
        codegen::cpu::run_gelu(a.data(), want.data(), count, 1);
        break;
      case ElementwiseOp::add:
        codegen::cpu::run_add(a.data(), bvec.data(), want.data(), count, 1);
        break;
      case ElementwiseOp::scale:
        for (std::size_t i = 0; i < a.size(); ++i) want[i] = a[i] * 0.375f;
        break;
    }
    Emulated e = emulate(ElementwiseKernel{op, 0.375f, 64});
    auto* fn = e.fn<Fn>();
    e.launch(Dim3{3, 1, 1}, [&] { fn(a.data(), bvec.data(), got.data(), count); });
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(want[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << static_cast<int>(op) << " at " << i;
      } else if (std::isinf(want[i])) {
        EXPECT_EQ(got[i], want[i]) << static_cast<int>(op) << " at " << i;
      } else {
        EXPECT_NEAR(got[i], want[i], 1e-6 * (1.0 + std::fabs(want[i]))) << static_cast<int>(op) << " at " << i;
        EXPECT_EQ(std::signbit(got[i]), std::signbit(want[i])) << static_cast<int>(op) << " at " << i;
      }
    }
  }
}

TEST(EmulatedDense, StridedCopyPermutesSlicesBroadcasts) {
  using Fn = void(const float*, float*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                  std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                  std::int64_t, std::int64_t);
  std::vector<float> src(2 * 3 * 4 * 5);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  Emulated e4 = emulate(StridedCopyKernel{4, 64});
  {
    // permute [2,3,4,5] → [5,3,2,4]: out[a][b][c][d] = src[c][b][d][a]
    std::vector<float> got(src.size(), NAN);
    e4.launch(Dim3{1, 1, 1},
              [&] { e4.fn<Fn>()(src.data(), got.data(), 120, 0, 5, 3, 2, 4, 1, 1, 1, 20, 60, 5, 0, 0); });
    std::size_t i = 0;
    for (int a = 0; a < 5; ++a)
      for (int b = 0; b < 3; ++b)
        for (int c = 0; c < 2; ++c)
          for (int d = 0; d < 4; ++d, ++i)
            ASSERT_EQ(got[i], src[static_cast<std::size_t>(c * 60 + b * 20 + d * 5 + a)]);
  }
  Emulated e2 = emulate(StridedCopyKernel{2, 64});
  {
    // slice src viewed as [24, 5]: rows 3..9, columns 1..3 (offset 3·5 + 1), then broadcast a row
    std::vector<float> got(21, NAN);
    e2.launch(Dim3{2, 1, 1}, [&] { e2.fn<Fn>()(src.data(), got.data(), 21, 16, 7, 3, 1, 1, 1, 1, 5, 1, 0, 0, 0, 0); });
    for (int r = 0; r < 7; ++r)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(got[static_cast<std::size_t>(r * 3 + c)], src[static_cast<std::size_t>((3 + r) * 5 + 1 + c)]);
    std::vector<float> bc(4 * 5, NAN);
    e2.launch(Dim3{1, 1, 1}, [&] { e2.fn<Fn>()(src.data(), bc.data(), 20, 10, 4, 5, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0); });
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 5; ++c)
        ASSERT_EQ(bc[static_cast<std::size_t>(r * 5 + c)], src[static_cast<std::size_t>(10 + c)]);
  }
}

}  // namespace
}  // namespace qkv
