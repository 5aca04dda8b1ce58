// The bf16 tensor-core attention kernel (codegen/nvptx/attention_mma_ptx.cpp) run in host
// emulation — its ldmatrix and mma.sync are warp-collective host functions with the PTX ISA's
// fragment layouts (emulated_gpu.cpp) — against the CPU's bf16 fused kernel.
//
// Tolerance. Both kernels read the same bf16 q, k, v; both round P to bf16 before P·V and the
// output to bf16, but sum in different orders (the CPU per key tile with Fast2Sum, the GPU per
// 16-key mma with a different rescaling schedule), so they do not agree bit for bit. Each is
// compared with a reference that rounds nothing — the CPU kernel with f32 storage on the very
// bf16 values decoded to f32 (fp32 throughout, error ~1e-6, far below bf16's 2^-9) — and the
// tensor-core kernel must be as accurate as the CPU bf16 kernel up to a factor 2 and 1e-3:
// max |gpu − ref| <= 2·max |cpu − ref| + 1e-3 (|v| <= 1, so |out| <= 1), the same of the mean
// error (+ 1e-5); and, independently of
// the CPU kernel, max |gpu − ref| <= 2e-2 · max |ref| (a few bf16 ulps of the largest output).
// Rows with no visible key must be exact zeros, lse within 1e-4·(1 + |lse|) of the reference
// (scores and the softmax statistics are fp32 in all three).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <qkv/codegen/cpu/run_attention.hpp>
#include <qkv/codegen/nvptx.hpp>
#include <qkv/ir/mod_expr.hpp>
#include <qkv/runtime/io/array.hpp>

#include "emulated_gpu.hpp"

namespace qkv {
namespace {

using namespace codegen::nvptx;
using emulation::emulate;
using emulation::Emulated;
using emulation::from_bf16;
using emulation::max_abs_diff;
using emulation::mean_abs_diff;
using emulation::to_bf16;

struct MmaCase {
  std::string label;
  AttentionKernel kernel;
  std::int64_t batch, len_q, len_k;
};

std::ostream& operator<<(std::ostream& os, const MmaCase& c) { return os << c.label; }

AttentionKernel bf16_attention(std::int64_t dk, std::int64_t dv, std::int64_t hq, std::int64_t hkv) {
  AttentionKernel a;
  a.spec.dk = dk;
  a.spec.dv = dv;
  a.spec.hq = hq;
  a.spec.hkv = hkv;
  a.spec.storage = DType::bf16;
  return a;
}

std::vector<MmaCase> mma_cases() {
  std::vector<MmaCase> cases;
  cases.push_back({"d64_gqa", bf16_attention(64, 64, 4, 2), 2, 70, 90});
  {
    auto a = bf16_attention(128, 128, 2, 1);
    a.spec.causal = true;
    a.spec.write_lse = true;
    cases.push_back({"d128_mqa_causal_top_left_lse", a, 1, 70, 90});
  }
  {
    // L > S bottom-right: the first L − S rows see no key; batch 1 has every key padded.
    auto a = bf16_attention(64, 64, 2, 2);
    a.spec.causal = true;
    a.spec.align = CausalAlign::bottom_right;
    a.spec.key_padding = true;
    a.spec.write_lse = true;
    cases.push_back({"d64_causal_bottom_right_padding_L_gt_S_lse", a, 2, 90, 70});
  }
  {
    auto a = bf16_attention(128, 128, 2, 2);
    a.spec.bias = true;
    a.spec.scale = 0.2;
    a.block_k = 32;
    cases.push_back({"d128_bias_scale_bk32", a, 1, 33, 130});
  }
  {
    auto a = bf16_attention(32, 64, 2, 1);  // dk != dv, two warps
    a.spec.causal = true;
    a.spec.align = CausalAlign::bottom_right;
    a.threads = 64;
    a.block_k = 16;
    cases.push_back({"dk32_dv64_two_warps_bk16_causal_bottom_right", a, 1, 40, 75});
  }
  {
    // A mod: a sliding window |i + S − L − j| <= 24 (whole tiles skipped) and an ALiBi-style
    // −0.25·|i + S − L − j| score term.
    auto a = bf16_attention(64, 64, 2, 1);
    ModBuilder x;
    const int score = x.score();
    const int q = x.leaf(ModOp::position, "q"), k = x.leaf(ModOp::index, "k");
    const int dist = x.op(ModOp::abs, x.op(ModOp::sub, q, k));
    x.replace_score(x.op(ModOp::sub, score, x.op(ModOp::mul, x.constant(0.25), dist)));
    x.keep_also(x.op(ModOp::le, dist, x.constant(24.0)));
    x.expr().query = "q";
    x.expr().key = "k";
    x.expr().align = CausalAlign::bottom_right;
    a.spec.mod = x.finish();
    a.spec.write_lse = true;
    cases.push_back({"d64_mod_window_alibi_lse", a, 1, 100, 200});
  }
  return cases;
}

struct Result {
  std::vector<float> out, lse;
};

struct Inputs {
  std::vector<std::uint16_t> q, k, v;
  std::vector<float> bias;
  std::vector<std::uint8_t> keep;
};

Inputs make_inputs(const codegen::cpu::AttentionSpec& s, std::int64_t B, std::int64_t L, std::int64_t S) {
  std::mt19937 gen(4321);
  Inputs in;
  // Queries up to ±2 so that softmax rows are peaked enough for P's rounding to matter.
  in.q = to_bf16(emulation::random_vec(static_cast<std::size_t>(B * s.hq * L * s.dk), gen, -2.0f, 2.0f));
  in.k = to_bf16(emulation::random_vec(static_cast<std::size_t>(B * s.hkv * S * s.dk), gen));
  in.v = to_bf16(emulation::random_vec(static_cast<std::size_t>(B * s.hkv * S * s.dv), gen));
  emulation::FlagMasks masks = emulation::flag_masks(s, B, L, S, gen);
  in.bias = std::move(masks.bias);
  in.keep = std::move(masks.keep);
  return in;
}

/// The CPU kernel with `storage`: bf16 reads the inputs' bits, f32 their values decoded.
Result run_cpu(codegen::cpu::AttentionSpec s, DType storage, const Inputs& in, std::int64_t B, std::int64_t L,
               std::int64_t S) {
  s.storage = storage;
  const auto out_n = static_cast<std::size_t>(B * s.hq * L * s.dv);
  Result r;
  r.lse.assign(s.write_lse ? static_cast<std::size_t>(B * s.hq * L) : 0, NAN);
  std::vector<float> qf = from_bf16(in.q), kf = from_bf16(in.k), vf = from_bf16(in.v), out_f(out_n);
  std::vector<std::uint16_t> out_h(out_n);
  codegen::cpu::AttentionArgs args;
  const bool half = storage == DType::bf16;
  args.q = half ? static_cast<const void*>(in.q.data()) : qf.data();
  args.k = half ? static_cast<const void*>(in.k.data()) : kf.data();
  args.v = half ? static_cast<const void*>(in.v.data()) : vf.data();
  args.out = half ? static_cast<void*>(out_h.data()) : out_f.data();
  args.key_keep = in.keep.empty() ? nullptr : in.keep.data();
  args.bias = in.bias.empty() ? nullptr : in.bias.data();
  args.batch = B;
  args.len_q = L;
  args.len_k = S;
  args.lse = s.write_lse ? r.lse.data() : nullptr;
  codegen::cpu::run_attention(s, args, 1);
  r.out = half ? from_bf16(out_h) : out_f;
  return r;
}

Result run_emulated(const AttentionKernel& kernel, const Inputs& in, std::int64_t B, std::int64_t L, std::int64_t S) {
  const auto& s = kernel.spec;
  std::vector<std::uint16_t> out(static_cast<std::size_t>(B * s.hq * L * s.dv), 0x7FC0);  // NaN: unwritten
  Result r;
  r.lse.assign(s.write_lse ? static_cast<std::size_t>(B * s.hq * L) : 0, NAN);
  Emulated e = emulate(kernel);
  using Fn = void(const std::uint16_t*, const std::uint16_t*, const std::uint16_t*, std::uint16_t*, float*,
                  const std::uint8_t*, const float*, const void* const*, const std::int64_t*, std::int64_t,
                  std::int64_t, std::int64_t, std::int64_t, float*);
  auto* fn = e.fn<Fn>();
  const Dim3 grid = attention_grid(kernel, B, L);
  if (grid.x > 0)
    e.launch(grid, [&] {
      fn(in.q.data(), in.k.data(), in.v.data(), out.data(), nullptr, in.keep.empty() ? nullptr : in.keep.data(),
         in.bias.empty() ? nullptr : in.bias.data(), nullptr, nullptr, B, L, S, 0,
         s.write_lse ? r.lse.data() : nullptr);
    });
  r.out = from_bf16(out);
  return r;
}

class EmulatedMmaAttention : public ::testing::TestWithParam<MmaCase> {};

TEST_P(EmulatedMmaAttention, AsAccurateAsTheCpuBf16Kernel) {
  const MmaCase& c = GetParam();
  const auto& s = c.kernel.spec;
  const std::int64_t B = c.batch, L = c.len_q, S = c.len_k;
  const Inputs in = make_inputs(s, B, L, S);
  const Result ref = run_cpu(s, DType::f32, in, B, L, S);
  const Result cpu = run_cpu(s, DType::bf16, in, B, L, S);
  const Result gpu = run_emulated(c.kernel, in, B, L, S);

  double ref_max = 0.0;
  for (float x : ref.out) ref_max = std::max(ref_max, std::fabs(static_cast<double>(x)));
  const double err_gpu = max_abs_diff(gpu.out, ref.out), err_cpu = max_abs_diff(cpu.out, ref.out);
  // The mean too: the largest errors are often the final bf16 rounding of the same large output,
  // equal in both kernels; the mean sees every element's accumulation.
  const double mean_gpu = mean_abs_diff(gpu.out, ref.out), mean_cpu = mean_abs_diff(cpu.out, ref.out);
  std::printf("[mma] %-48s max|ref| %.3f  max err gpu %.2e cpu %.2e  mean err gpu %.2e cpu %.2e\n", c.label.c_str(),
              ref_max, err_gpu, err_cpu, mean_gpu, mean_cpu);
  EXPECT_LE(err_gpu, 2.0 * err_cpu + 1e-3);
  EXPECT_LE(mean_gpu, 2.0 * mean_cpu + 1e-5);
  EXPECT_LE(err_gpu, 2e-2 * ref_max);
  EXPECT_GT(err_gpu, 0.0);  // P and out are rounded to bf16: an exact match would mean the f32 path ran
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    if (ref.out[i] == 0.0f) {
      ASSERT_EQ(gpu.out[i], 0.0f) << "a row with no visible key, element " << i;
    }
  }
  for (std::size_t i = 0; i < ref.lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      EXPECT_EQ(gpu.lse[i], ref.lse[i]) << "lse[" << i << "]";
    } else {
      EXPECT_NEAR(gpu.lse[i], ref.lse[i], 1e-4 * (1.0 + std::fabs(ref.lse[i]))) << "lse[" << i << "]";
    }
  }
}

std::string mma_case_name(const ::testing::TestParamInfo<MmaCase>& p) { return p.param.label; }

INSTANTIATE_TEST_SUITE_P(Emulation, EmulatedMmaAttention, ::testing::ValuesIn(mma_cases()), mma_case_name);

TEST(EmulatedMmaAttention, NoKeysGivesZerosAndMinusInfinityLse) {
  auto a = bf16_attention(64, 64, 2, 1);
  a.spec.write_lse = true;
  const Inputs in = make_inputs(a.spec, 1, 20, 0);
  const Result gpu = run_emulated(a, in, 1, 20, 0);
  for (float x : gpu.out) ASSERT_EQ(x, 0.0f);
  for (float x : gpu.lse) ASSERT_EQ(x, -INFINITY);
}

TEST(MmaAttention, UnsupportedSpecsAreRefusedWithAReason) {
  std::string why;
  EXPECT_TRUE(attention_supported(bf16_attention(64, 64, 1, 1), &why)) << why;
  EXPECT_TRUE(why.empty());
  auto refused = [&](AttentionKernel a, const char* reason) {
    EXPECT_FALSE(attention_supported(a, &why)) << reason;
    EXPECT_NE(why.find(reason), std::string::npos) << why;
    EXPECT_THROW(emit_ptx(a, 80), std::runtime_error);
  };
  refused(bf16_attention(72, 72, 1, 1), "multiples of 16");
  refused(bf16_attention(256, 256, 1, 1), "multiples of 16");
  auto w = bf16_attention(64, 64, 1, 1);
  w.spec.write_weights = true;
  refused(w, "weights");
  auto d = bf16_attention(64, 64, 1, 1);
  d.spec.dropout_p = 0.1;
  refused(d, "dropout");
  auto bq = bf16_attention(64, 64, 1, 1);
  bq.block_q = 32;
  refused(bq, "block_q");
  auto bk = bf16_attention(64, 64, 1, 1);
  bk.block_k = 24;
  refused(bk, "block_k");
  auto f16 = bf16_attention(64, 64, 1, 1);
  f16.spec.storage = DType::f16;
  refused(f16, "f16");
}

// ------------------------------------------------------------------------------------------------
// the bf16 tensor-core GEMM (linear_mma_ptx.cpp)

struct GemmCase {
  LinearKernel kernel;
  std::int64_t m, n, k;
  bool bias;
};

std::ostream& operator<<(std::ostream& os, const GemmCase& c) {
  return os << c.m << "x" << c.n << "x" << c.k << (c.bias ? " + bias" : "") << " tiles " << c.kernel.block_m << "x"
            << c.kernel.block_n << "x" << c.kernel.block_k;
}

class EmulatedMmaLinear : public ::testing::TestWithParam<GemmCase> {};

TEST_P(EmulatedMmaLinear, MatchesTheRoundedExactProduct) {
  // Reference: the exact Σ x·w (double) of the bf16 values plus the bias, rounded to f32 then to
  // bf16 — the CPU's linear of bf16 tensors up to its fp32 summation order. The kernel's fp32 sums
  // may round differently, moving y by at most one bf16 ulp (2^-8 relative) plus their own error.
  const GemmCase& c = GetParam();
  const std::int64_t M = c.m, N = c.n, K = c.k;
  std::mt19937 gen(99);
  const auto x = to_bf16(emulation::random_vec(static_cast<std::size_t>(M * K), gen));
  const auto w = to_bf16(emulation::random_vec(static_cast<std::size_t>(N * K), gen));
  const auto bias = to_bf16(emulation::random_vec(static_cast<std::size_t>(N), gen));
  std::vector<std::uint16_t> y(static_cast<std::size_t>(M * N), 0x7FC0);  // NaN: unwritten
  Emulated e = emulate(c.kernel);
  using Fn = void(const std::uint16_t*, const std::uint16_t*, const std::uint16_t*, std::uint16_t*, std::int64_t,
                  std::int64_t, std::int64_t);
  auto* fn = e.fn<Fn>();
  e.launch(linear_grid(c.kernel, M, N),
           [&] { fn(x.data(), w.data(), c.bias ? bias.data() : nullptr, y.data(), M, N, K); });
  std::size_t bad = 0;
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      double sum = c.bias ? bf16_to_f32(bias[static_cast<std::size_t>(j)]) : 0.0;
      for (std::int64_t d = 0; d < K; ++d)
        sum += static_cast<double>(bf16_to_f32(x[static_cast<std::size_t>(i * K + d)])) *
               bf16_to_f32(w[static_cast<std::size_t>(j * K + d)]);
      const double want = bf16_to_f32(f32_to_bf16(static_cast<float>(sum)));
      const double got = bf16_to_f32(y[static_cast<std::size_t>(i * N + j)]);
      if (!(std::fabs(got - want) <= std::fabs(want) / 256 + 1e-5 * static_cast<double>(K)) && ++bad <= 5)
        ADD_FAILURE() << "y[" << i << "][" << j << "]: got " << got << ", want " << want;
    }
  EXPECT_EQ(bad, 0u);
}

INSTANTIATE_TEST_SUITE_P(Emulation, EmulatedMmaLinear,
                         ::testing::Values(GemmCase{LinearKernel{64, 64, 32, DType::bf16}, 70, 90, 50, true},
                                           GemmCase{LinearKernel{32, 32, 16, DType::bf16}, 33, 17, 40, false},
                                           GemmCase{LinearKernel{16, 128, 64, DType::bf16}, 20, 130, 16, true}));

TEST(MmaLinear, UnsupportedTilingsThrow) {
  EXPECT_THROW(emit_ptx(LinearKernel{64, 64, 8, DType::bf16}, 80), std::runtime_error);
  EXPECT_THROW(emit_ptx(LinearKernel{24, 64, 16, DType::bf16}, 80), std::runtime_error);
  EXPECT_THROW(emit_ptx(LinearKernel{64, 64, 16, DType::f16}, 80), std::runtime_error);
  EXPECT_NE(kernel_name(LinearKernel{64, 64, 16, DType::bf16}), kernel_name(LinearKernel{64, 64, 16}));
}

}  // namespace
}  // namespace qkv
