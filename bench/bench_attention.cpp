// Forward attention on the CPU, B = 1, H = 8, D = 64 (the fused kernels also at D = 128), 2 threads,
// fp32 and bf16: the fused JIT kernel
// (qkv::codegen::cpu::run_attention) against, in the same run,
//   * the machine's measured FMA peak (a register-resident FMA loop on host-width vectors),
//   * OpenBLAS sgemm 2048³ (the practical limit of a well-tuned kernel),
//   * an unfused baseline: OpenBLAS Q·Kᵀ, a plain softmax, OpenBLAS P·V (N <= 4096; it
//     materialises the N×N matrix per head).
// GFLOP/s counts 4·B·H·N²·D (half for causal); pct_peak is against an FMA probe taken around
// each measurement (the cores of a shared VM change speed), x_unfused compares the fused and
// unfused kernels as fractions of their own peaks. Before the benchmarks, main() runs N = 16384
// once and reports the growth of the peak RSS (getrusage), which shows that the fused kernel
// allocates nothing of size N² (set QKV_BENCH_RSS=0 to skip it).
//
//   bench_attention --benchmark_min_time=0.01            (benchmark 1.7.1: a number, no "s")
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <immintrin.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <qkv/codegen/cpu/run_attention.hpp>

#include <qkv/ir/mod_expr.hpp>
#include <qkv/runtime/io/array.hpp>
#include "bench_util.hpp"
#include "peaks.hpp"

namespace {

using qkv::bench::Clock;
using qkv::bench::fma_rate;
using qkv::bench::has_avx512bf16;
using qkv::bench::kThreads;
using qkv::bench::probe_bf16_peak;
using qkv::bench::probe_peak;
using qkv::bench::random_values;
using qkv::bench::seconds_since;
using qkv::bench::wait_for_other_threads_to_block;
using qkv::codegen::cpu::AttentionArgs;
using qkv::codegen::cpu::AttentionSpec;

constexpr std::int64_t kHeads = 8;
constexpr std::int64_t kDim = 64;

// Shared between benchmarks of one run (they run in registration order).
std::map<std::pair<std::int64_t, bool>, double> g_unfused_fraction;             // GFLOP/s ÷ peak
std::map<std::tuple<std::int64_t, bool, std::int64_t>, double> g_fused_gflops;  // BM_Fused's, by (N, causal, D)

void BM_Bf16DotPeak(benchmark::State& state) {
  if (!has_avx512bf16()) {
    state.SkipWithError("no AVX512-BF16 on this CPU");
    return;
  }
  double best = 0;
  for (auto _ : state) best = std::max(best, probe_bf16_peak(40'000'000));
  state.counters["GFLOP/s"] = best;
}

void BM_FmaPeak(benchmark::State& state) {
  // The best of the iterations: the first ones may run before the clock has ramped up.
  double best = 0;
  int lanes = 0;
  for (auto _ : state) best = std::max(best, fma_rate(40'000'000, &lanes));
  state.counters["GFLOP/s"] = best;
  state.counters["lanes"] = lanes;
}

// --- OpenBLAS sgemm ---------------------------------------------------------------------------

void BM_Sgemm2048(benchmark::State& state) {
  constexpr int n = 2048;
  openblas_set_num_threads(kThreads);
  const auto a = random_values(std::size_t{n} * n, 1), b = random_values(std::size_t{n} * n, 2);
  std::vector<float> c(std::size_t{n} * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  double seconds = 0;
  const double peak_before = probe_peak();
  for (auto _ : state) {
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    seconds += seconds_since(t0);
    benchmark::DoNotOptimize(c.data());
  }
  const double peak = std::max(peak_before, probe_peak());
  const double gflops = 2.0 * n * n * n * static_cast<double>(state.iterations()) / seconds * 1e-9;
  state.counters["GFLOP/s"] = gflops;
  state.counters["peak"] = peak;
  state.counters["pct_peak"] = 100.0 * gflops / peak;
}

// --- attention: shared setup --------------------------------------------------------------------

struct Problem {
  std::int64_t n;
  bool causal;
  std::int64_t d;  // the head width (dk = dv)
  std::vector<float> q, k, v, out;
  explicit Problem(std::int64_t n_, bool causal_, std::int64_t d_ = kDim) : n(n_), causal(causal_), d(d_) {
    const auto size = static_cast<std::size_t>(kHeads * n * d);
    q = random_values(size, 11);
    k = random_values(size, 12);
    v = random_values(size, 13);
    out.assign(size, 0.0f);
  }
  [[nodiscard]] double flops() const;
};

AttentionSpec bench_spec(bool causal, std::int64_t d = kDim) {
  AttentionSpec s;
  s.dk = s.dv = d;
  s.hq = s.hkv = kHeads;
  s.causal = causal;
  return s;
}

double Problem::flops() const { return qkv::codegen::cpu::attention_flops(bench_spec(causal, d), 1, n, n); }

AttentionArgs args_of(Problem& p) {
  AttentionArgs a;
  a.q = p.q.data();
  a.k = p.k.data();
  a.v = p.v.data();
  a.out = p.out.data();
  a.batch = 1;
  a.len_q = a.len_k = p.n;
  return a;
}

/// Counters of an attention benchmark: GFLOP/s, the FMA peak around it, the percentage of that
/// peak, and for the fused kernel the ratio to the unfused baseline at the same N (as fractions
/// of their own peaks, so that a change in machine speed between the two does not skew it).
void report(benchmark::State& state, const Problem& p, double seconds, double peak, const char* kind) {
  const double gflops = p.flops() * static_cast<double>(state.iterations()) / seconds * 1e-9;
  state.counters["GFLOP/s"] = gflops;
  state.counters["peak"] = peak;
  state.counters["pct_peak"] = 100.0 * gflops / peak;
  if (std::string(kind) == "unfused") {
    g_unfused_fraction[{p.n, p.causal}] = gflops / peak;
  } else if (auto it = g_unfused_fraction.find({p.n, p.causal}); it != g_unfused_fraction.end()) {
    state.counters["x_unfused"] = gflops / peak / it->second;
  }
}

// --- unfused baseline: sgemm, softmax, sgemm ----------------------------------------------------

/// Row-wise softmax of s [n, n] (rows [r0, r1)), causal rows over keys <= row only.
void softmax_rows(float* s, std::int64_t n, std::int64_t r0, std::int64_t r1, bool causal) {
  for (std::int64_t i = r0; i < r1; ++i) {
    float* row = s + i * n;
    const std::int64_t visible = causal ? i + 1 : n;
    float mx = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < visible; ++j) mx = std::max(mx, row[j]);
    float sum = 0;
    for (std::int64_t j = 0; j < visible; ++j) sum += (row[j] = std::exp(row[j] - mx));
    const float inv = 1.0f / sum;
    for (std::int64_t j = 0; j < visible; ++j) row[j] *= inv;
    for (std::int64_t j = visible; j < n; ++j) row[j] = 0.0f;
  }
}

void unfused_attention(Problem& p, std::vector<float>& scores) {
  const auto n = static_cast<int>(p.n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  for (std::int64_t h = 0; h < kHeads; ++h) {
    const float* q = p.q.data() + h * p.n * kDim;
    const float* k = p.k.data() + h * p.n * kDim;
    const float* v = p.v.data() + h * p.n * kDim;
    float* o = p.out.data() + h * p.n * kDim;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, kDim, scale, q, kDim, k, kDim, 0.0f, scores.data(), n);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back(softmax_rows, scores.data(), p.n, p.n * t / kThreads, p.n * (t + 1) / kThreads, p.causal);
    for (auto& t : threads) t.join();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, kDim, n, 1.0f, scores.data(), n, v, kDim, 0.0f, o, kDim);
  }
}

void BM_Unfused(benchmark::State& state) {
  openblas_set_num_threads(kThreads);
  Problem p(state.range(0), state.range(1) != 0);
  std::vector<float> scores(static_cast<std::size_t>(p.n * p.n));
  unfused_attention(p, scores);  // warm-up
  double seconds = 0;
  const double peak_before = probe_peak();
  for (auto _ : state) {
    const auto t0 = Clock::now();
    unfused_attention(p, scores);
    seconds += seconds_since(t0);
    benchmark::DoNotOptimize(p.out.data());
  }
  report(state, p, seconds, std::max(peak_before, probe_peak()), "unfused");
}

// --- the fused kernel ---------------------------------------------------------------------------

/// Times the fused kernel on `spec` over the state's iterations (compiled first) and reports it
/// against the FMA peak probed around it.
void time_fused(benchmark::State& state, Problem& p, const AttentionSpec& spec, const char* kind) {
  wait_for_other_threads_to_block();  // OpenBLAS's workers from the unfused baseline
  const AttentionArgs args = args_of(p);
  qkv::codegen::cpu::run_attention(spec, args, kThreads);  // compiles (or fetches) the kernel
  double seconds = 0;
  const double peak_before = probe_peak();
  for (auto _ : state) {
    const auto t0 = Clock::now();
    qkv::codegen::cpu::run_attention(spec, args, kThreads);
    seconds += seconds_since(t0);
    benchmark::DoNotOptimize(p.out.data());
  }
  report(state, p, seconds, std::max(peak_before, probe_peak()), kind);
}

void BM_Fused(benchmark::State& state) {
  Problem p(state.range(0), state.range(1) != 0, state.range(2));
  time_fused(state, p, bench_spec(p.causal, p.d), "fused");
  g_fused_gflops[{p.n, p.causal, p.d}] = state.counters["GFLOP/s"];
}

/// BM_Fused with the blocking of the "avx512" row of the tuning table forced (4 query vectors ×
/// 4 keys, tiles of 64: what split-pipe AVX-512 hosts such as Zen 4 run): x_table = BM_Fused's
/// GFLOP/s (the table's choice for this host) over this one's, at the same N, in this run.
void BM_FusedSplitPipeRow(benchmark::State& state) {
  Problem p(state.range(0), state.range(1) != 0);
  AttentionSpec spec = bench_spec(p.causal);
  spec.query_vectors = spec.qk_keys = spec.pv_dims = 4;
  spec.key_tile = 64;
  time_fused(state, p, spec, "split-pipe row");
  if (auto it = g_fused_gflops.find({p.n, p.causal, p.d}); it != g_fused_gflops.end())
    state.counters["x_table"] = it->second / state.counters["GFLOP/s"];
}

/// The fused kernel on bf16 q, k, v and out (the same values rounded): GFLOP/s, against the FMA
/// peak and the vdpbf16ps peak probed around it, and x_fp32 = its GFLOP/s over BM_Fused's at the
/// same N in this run. dpbf16 = 1 when the kernel runs on vdpbf16ps (else it converts as it loads).
void BM_FusedBf16(benchmark::State& state) {
  wait_for_other_threads_to_block();
  Problem p(state.range(0), state.range(1) != 0, state.range(2));
  AttentionSpec spec = bench_spec(p.causal, p.d);
  spec.storage = qkv::DType::bf16;
  auto bits = [](const std::vector<float>& x) {
    std::vector<std::uint16_t> out(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) out[i] = qkv::f32_to_bf16(x[i]);
    return out;
  };
  const auto q = bits(p.q), k = bits(p.k), v = bits(p.v);
  std::vector<std::uint16_t> out(q.size());
  AttentionArgs args = args_of(p);
  args.q = q.data();
  args.k = k.data();
  args.v = v.data();
  args.out = out.data();
  qkv::codegen::cpu::run_attention(spec, args, kThreads);
  double seconds = 0;
  const double peak_before = probe_peak(), bf16_before = probe_bf16_peak();
  for (auto _ : state) {
    const auto t0 = Clock::now();
    qkv::codegen::cpu::run_attention(spec, args, kThreads);
    seconds += seconds_since(t0);
    benchmark::DoNotOptimize(out.data());
  }
  const double peak = std::max(peak_before, probe_peak()), bf16_peak = std::max(bf16_before, probe_bf16_peak());
  const double gflops = p.flops() * static_cast<double>(state.iterations()) / seconds * 1e-9;
  state.counters["GFLOP/s"] = gflops;
  state.counters["peak"] = peak;
  state.counters["pct_peak"] = 100.0 * gflops / peak;
  state.counters["bf16_peak"] = bf16_peak;
  if (bf16_peak > 0) state.counters["pct_bf16_peak"] = 100.0 * gflops / bf16_peak;
  state.counters["dpbf16"] = qkv::codegen::cpu::prepare_attention(spec).dpbf16 ? 1 : 0;
  if (auto it = g_fused_gflops.find({p.n, p.causal, p.d}); it != g_fused_gflops.end())
    state.counters["x_fp32"] = gflops / it->second;
}

// --- score / mask modifications ----------------------------------------------------------------
// The mod expression compiled into the kernel (qkv/ir/mod_expr.hpp), side by side with plain
// attention at the same N. GFLOP/s counts the useful FLOPs (entries the mask keeps); x_plain is
// that rate over plain attention's at the same N, in the same run.

enum class ModCase : std::int64_t { plain, alibi, softcap, window256, docs8, docs8_dense_mask };
constexpr std::int64_t kWindow = 256, kDocs = 8;

struct ModProblem {
  Problem p;
  ModCase c;
  AttentionSpec spec = bench_spec(false);
  std::vector<float> slopes, q_doc, kv_doc, dense;
  std::vector<const void*> tensors;
  std::vector<std::int64_t> extents;
  ModProblem(std::int64_t n, ModCase mc) : p(n, false), c(mc) {
    using namespace qkv;
    ModBuilder m;
    const std::string b = "b", h = "h", q = "q", k = "k";
    switch (c) {
      case ModCase::plain:
        break;
      case ModCase::alibi: {  // score − slope[h]·|i − j|, slopes 2^(−8(h+1)/H)
        for (std::int64_t i = 0; i < kHeads; ++i) slopes.push_back(std::exp2(-8.0f * float(i + 1) / kHeads));
        tensors = {slopes.data()};
        extents = {kHeads};
        spec.tensors = {{qkv::codegen::cpu::ModTensor::Source::captured, DType::f32, 1}};
        const int dist = m.op(ModOp::abs, m.op(ModOp::sub, m.leaf(ModOp::position, q), m.leaf(ModOp::position, k)));
        const int slope = m.load_by_axes(0, {h});
        m.expr().query = q;
        m.expr().key = k;
        m.add_to_score(m.op(ModOp::neg, m.op(ModOp::mul, slope, dist)));
        break;
      }
      case ModCase::softcap: {  // 30·tanh(s / 30): replaces the score
        const int cap = m.constant(30.0);
        m.replace_score(m.op(ModOp::mul, cap, m.op(ModOp::tanh, m.op(ModOp::div, m.score(), cap))));
        break;
      }
      case ModCase::window256: {  // i − 256 <= j <= i
        m.expr().query = q;
        m.expr().key = k;
        const int qi = m.leaf(ModOp::position, q), kj = m.leaf(ModOp::position, k);
        m.keep_also(m.op(ModOp::ge, kj, m.op(ModOp::sub, qi, m.constant(kWindow))));
        m.keep_also(m.op(ModOp::le, kj, qi));
        break;
      }
      case ModCase::docs8: {  // 8 packed documents of equal length: q_doc[b][i] == kv_doc[b][j]
        for (std::int64_t i = 0; i < n; ++i) q_doc.push_back(static_cast<float>(i * kDocs / n));
        kv_doc = q_doc;
        tensors = {q_doc.data(), kv_doc.data()};
        extents = {1, n, 1, n};
        const auto f32 = qkv::codegen::cpu::ModTensor{qkv::codegen::cpu::ModTensor::Source::captured, DType::f32, 2};
        spec.tensors = {f32, f32};
        m.keep_also(m.op(ModOp::eq, m.load_by_axes(0, {b, q}), m.load_by_axes(1, {b, k})));
        break;
      }
      case ModCase::docs8_dense_mask:  // the same documents as an explicit [L, S] bias of 0 / −inf
        dense.assign(static_cast<std::size_t>(n * n), -std::numeric_limits<float>::infinity());
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t j = 0; j < n; ++j)
            if (i * kDocs / n == j * kDocs / n) dense[static_cast<std::size_t>(i * n + j)] = 0.0f;
        spec.bias = true;
        break;
    }
    spec.mod = m.finish();
  }
  [[nodiscard]] double useful_flops() const {
    const double n = static_cast<double>(p.n), per_entry = 4.0 * kHeads * kDim;
    switch (c) {
      case ModCase::window256: {
        double kept = 0;
        for (std::int64_t i = 0; i < p.n; ++i) kept += static_cast<double>(std::min<std::int64_t>(i + 1, kWindow + 1));
        return per_entry * kept;
      }
      case ModCase::docs8:
      case ModCase::docs8_dense_mask:
        return per_entry * n * n / kDocs;
      default:
        return per_entry * n * n;
    }
  }
  AttentionArgs args() {
    AttentionArgs a = args_of(p);
    a.tensors = tensors.empty() ? nullptr : tensors.data();
    a.extents = extents.empty() ? nullptr : extents.data();
    a.bias = dense.empty() ? nullptr : dense.data();
    return a;
  }
};

std::map<std::int64_t, double> g_plain_fraction;  // N → plain attention's GFLOP/s ÷ peak

void BM_Mod(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const auto c = static_cast<ModCase>(state.range(1));
  ModProblem mp(n, c);
  const AttentionArgs args = mp.args();
  qkv::codegen::cpu::run_attention(mp.spec, args, kThreads);  // compiles the kernel
  double seconds = 0;
  const double peak_before = probe_peak();
  for (auto _ : state) {
    const auto t0 = Clock::now();
    qkv::codegen::cpu::run_attention(mp.spec, args, kThreads);
    seconds += seconds_since(t0);
    benchmark::DoNotOptimize(mp.p.out.data());
  }
  const double peak = std::max(peak_before, probe_peak());
  const double per_call = seconds / static_cast<double>(state.iterations());
  const double gflops = mp.useful_flops() / per_call * 1e-9;
  state.counters["GFLOP/s"] = gflops;
  state.counters["peak"] = peak;
  state.counters["pct_peak"] = 100.0 * gflops / peak;
  state.counters["ms_per_1k_queries"] = per_call * 1e3 / (static_cast<double>(n) / 1000.0);
  if (c == ModCase::plain) g_plain_fraction[n] = gflops / peak;
  if (auto it = g_plain_fraction.find(n); it != g_plain_fraction.end())
    state.counters["x_plain"] = gflops / peak / it->second;
}

// --- JIT compile time ---------------------------------------------------------------------------

/// Cold: an empty kernel cache and no JIT (so jit_create_ms is counted apart), then the kernel
/// generated, optimised and compiled.
void BM_JitCompileCold(benchmark::State& state) {
  double build = 0, compile = 0, create = 0;
  // mod = 1: the sliding-window and ALiBi kernels of BM_Mod instead (causal ignored).
  const AttentionSpec spec = state.range(1) == 0
                                 ? bench_spec(state.range(0) != 0)
                                 : ModProblem(64, state.range(1) == 1 ? ModCase::window256 : ModCase::alibi).spec;
  for (auto _ : state) {
    qkv::codegen::cpu::clear_attention_cache();
    const auto info = qkv::codegen::cpu::prepare_attention(spec);
    build += info.build_ms;
    compile += info.compile_ms;
    create += info.jit_create_ms;
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["ir_ms"] = build / n;
  state.counters["compile_ms"] = compile / n;
  state.counters["kernel_ms"] = (build + compile) / n;
  state.counters["jit_create_ms"] = create / n;
}

BENCHMARK(BM_FmaPeak)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5);
BENCHMARK(BM_Bf16DotPeak)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5);
BENCHMARK(BM_Sgemm2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Unfused)
    ->ArgNames({"N", "causal"})
    ->ArgsProduct({{512, 1024, 2048, 4096}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Fused)
    ->ArgNames({"N", "causal", "D"})
    ->ArgsProduct({{512, 1024, 2048, 4096, 8192, 16384}, {0, 1}, {64, 128}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_FusedSplitPipeRow)
    ->ArgNames({"N", "causal"})
    ->ArgsProduct({{2048, 4096, 8192}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_FusedBf16)
    ->ArgNames({"N", "causal", "D"})
    ->ArgsProduct({{512, 1024, 2048, 4096, 8192, 16384}, {0, 1}, {64, 128}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Mod)
    ->ArgNames({"N", "mod"})
    ->Args({4096, 0})
    ->Args({4096, 1})
    ->Args({4096, 2})
    ->Args({4096, 3})
    ->Args({8192, 0})
    ->Args({8192, 3})
    ->Args({8192, 4})
    ->Args({8192, 5})
    ->Args({16384, 0})
    ->Args({16384, 3})
    ->Args({32768, 3})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_JitCompileCold)
    ->ArgNames({"causal", "mod"})
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 1})
    ->Args({0, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(5);

long peak_rss_kb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

/// Peak RSS growth of one fused forward pass at N = 16384 (first thing in the process, so that
/// no earlier benchmark has raised the peak): the inputs and output (4 × 32 MiB) plus whatever
/// the kernel, the JIT and the threads add — an N×N score matrix would be 8 GiB.
void report_rss_growth() {
  const char* env = std::getenv("QKV_BENCH_RSS");
  if (env && std::string(env) == "0") return;
  constexpr std::int64_t n = 16384;
  const long before = peak_rss_kb();
  double tensors_mb = 0;
  {
    Problem p(n, true);
    tensors_mb = 4.0 * static_cast<double>(p.q.size()) * sizeof(float) / (1 << 20);
    qkv::codegen::cpu::run_attention(bench_spec(true), args_of(p), kThreads);
  }
  const double growth_mb = static_cast<double>(peak_rss_kb() - before) / 1024.0;
  std::printf(
      "peak RSS growth, fused causal N=16384 (B=1, H=8, D=64): %.1f MiB (q, k, v, out: %.1f MiB; other: %.1f MiB)\n",
      growth_mb, tensors_mb, growth_mb - tensors_mb);
  benchmark::AddCustomContext("rss_growth_n16384_mib", std::to_string(growth_mb));
  benchmark::AddCustomContext("rss_tensors_n16384_mib", std::to_string(tensors_mb));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  report_rss_growth();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
