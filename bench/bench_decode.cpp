// Decode attention on the CPU, fp32, 2 threads: one query row per head (L = 1) against a KV cache
// of S keys, B = 1, Hq = 32 query heads over Hkv = 8 key/value heads (GQA), D = 128 — the
// attention of one decode step of a Llama-3-8B-shaped layer. The step is bound by memory: it
// reads 2·Hkv·S·D·4 bytes of K and V and does ~4·Hq·S·D flops on them. Measured side by side in
// one run:
//   * BM_ReadBandwidth: a STREAM-like read of a 1 GiB array on 2 threads (vector loads, four
//     independent sums per thread) — the machine's read bandwidth right now;
//   * BM_Decode/split_kv: qkv's split-KV decode kernel (keys in the lanes, each K/V row loaded
//     once for the 4 query heads of its group, chunks merged by their log-sum-exp);
//   * BM_Decode/fused: the fused prefill kernel on the same call (decode_queries = −1), the
//     baseline: its lanes run over query rows, so at L = 1 it uses one lane in 16.
//   * the same two on bf16 storage (AttentionSpec::storage; the third argument 1): q, K, V and
//     out bf16, K and V widened as loaded, f32 inside — half the bytes per step.
// Counters: GB/s of K and V read per step (4 bytes per element for fp32, 2 for bf16), x_read_bw
// (÷ the read bandwidth probed before and after the measurement, the larger of the two), x_fused
// (split-KV ÷ fused, same S and dtype), x_fp32_time (bf16 split-KV: the fp32 split-KV's time per
// step ÷ its own, same S).
//
//   bench_decode --benchmark_min_time=0.05
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <qkv/codegen/cpu/run_attention.hpp>

#include "bench_util.hpp"

namespace {

using qkv::bench::Clock;
using qkv::bench::random_values;
using qkv::bench::seconds_since;
using qkv::codegen::cpu::AttentionArgs;
using qkv::codegen::cpu::AttentionSpec;

constexpr int kThreads = 2;
constexpr std::int64_t kHq = 32, kHkv = 8, kDim = 128;

// --- read bandwidth ---------------------------------------------------------------------------

__attribute__((target("avx512f"))) float sum_avx512(const float* p, std::int64_t n) {
  __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
  std::int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a = _mm512_add_ps(a, _mm512_loadu_ps(p + i));
    b = _mm512_add_ps(b, _mm512_loadu_ps(p + i + 16));
    c = _mm512_add_ps(c, _mm512_loadu_ps(p + i + 32));
    d = _mm512_add_ps(d, _mm512_loadu_ps(p + i + 48));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
  float s = 0;
  for (float x : lanes) s += x;
  for (; i < n; ++i) s += p[i];
  return s;
}

__attribute__((target("avx2"))) float sum_avx2(const float* p, std::int64_t n) {
  __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
  std::int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = _mm256_add_ps(a, _mm256_loadu_ps(p + i));
    b = _mm256_add_ps(b, _mm256_loadu_ps(p + i + 8));
    c = _mm256_add_ps(c, _mm256_loadu_ps(p + i + 16));
    d = _mm256_add_ps(d, _mm256_loadu_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  float s = 0;
  for (float x : lanes) s += x;
  for (; i < n; ++i) s += p[i];
  return s;
}

float sum(const float* p, std::int64_t n) {
  if (__builtin_cpu_supports("avx512f")) return sum_avx512(p, n);
  if (__builtin_cpu_supports("avx2")) return sum_avx2(p, n);
  float s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += p[i];
  return s;
}

/// The array the bandwidth probe reads: 1 GiB, far past any cache.
const std::vector<float>& stream_array() {
  static const std::vector<float> a(std::size_t{1} << 28, 1.0f);
  return a;
}

/// GB/s of one read of `bytes` of the array, split between kThreads threads.
double read_rate(std::size_t bytes) {
  const std::vector<float>& a = stream_array();
  const std::int64_t n = static_cast<std::int64_t>(std::min(bytes / 4, a.size()));
  std::vector<float> sinks(kThreads);
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      const std::int64_t begin = n * t / kThreads, end = n * (t + 1) / kThreads;
      sinks[static_cast<std::size_t>(t)] = sum(a.data() + begin, end - begin);
    });
  for (auto& t : threads) t.join();
  const double s = seconds_since(t0);
  benchmark::DoNotOptimize(sinks.data());
  return static_cast<double>(n) * 4 / s * 1e-9;
}

/// The best of three reads of 512 MiB: the bandwidth as the machine delivers it right now.
double probe_bandwidth() {
  double best = 0;
  for (int i = 0; i < 3; ++i) best = std::max(best, read_rate(std::size_t{1} << 29));
  return best;
}

void BM_ReadBandwidth(benchmark::State& state) {
  double best = 0;
  for (auto _ : state) best = std::max(best, read_rate(stream_array().size() * 4));
  state.counters["GB/s"] = best;
}

// --- decode attention -------------------------------------------------------------------------

std::map<std::pair<std::int64_t, bool>, double> g_fused_gbps;  // by (S, bf16), for x_fused (fused runs first)
std::map<std::int64_t, double> g_fp32_step;                    // fp32 split-KV seconds per step, by S

void BM_Decode(benchmark::State& state) {
  const std::int64_t s = state.range(0);
  const bool split = state.range(1) != 0;
  const bool bf16 = state.range(2) != 0;
  AttentionSpec spec;
  spec.dk = spec.dv = kDim;
  spec.hq = kHq;
  spec.hkv = kHkv;
  spec.causal = true;
  spec.align = qkv::CausalAlign::bottom_right;
  spec.decode_queries = split ? 0 : -1;
  const auto q = random_values(static_cast<std::size_t>(kHq * kDim), 1);
  const auto k = random_values(static_cast<std::size_t>(kHkv * s * kDim), 2);
  const auto v = random_values(static_cast<std::size_t>(kHkv * s * kDim), 3);
  std::vector<float> out(static_cast<std::size_t>(kHq * kDim));
  // bf16: the top halves of the values (truncated: the data's values do not matter here).
  auto halves = [](const std::vector<float>& x) {
    std::vector<std::uint16_t> h(x.size());
    for (std::size_t i = 0; i < x.size(); ++i)
      h[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x[i]) >> 16);
    return h;
  };
  const std::vector<std::uint16_t> qh = bf16 ? halves(q) : std::vector<std::uint16_t>{},
                                   kh = bf16 ? halves(k) : std::vector<std::uint16_t>{},
                                   vh = bf16 ? halves(v) : std::vector<std::uint16_t>{};
  std::vector<std::uint16_t> outh(bf16 ? out.size() : 0);
  if (bf16) spec.storage = qkv::DType::bf16;
  AttentionArgs a;
  a.q = bf16 ? static_cast<const void*>(qh.data()) : q.data();
  a.k = bf16 ? static_cast<const void*>(kh.data()) : k.data();
  a.v = bf16 ? static_cast<const void*>(vh.data()) : v.data();
  a.out = bf16 ? static_cast<void*>(outh.data()) : out.data();
  a.batch = 1;
  a.len_q = 1;
  a.len_k = s;
  qkv::codegen::cpu::run_attention(spec, a, kThreads);  // compile, and warm the pages
  const double bw_before = probe_bandwidth();
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    qkv::codegen::cpu::run_attention(spec, a, kThreads);
    seconds += seconds_since(t0);
    benchmark::DoNotOptimize(out.data());
  }
  const double bw = std::max(bw_before, probe_bandwidth());
  const double bytes = 2.0 * kHkv * static_cast<double>(s) * kDim * (bf16 ? 2 : 4);
  const double gbps = bytes * static_cast<double>(state.iterations()) / seconds * 1e-9;
  state.counters["GB/s"] = gbps;
  state.counters["read_bw"] = bw;
  state.counters["x_read_bw"] = gbps / bw;
  state.counters["GFLOP/s"] =
      4.0 * kHq * static_cast<double>(s) * kDim * static_cast<double>(state.iterations()) / seconds * 1e-9;
  if (!split) g_fused_gbps[{s, bf16}] = gbps;
  if (split && g_fused_gbps.count({s, bf16})) state.counters["x_fused"] = gbps / g_fused_gbps[{s, bf16}];
  const double step = seconds / static_cast<double>(state.iterations());
  if (split && !bf16) g_fp32_step[s] = step;
  if (split && bf16 && g_fp32_step.count(s)) state.counters["x_fp32_time"] = g_fp32_step[s] / step;
  state.SetLabel(std::string(split ? "split_kv" : "fused") + (bf16 ? " bf16" : ""));
}

void decode_args(benchmark::internal::Benchmark* b) {
  for (int bf16 : {0, 1})
    for (std::int64_t s : {1024, 4096, 8192, 16384, 32768})
      for (int split : {0, 1}) b->Args({s, split, bf16});
}

}  // namespace

BENCHMARK(BM_ReadBandwidth)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5);
BENCHMARK(BM_Decode)->Apply(decode_args)->Unit(benchmark::kMicrosecond)->UseRealTime();

BENCHMARK_MAIN();
