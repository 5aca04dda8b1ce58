// The bf16 tensor-core attention backward (codegen/nvptx/attention_backward_mma_ptx.cpp: its dq
// kernel, then its dkdv kernel) run in host emulation — ldmatrix and mma.sync as warp-collective
// host functions with the PTX ISA's fragment layouts (emulated_gpu.cpp) — on bf16 q, k, v, out and
// dO, against the CPU kernels.
//
// The reference is the CPU's f32 backward on the very same values decoded to f32 (fp32
// throughout: ~1e-6, far below bf16's 2^-9). The bound is the CPU bf16 backward's own
// (AttentionBackwardKernel.Bf16FollowsTheF32KernelOnTheSameValues in
// tests/numerics/test_attention_backward.cpp): max |gpu − ref| <= 1e-2 · max |ref| per gradient.
// Where this host's CPU kernel rounds P and dS to bf16 as the tensor-core kernels do (vdpbf16ps:
// AVX512-BF16), the GPU must also be as accurate as it up to FlashAttention's factor 2:
// max |gpu − ref| <= 2 · max |cpu − ref| + 1e-3 · max |ref|, and the same of the mean error
// (+ 1e-5 · max |ref|). D = rowsum(dO ∘ O) (delta, f32) is
// checked against an fp64 sum of the same bf16 values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <qkv/codegen/cpu/run_attention.hpp>
#include <qkv/codegen/cpu/run_attention_backward.hpp>
#include <qkv/codegen/cpu/tuning.hpp>
#include <qkv/codegen/jit.hpp>
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
using Bits = std::vector<std::uint16_t>;
constexpr std::uint64_t kSeed = 0x5eed;  // the dropout's Philox key

struct BwdCase {
  std::string label;
  AttentionBackwardKernel kernel;  // part and blocks: the dq kernel's (the dkdv kernel's: its defaults)
  std::int64_t batch, len_q, len_k;
  std::vector<std::vector<std::int64_t>> tensor_shapes{};  // spec.tensors (f32, each differentiated)
};

std::ostream& operator<<(std::ostream& os, const BwdCase& c) { return os << c.label; }

AttentionBackwardKernel bf16_backward(std::int64_t dk, std::int64_t dv, std::int64_t hq, std::int64_t hkv) {
  AttentionBackwardKernel a;
  a.spec.dk = dk;
  a.spec.dv = dv;
  a.spec.hq = hq;
  a.spec.hkv = hkv;
  a.spec.storage = DType::bf16;
  a.spec.write_lse = true;
  return a;
}

std::vector<BwdCase> backward_cases() {
  std::vector<BwdCase> cases;
  {
    auto a = bf16_backward(64, 64, 4, 2);
    a.spec.key_padding = true;
    cases.push_back({"d64_gqa_padding", a, 1, 70, 90});
  }
  {
    auto a = bf16_backward(128, 128, 2, 1);
    a.spec.causal = true;
    cases.push_back({"d128_mqa_causal_top_left", a, 1, 40, 50});
  }
  {
    // L > S bottom-right: the first L − S rows see no key; batch 1 has every key padded.
    auto a = bf16_backward(64, 64, 2, 2);
    a.spec.causal = true;
    a.spec.align = CausalAlign::bottom_right;
    a.spec.key_padding = true;
    cases.push_back({"d64_causal_bottom_right_padding_L_gt_S", a, 2, 60, 45});
  }
  {
    auto a = bf16_backward(32, 64, 2, 1);  // dk != dv, two warps, bias, scale, dropout
    a.spec.bias = true;
    a.spec.scale = 0.2;
    a.spec.dropout_p = 0.2;
    a.threads = 64;
    a.block_k = 16;
    cases.push_back({"dk32_dv64_two_warps_bias_scale_dropout", a, 1, 40, 75});
  }
  {
    // A mod with a derivative far from 1 and whole tiles skipped: 2·tanh(s / 2) − 0.25·|i + S − L − j|,
    // kept where |i + S − L − j| <= 24.
    auto a = bf16_backward(64, 64, 2, 1);
    ModBuilder x;
    const int cap = x.constant(2.0);
    const int soft = x.op(ModOp::mul, cap, x.op(ModOp::tanh, x.op(ModOp::div, x.score(), cap)));
    const int q = x.leaf(ModOp::position, "q"), k = x.leaf(ModOp::index, "k");
    const int dist = x.op(ModOp::abs, x.op(ModOp::sub, q, k));
    x.replace_score(x.op(ModOp::sub, soft, x.op(ModOp::mul, x.constant(0.25), dist)));
    x.keep_also(x.op(ModOp::le, dist, x.constant(24.0)));
    x.expr().query = "q";
    x.expr().key = "k";
    x.expr().align = CausalAlign::bottom_right;
    a.spec.mod = x.finish();
    a.spec.scale = 0.5;
    cases.push_back({"d64_mod_softcap_window_alibi", a, 1, 100, 120});
  }
  {
    // Learned mod tensors and their gradients: ALiBi with slopes per query head [4] (a load the
    // same over a tile: summed block-wide) and a per-key bias [S] (entry by entry), GQA, causal.
    auto a = bf16_backward(32, 32, 4, 2);
    a.spec.causal = true;
    ModBuilder x;
    const int q = x.leaf(ModOp::position, "q"), k = x.leaf(ModOp::index, "k");
    const int dist = x.op(ModOp::abs, x.op(ModOp::sub, q, k));
    const int slope = x.load(0, {x.leaf(ModOp::index, "h")});
    x.replace_score(x.op(ModOp::add, x.op(ModOp::sub, x.score(), x.op(ModOp::mul, slope, dist)), x.load(1, {k})));
    x.expr().query = "q";
    x.expr().key = "k";
    a.spec.mod = x.finish();
    a.spec.tensors = {{codegen::cpu::ModTensor::Source::captured, DType::f32, 1},
                      {codegen::cpu::ModTensor::Source::captured, DType::f32, 1}};
    a.spec.tensor_grads = {{0}, {1}};
    cases.push_back({"d32_gqa_causal_alibi_slopes_key_bias_grads", a, 2, 50, 70, {{4}, {70}}});
  }
  return cases;
}

/// A case's bf16 inputs, and the forward's out (bf16) and lse from the CPU's bf16 kernel.
struct Problem {
  Bits q, k, v, out, d_out;
  std::vector<float> lse, bias;
  std::vector<std::uint8_t> keep;
  std::vector<std::vector<float>> tensors;  // spec.tensors' data
  std::vector<const void*> tensor_ptrs;
  std::vector<std::int64_t> extents;
};

Problem make_problem(const BwdCase& c) {
  const auto& s = c.kernel.spec;
  const std::int64_t B = c.batch, L = c.len_q, S = c.len_k;
  std::mt19937 gen(2468);
  Problem p;
  p.tensors.reserve(c.tensor_shapes.size());
  for (const auto& shape : c.tensor_shapes) {
    std::int64_t n = 1;
    for (std::int64_t e : shape) n *= e;
    p.tensors.push_back(emulation::random_vec(static_cast<std::size_t>(n), gen, 0.0f, 1.0f));
    p.tensor_ptrs.push_back(p.tensors.back().data());
    p.extents.insert(p.extents.end(), shape.begin(), shape.end());
  }
  p.q = to_bf16(emulation::random_vec(static_cast<std::size_t>(B * s.hq * L * s.dk), gen, -2.0f, 2.0f));
  p.k = to_bf16(emulation::random_vec(static_cast<std::size_t>(B * s.hkv * S * s.dk), gen));
  p.v = to_bf16(emulation::random_vec(static_cast<std::size_t>(B * s.hkv * S * s.dv), gen));
  p.d_out = to_bf16(emulation::random_vec(static_cast<std::size_t>(B * s.hq * L * s.dv), gen));
  emulation::FlagMasks masks = emulation::flag_masks(s, B, L, S, gen);
  p.bias = std::move(masks.bias);
  p.keep = std::move(masks.keep);
  p.out.assign(static_cast<std::size_t>(B * s.hq * L * s.dv), 0);
  p.lse.assign(static_cast<std::size_t>(B * s.hq * L), NAN);
  codegen::cpu::AttentionArgs f;
  f.q = p.q.data();
  f.k = p.k.data();
  f.v = p.v.data();
  f.out = p.out.data();
  f.key_keep = p.keep.empty() ? nullptr : p.keep.data();
  f.bias = p.bias.empty() ? nullptr : p.bias.data();
  f.tensors = p.tensor_ptrs.empty() ? nullptr : p.tensor_ptrs.data();
  f.extents = p.extents.empty() ? nullptr : p.extents.data();
  f.batch = B;
  f.len_q = L;
  f.len_k = S;
  f.seed = kSeed;
  f.lse = p.lse.data();
  codegen::cpu::run_attention(s, f, 1);
  return p;
}

struct Grads {
  std::vector<float> dq, dk, dv;
  std::vector<std::vector<float>> dtensors;  // per spec.tensor_grads entry
};

/// The CPU backward with `storage`: bf16 reads the problem's bits, f32 their values decoded.
Grads run_cpu(codegen::cpu::AttentionSpec s, DType storage, Problem p, std::int64_t B, std::int64_t L, std::int64_t S) {
  s.storage = storage;
  const bool half = storage == DType::bf16;
  std::vector<float> qf = from_bf16(p.q), kf = from_bf16(p.k), vf = from_bf16(p.v), of = from_bf16(p.out),
                     dof = from_bf16(p.d_out);
  Bits dq_h(p.q.size()), dk_h(p.k.size()), dv_h(p.v.size());
  Grads g{std::vector<float>(p.q.size()), std::vector<float>(p.k.size()), std::vector<float>(p.v.size()), {}};
  std::vector<float*> dtensors;
  for (const auto& t : s.tensor_grads) {
    g.dtensors.emplace_back(p.tensors.at(static_cast<std::size_t>(t.tensor)).size(), NAN);
    dtensors.push_back(g.dtensors.back().data());
  }
  codegen::cpu::AttentionBackwardArgs a;
  a.dtensors = dtensors.data();
  a.forward.tensors = p.tensor_ptrs.empty() ? nullptr : p.tensor_ptrs.data();
  a.forward.extents = p.extents.empty() ? nullptr : p.extents.data();
  auto pick = [&](Bits& h, std::vector<float>& f) { return half ? static_cast<void*>(h.data()) : f.data(); };
  a.forward.q = pick(p.q, qf);
  a.forward.k = pick(p.k, kf);
  a.forward.v = pick(p.v, vf);
  a.forward.out = pick(p.out, of);
  a.forward.key_keep = p.keep.empty() ? nullptr : p.keep.data();
  a.forward.bias = p.bias.empty() ? nullptr : p.bias.data();
  a.forward.batch = B;
  a.forward.len_q = L;
  a.forward.len_k = S;
  a.forward.seed = kSeed;
  a.forward.lse = p.lse.data();
  a.d_out = pick(p.d_out, dof);
  a.dq = pick(dq_h, g.dq);
  a.dk = pick(dk_h, g.dk);
  a.dv = pick(dv_h, g.dv);
  codegen::cpu::run_attention_backward(s, a, 1);
  if (half) {
    g.dq = from_bf16(dq_h);
    g.dk = from_bf16(dk_h);
    g.dv = from_bf16(dv_h);
  }
  return g;
}

Grads run_emulated(const BwdCase& c, const Problem& p, std::vector<float>& delta) {
  const std::int64_t B = c.batch, L = c.len_q, S = c.len_k;
  Bits dq(p.q.size(), 0x7FC0), dk(p.k.size(), 0x7FC0), dv(p.v.size(), 0x7FC0);  // NaN: unwritten
  delta.assign(p.lse.size(), NAN);
  using Fn =
      void(const std::uint16_t*, const std::uint16_t*, const std::uint16_t*, const std::uint16_t*, const std::uint16_t*,
           const float*, float*, std::uint16_t*, std::uint16_t*, std::uint16_t*, const std::uint8_t*, const float*,
           const void* const*, const std::int64_t*, std::int64_t, std::int64_t, std::int64_t, std::int64_t);
  // The tensor gradients' partial sums: a slot per dkdv block (NaN until the block zeroes it),
  // their addresses after the extents in the tensor table; the dtensor kernel leaves the sum in
  // slot 0.
  AttentionBackwardKernel dkdv = c.kernel;
  dkdv.part = AttentionBackwardKernel::Part::dkdv;
  dkdv.block_q = dkdv.block_k = 0;
  const Dim3 blocks = attention_backward_grid(dkdv, B, L, S);
  std::vector<std::vector<float>> partials;
  std::vector<std::int64_t> table = p.extents;
  for (const auto& t : c.kernel.spec.tensor_grads) {
    partials.emplace_back(p.tensors.at(static_cast<std::size_t>(t.tensor)).size() *
                              static_cast<std::size_t>(blocks.x * blocks.y * blocks.z),
                          NAN);
    table.push_back(static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(partials.back().data())));
  }
  std::vector<AttentionBackwardKernel> kernels{c.kernel, dkdv};
  kernels[0].part = AttentionBackwardKernel::Part::dq;
  if (!partials.empty()) {
    kernels.push_back(dkdv);
    kernels.back().part = AttentionBackwardKernel::Part::dtensor;
  }
  for (const AttentionBackwardKernel& kernel : kernels) {
    Emulated e = emulate(kernel);
    auto* fn = e.fn<Fn>();
    e.launch(attention_backward_grid(kernel, B, L, S), [&] {
      fn(p.q.data(), p.k.data(), p.v.data(), p.out.data(), p.d_out.data(), p.lse.data(), delta.data(), dq.data(),
         dk.data(), dv.data(), p.keep.empty() ? nullptr : p.keep.data(), p.bias.empty() ? nullptr : p.bias.data(),
         p.tensor_ptrs.empty() ? nullptr : p.tensor_ptrs.data(), table.empty() ? nullptr : table.data(), B, L, S,
         static_cast<std::int64_t>(kSeed));
    });
  }
  Grads g{from_bf16(dq), from_bf16(dk), from_bf16(dv), {}};
  for (std::size_t t = 0; t < partials.size(); ++t)
    g.dtensors.emplace_back(partials[t].begin(),
                            partials[t].begin() + static_cast<std::ptrdiff_t>(p.tensors[t].size()));
  return g;
}

double max_abs(const std::vector<float>& a) {
  double m = 0.0;
  for (float x : a) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

class EmulatedMmaBackward : public ::testing::TestWithParam<BwdCase> {};

TEST_P(EmulatedMmaBackward, AsAccurateAsTheCpuBf16Backward) {
  const BwdCase& c = GetParam();
  const auto& s = c.kernel.spec;
  const std::int64_t B = c.batch, L = c.len_q, S = c.len_k;
  const Problem p = make_problem(c);
  const Grads ref = run_cpu(s, DType::f32, p, B, L, S);
  const Grads cpu = run_cpu(s, DType::bf16, p, B, L, S);
  std::vector<float> delta;
  const Grads gpu = run_emulated(c, p, delta);
  // The CPU kernel rounds P and dS as the tensor-core kernels do where it runs on vdpbf16ps.
  const bool same_rule = codegen::cpu::bf16_dot_products(codegen::jit_target(), 16);

  const std::vector<float> Grads::* grads[] = {&Grads::dq, &Grads::dk, &Grads::dv};
  const char* names[] = {"dq", "dk", "dv"};
  for (int t = 0; t < 3; ++t) {
    const auto& r = ref.*grads[t];
    const double scale = max_abs(r), err_gpu = max_abs_diff(gpu.*grads[t], r), err_cpu = max_abs_diff(cpu.*grads[t], r),
                 mean_gpu = mean_abs_diff(gpu.*grads[t], r), mean_cpu = mean_abs_diff(cpu.*grads[t], r);
    std::printf("[mma bwd] %-40s %s  max|ref| %.3f  max err gpu %.2e cpu %.2e  mean err gpu %.2e cpu %.2e (%s)\n",
                c.label.c_str(), names[t], scale, err_gpu, err_cpu, mean_gpu, mean_cpu,
                same_rule ? "the same rounding" : "the CPU keeps P, dS in f32");
    ASSERT_GT(scale, 0.0) << names[t];
    EXPECT_LE(err_gpu, 1e-2 * scale) << names[t];
    EXPECT_GT(err_gpu, 0.0) << names[t] << ": bf16 storage rounds every gradient";
    if (same_rule) {
      EXPECT_LE(err_gpu, 2.0 * err_cpu + 1e-3 * scale) << names[t];
      // The largest errors are often the final rounding of the same largest gradient, equal in
      // both; the mean sees every element's sums.
      EXPECT_LE(mean_gpu, 2.0 * mean_cpu + 1e-5 * scale) << names[t];
    }
  }
  // The mod tensors' gradients: f32 sums of ∂L/∂score' ∘ ∂f/∂T, not rounded (P and dS are
  // rounded only as the operands of the tensor-core products), in another order than the CPU's.
  for (std::size_t t = 0; t < ref.dtensors.size(); ++t) {
    const double scale = max_abs(ref.dtensors[t]), err = max_abs_diff(gpu.dtensors[t], ref.dtensors[t]);
    std::printf("[mma bwd] %-40s dtensor %zu  max|ref| %.3f  max err gpu %.2e\n", c.label.c_str(), t, scale, err);
    ASSERT_GT(scale, 0.0);
    EXPECT_LE(err, 1e-4 * scale) << "tensor gradient " << t;
  }
  const std::vector<float> out = from_bf16(p.out), d_out = from_bf16(p.d_out);
  for (std::size_t row = 0; row < delta.size(); ++row) {  // D = rowsum(dO ∘ O)
    double d = 0;
    for (std::int64_t col = 0; col < s.dv; ++col) {
      const std::size_t at = row * static_cast<std::size_t>(s.dv) + static_cast<std::size_t>(col);
      d += static_cast<double>(d_out[at]) * out[at];
    }
    ASSERT_NEAR(delta[row], d, 1e-5 * (1 + std::abs(d))) << "row " << row;
  }
}

std::string bwd_case_name(const ::testing::TestParamInfo<BwdCase>& p) { return p.param.label; }

INSTANTIATE_TEST_SUITE_P(Emulation, EmulatedMmaBackward, ::testing::ValuesIn(backward_cases()), bwd_case_name);

TEST(MmaBackward, UnsupportedSpecsAreRefusedWithAReason) {
  std::string why;
  EXPECT_TRUE(attention_backward_supported(bf16_backward(64, 64, 1, 1), &why)) << why;
  auto refused = [&](AttentionBackwardKernel a, const char* reason) {
    EXPECT_FALSE(attention_backward_supported(a, &why)) << reason;
    EXPECT_NE(why.find(reason), std::string::npos) << why;
    EXPECT_THROW(emit_ptx(a, 80), std::runtime_error);
  };
  refused(bf16_backward(72, 72, 1, 1), "multiples of 16");
  refused(bf16_backward(256, 256, 1, 1), "multiples of 16");
  auto bq = bf16_backward(64, 64, 1, 1);
  bq.block_q = 32;  // the dq kernel's own rows: 16 a warp
  refused(bq, "block_q");
  auto bk = bf16_backward(64, 64, 1, 1);
  bk.part = AttentionBackwardKernel::Part::dkdv;
  bk.block_q = 24;
  refused(bk, "block_q");
  auto grads = bf16_backward(64, 64, 1, 1);
  grads.spec.tensor_grads.push_back({});  // of a tensor the mod does not have
  refused(grads, "not an f32 tensor of the mod");
  auto sums = bf16_backward(64, 64, 1, 1);
  sums.part = AttentionBackwardKernel::Part::dtensor;
  refused(sums, "without gradients of a mod's tensors");
  auto f16 = bf16_backward(64, 64, 1, 1);
  f16.spec.storage = DType::f16;
  refused(f16, "f16");
  EXPECT_NE(kernel_name(bf16_backward(64, 64, 1, 1)), kernel_name([] {
              auto f = bf16_backward(64, 64, 1, 1);
              f.spec.storage = DType::f32;
              return f;
            }()));
}

}  // namespace
}  // namespace qkv
