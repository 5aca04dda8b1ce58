// Attention backward on the CPU, B = 1, H = 8, D = 64, 2 threads, fp32: the fused backward
// (qkv::codegen::cpu::run_attention_backward, FlashAttention-2's algorithm) against, in the same
// run, the machine's measured FMA peak and an unfused baseline (OpenBLAS: forward Q·Kᵀ, softmax,
// P·V; backward dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P ∘ (dP − D), dQ = dS·K, dK = dSᵀ·Q, the N×N
// matrices materialised per head).
//
// GFLOP/s of the backward counts 2.5 × the forward's 4·B·H·N²·D (FlashAttention's convention;
// half for causal); forward + backward counts 3.5 ×. pct_peak is against an FMA probe taken
// around each measurement (a vdpbf16ps probe for bf16 where the host has AVX512-BF16: the
// kernels' products run on it); x_unfused is the fused forward + backward's speed over the
// unfused one's at the same N (as fractions of their own peaks). BM_FusedBackward also runs, at
// N = 2048, a softcap over ALiBi (with the slopes' gradient: variant 1), dropout 0.1 (variant 2)
// and bf16 q, k, v, O, dO and gradients (variant 3): what the mod's derivatives, the replayed
// mask and bf16 cost. BM_FusedForwardBackward runs bf16 at N = 1024 … 4096 too, beside
// `bench/pytorch_attention.py backward` (PyTorch 1.13's autograd of the same attention).
//
//   bench_attention_backward --benchmark_min_time=0.01
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include <qkv/codegen/cpu/run_attention.hpp>
#include <qkv/codegen/cpu/run_attention_backward.hpp>
#include <qkv/runtime/io/array.hpp>

#include "bench_util.hpp"
#include "peaks.hpp"

namespace {

using qkv::bench::Clock;
using qkv::bench::kThreads;
using qkv::bench::probe_peak;
using qkv::bench::random_values;
using qkv::bench::seconds_since;
using qkv::bench::wait_for_other_threads_to_block;
using qkv::codegen::cpu::AttentionArgs;
using qkv::codegen::cpu::AttentionBackwardArgs;
using qkv::codegen::cpu::AttentionSpec;

constexpr std::int64_t kHeads = 8, kDim = 64;

std::map<std::int64_t, double> g_unfused_fraction;  // forward + backward: GFLOP/s ÷ peak, by N

/// 0: plain; 1: softcap(30) over ALiBi with the slopes' gradient; 2: dropout 0.1.
enum Variant : std::int64_t { kPlain = 0, kSoftcapAlibi = 1, kDropout = 2, kBf16 = 3 };

struct Problem {
  std::int64_t n;
  bool causal;
  std::int64_t variant = kPlain;
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv;
  std::vector<float> slopes, dslopes;
  std::vector<std::uint16_t> half[8];  // kBf16: q, k, v, out, dout, dq, dk, dv as bf16 bits (lse stays f32)
  const void* tensors[1] = {nullptr};
  std::int64_t extents[1] = {kHeads};
  float* dtensors[1] = {nullptr};
  Problem(std::int64_t n_, bool causal_, std::int64_t variant_ = kPlain) : n(n_), causal(causal_), variant(variant_) {
    const auto size = static_cast<std::size_t>(kHeads * n * kDim);
    q = random_values(size, 11);
    k = random_values(size, 12);
    v = random_values(size, 13);
    dout = random_values(size, 14);
    out.assign(size, 0.0f);
    dq.assign(size, 0.0f);
    dk.assign(size, 0.0f);
    dv.assign(size, 0.0f);
    lse.assign(static_cast<std::size_t>(kHeads * n), 0.0f);
    for (std::int64_t h = 0; h < kHeads; ++h) slopes.push_back(std::exp2(-static_cast<float>(h + 1)));
    dslopes.assign(slopes.size(), 0.0f);
    tensors[0] = slopes.data();
    dtensors[0] = dslopes.data();
    if (variant == kBf16) {
      const std::vector<float>* from[] = {&q, &k, &v, &out, &dout, &dq, &dk, &dv};
      for (int i = 0; i < 8; ++i)
        for (float x : *from[i]) half[i].push_back(qkv::f32_to_bf16(x));
    }
  }
  /// Array i of {q, k, v, out, dout, dq, dk, dv} as the variant stores it.
  void* stored(int i) {
    std::vector<float>* from[] = {&q, &k, &v, &out, &dout, &dq, &dk, &dv};
    return variant == kBf16 ? static_cast<void*>(half[i].data()) : static_cast<void*>(from[i]->data());
  }
  [[nodiscard]] AttentionSpec spec(bool lse_too) const {
    AttentionSpec s;
    s.dk = s.dv = kDim;
    s.hq = s.hkv = kHeads;
    s.causal = causal;
    s.write_lse = lse_too;
    if (variant == kDropout) s.dropout_p = 0.1;
    if (variant == kBf16) s.storage = qkv::DType::bf16;
    if (variant == kSoftcapAlibi) {  // 30 · tanh((s − slope[h] · |q − k|) / 30)
      using qkv::ModOp;
      qkv::ModExpr& e = s.mod;
      auto leaf = [&](ModOp op, const char* axis) {
        qkv::ModNode x;
        x.op = op;
        x.axis = axis;
        return e.add(std::move(x));
      };
      qkv::ModNode load;
      load.op = ModOp::load;
      load.input = 0;
      load.at = {leaf(ModOp::index, "h")};
      const int slope = e.add(std::move(load));
      const int dist = e.add(qkv::mod_node(
          ModOp::abs, e.add(qkv::mod_node(ModOp::sub, leaf(ModOp::index, "q"), leaf(ModOp::index, "k")))));
      const int biased =
          e.add(qkv::mod_node(ModOp::sub, leaf(ModOp::score, ""), e.add(qkv::mod_node(ModOp::mul, slope, dist))));
      const int cap = e.add(qkv::mod_constant(30.0));
      e.score = e.add(qkv::mod_node(ModOp::mul, cap,
                                    e.add(qkv::mod_node(ModOp::tanh, e.add(qkv::mod_node(ModOp::div, biased, cap))))));
      s.axes.heads = {{"h", 1, kHeads}};
      s.tensors = {{qkv::codegen::cpu::ModTensor::Source::captured, qkv::DType::f32, 1}};
      if (!lse_too) s.tensor_grads = {{.tensor = 0, .per_batch = true, .per_kv_head = false, .per_chunk = true}};
    }
    return s;
  }
  [[nodiscard]] double forward_flops() const { return qkv::codegen::cpu::attention_flops(spec(false), 1, n, n); }
  AttentionArgs forward_args() {
    AttentionArgs a;
    a.q = stored(0);
    a.k = stored(1);
    a.v = stored(2);
    a.out = stored(3);
    a.lse = lse.data();
    a.batch = 1;
    a.len_q = a.len_k = n;
    a.seed = 42;
    a.tensors = tensors;
    a.extents = extents;
    return a;
  }
  AttentionBackwardArgs backward_args() {
    AttentionBackwardArgs b;
    b.forward = forward_args();
    b.d_out = stored(4);
    b.dq = stored(5);
    b.dk = stored(6);
    b.dv = stored(7);
    b.dtensors = dtensors;
    return b;
  }
};

/// The peak a problem's products run against: vdpbf16ps for bf16 storage where the host has it
/// (the kernel's products then run on it), else the FMA.
double problem_peak(const Problem& p) {
  return p.variant == kBf16 && qkv::bench::has_avx512bf16() ? qkv::bench::probe_bf16_peak() : probe_peak();
}

void report(benchmark::State& state, double flops, double seconds, double peak) {
  const double gflops = flops * static_cast<double>(state.iterations()) / seconds * 1e-9;
  state.counters["GFLOP/s"] = gflops;
  state.counters["peak"] = peak;
  state.counters["pct_peak"] = 100.0 * gflops / peak;
}

/// The fused backward alone (the forward's output and log-sum-exp computed once before).
void BM_FusedBackward(benchmark::State& state) {
  wait_for_other_threads_to_block();
  Problem p(state.range(0), state.range(1) != 0, state.range(2));
  qkv::codegen::cpu::run_attention(p.spec(true), p.forward_args(), kThreads);
  const AttentionBackwardArgs b = p.backward_args();
  qkv::codegen::cpu::run_attention_backward(p.spec(false), b, kThreads);  // compiles the kernel
  double seconds = 0;
  const double peak_before = problem_peak(p);
  for (auto _ : state) {
    const auto t0 = Clock::now();
    qkv::codegen::cpu::run_attention_backward(p.spec(false), b, kThreads);
    seconds += seconds_since(t0);
    benchmark::DoNotOptimize(p.dq.data());
  }
  report(state, 2.5 * p.forward_flops(), seconds, std::max(peak_before, problem_peak(p)));
}

/// The fused forward (writing its log-sum-exp) then the fused backward.
void BM_FusedForwardBackward(benchmark::State& state) {
  wait_for_other_threads_to_block();
  Problem p(state.range(0), state.range(1) != 0, state.range(2));
  const AttentionArgs a = p.forward_args();
  const AttentionBackwardArgs b = p.backward_args();
  qkv::codegen::cpu::run_attention(p.spec(true), a, kThreads);
  qkv::codegen::cpu::run_attention_backward(p.spec(false), b, kThreads);
  double seconds = 0;
  const double peak_before = problem_peak(p);
  for (auto _ : state) {
    const auto t0 = Clock::now();
    qkv::codegen::cpu::run_attention(p.spec(true), a, kThreads);
    qkv::codegen::cpu::run_attention_backward(p.spec(false), b, kThreads);
    seconds += seconds_since(t0);
    benchmark::DoNotOptimize(p.dq.data());
  }
  const double peak = std::max(peak_before, problem_peak(p));
  report(state, 3.5 * p.forward_flops(), seconds, peak);
  if (auto it = g_unfused_fraction.find(p.n); it != g_unfused_fraction.end() && !p.causal && p.variant == kPlain)
    state.counters["x_unfused"] = state.counters["GFLOP/s"] / peak / it->second;
}

/// Rows [r0, r1) of the unfused softmax (in place) and then, after dP, of dS = P ∘ (dP − D).
void softmax_rows(float* s, std::int64_t n, std::int64_t r0, std::int64_t r1) {
  for (std::int64_t i = r0; i < r1; ++i) {
    float* row = s + i * n;
    float mx = row[0];
    for (std::int64_t j = 1; j < n; ++j) mx = std::max(mx, row[j]);
    float sum = 0;
    for (std::int64_t j = 0; j < n; ++j) sum += (row[j] = std::exp(row[j] - mx));
    const float inv = 1.0f / sum;
    for (std::int64_t j = 0; j < n; ++j) row[j] *= inv;
  }
}
void ds_rows(const float* p, float* dp, const float* o, const float* dout, std::int64_t n, std::int64_t r0,
             std::int64_t r1) {
  for (std::int64_t i = r0; i < r1; ++i) {
    float d = 0;
    for (std::int64_t c = 0; c < kDim; ++c) d += o[i * kDim + c] * dout[i * kDim + c];
    for (std::int64_t j = 0; j < n; ++j) dp[i * n + j] = p[i * n + j] * (dp[i * n + j] - d);
  }
}
template <class F>
void on_threads(std::int64_t n, F f) {
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(f, n * t / kThreads, n * (t + 1) / kThreads);
  for (auto& t : threads) t.join();
}

/// Forward and backward, unfused, head by head on OpenBLAS (non-causal).
void unfused(Problem& p, std::vector<float>& s, std::vector<float>& ds) {
  const auto n = static_cast<int>(p.n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  for (std::int64_t h = 0; h < kHeads; ++h) {
    const std::int64_t off = h * p.n * kDim;
    const float *q = p.q.data() + off, *k = p.k.data() + off, *v = p.v.data() + off, *dout = p.dout.data() + off;
    float *o = p.out.data() + off, *dq = p.dq.data() + off, *dk = p.dk.data() + off, *dv = p.dv.data() + off;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, kDim, scale, q, kDim, k, kDim, 0.0f, s.data(), n);
    on_threads(p.n, [&](std::int64_t r0, std::int64_t r1) { softmax_rows(s.data(), p.n, r0, r1); });
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, kDim, n, 1.0f, s.data(), n, v, kDim, 0.0f, o, kDim);
    // backward
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, kDim, n, 1.0f, s.data(), n, dout, kDim, 0.0f, dv, kDim);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, kDim, 1.0f, dout, kDim, v, kDim, 0.0f, ds.data(), n);
    on_threads(p.n, [&](std::int64_t r0, std::int64_t r1) { ds_rows(s.data(), ds.data(), o, dout, p.n, r0, r1); });
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, kDim, n, scale, ds.data(), n, k, kDim, 0.0f, dq, kDim);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, kDim, n, scale, ds.data(), n, q, kDim, 0.0f, dk, kDim);
  }
}

void BM_UnfusedForwardBackward(benchmark::State& state) {
  openblas_set_num_threads(kThreads);
  Problem p(state.range(0), false);
  std::vector<float> s(static_cast<std::size_t>(p.n * p.n)), ds(s.size());
  unfused(p, s, ds);  // warm-up
  double seconds = 0;
  const double peak_before = probe_peak();
  for (auto _ : state) {
    const auto t0 = Clock::now();
    unfused(p, s, ds);
    seconds += seconds_since(t0);
    benchmark::DoNotOptimize(p.dq.data());
  }
  const double peak = std::max(peak_before, probe_peak());
  report(state, 3.5 * p.forward_flops(), seconds, peak);
  g_unfused_fraction[p.n] = state.counters["GFLOP/s"] / peak;
}

void sizes(benchmark::internal::Benchmark* b, bool causal_too, bool variants = false) {
  for (std::int64_t n : {1024, 2048, 4096, 8192}) {
    b->Args({n, 0, kPlain});
    if (causal_too) b->Args({n, 1, kPlain});
    if (variants && n == 2048)
      for (std::int64_t v : {kSoftcapAlibi, kDropout, kBf16}) b->Args({n, 0, v});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_UnfusedForwardBackward)->Apply([](auto* b) {
  for (std::int64_t n : {1024, 2048, 4096}) b->Args({n});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
});
BENCHMARK(BM_FusedBackward)->Apply([](auto* b) { sizes(b, true, true); });
BENCHMARK(BM_FusedForwardBackward)->Apply([](auto* b) {
  sizes(b, true);
  for (std::int64_t n : {1024, 2048, 4096})  // beside bench/pytorch_attention.py backward's bf16 rows
    for (std::int64_t causal : {0, 1}) b->Args({n, causal, kBf16});
});

}  // namespace

BENCHMARK_MAIN();
