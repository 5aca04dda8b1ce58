// bench/peaks.hpp — the machine's peaks, measured in the same run as what is compared with them:
// an FMA loop on host-width vectors and a vdpbf16ps loop (AVX512-BF16), on kThreads threads.
#pragma once

#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench_util.hpp"

namespace qkv::bench {

constexpr int kThreads = 2;

// --- FMA peak ---------------------------------------------------------------------------------
// kChains independent accumulators: enough to cover FMA latency × FMA ports on current cores.
constexpr int kChains = 12;

__attribute__((target("avx512f"))) inline float fma_loop_avx512(std::int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512 x = _mm512_set1_ps(0.9999999f), y = _mm512_set1_ps(1e-7f);
  for (std::int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], x, y);
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  alignas(64) float lanes[16];  // (not _mm512_reduce_add_ps: GCC 12 warns inside its own header)
  _mm512_store_ps(lanes, s);
  float total = 0;
  for (float l : lanes) total += l;
  return total;
}

__attribute__((target("avx2,fma"))) inline float fma_loop_avx2(std::int64_t iters) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
  const __m256 x = _mm256_set1_ps(0.9999999f), y = _mm256_set1_ps(1e-7f);
  for (std::int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], x, y);
  alignas(32) float out[8];
  __m256 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm256_add_ps(s, acc[c]);
  _mm256_store_ps(out, s);
  float r = 0;
  for (float v : out) r += v;
  return r;
}

/// Host-width FMA loop: returns {flops per iteration, lanes}.
inline std::pair<double, int> fma_loop(std::int64_t iters, float* sink) {
  if (__builtin_cpu_supports("avx512f")) {
    *sink += fma_loop_avx512(iters);
    return {2.0 * 16 * kChains, 16};
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    *sink += fma_loop_avx2(iters);
    return {2.0 * 8 * kChains, 8};
  }
  float a = 1.0f;  // no FMA: a scalar stand-in (the percentages are then only indicative)
  for (std::int64_t i = 0; i < iters * kChains; ++i) a = a * 0.9999999f + 1e-7f;
  *sink += a;
  return {2.0 * kChains, 1};
}

/// GFLOP/s of the FMA loop on kThreads threads for `iters` iterations each.
inline double fma_rate(std::int64_t iters, int* lanes_out = nullptr) {
  std::vector<std::thread> threads;
  std::vector<float> sinks(kThreads);
  std::vector<double> per_iter(kThreads);
  const auto t0 = Clock::now();
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      const auto [flops, l] = fma_loop(iters, &sinks[static_cast<std::size_t>(t)]);
      per_iter[static_cast<std::size_t>(t)] = flops;
      if (t == 0 && lanes_out) *lanes_out = l;
    });
  for (auto& t : threads) t.join();
  const double seconds = seconds_since(t0);
  benchmark::DoNotOptimize(sinks.data());
  double flops = 0;
  for (double f : per_iter) flops += f * static_cast<double>(iters);
  return flops / seconds * 1e-9;
}

// --- bf16 dot-product peak (vdpbf16ps: 32 products into 16 f32 lanes per instruction) ----------

__attribute__((target("avx512f,avx512bf16"))) inline float dpbf16_loop(std::int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  for (std::int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], x, x);
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float total = 0;
  for (float l : lanes) total += l;
  return total;
}

inline bool has_avx512bf16() { return __builtin_cpu_supports("avx512bf16"); }

/// GFLOP/s of the vdpbf16ps loop on kThreads threads (0 without AVX512-BF16); best of three.
inline double probe_bf16_peak(std::int64_t iters = 3'000'000) {
  if (!has_avx512bf16()) return 0;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<std::thread> threads;
    std::vector<float> sinks(kThreads);
    const auto t0 = Clock::now();
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] { sinks[static_cast<std::size_t>(t)] = dpbf16_loop(iters); });
    for (auto& t : threads) t.join();
    const double seconds = seconds_since(t0);
    benchmark::DoNotOptimize(sinks.data());
    best = std::max(best, 2.0 * 32 * kChains * static_cast<double>(iters) * kThreads / seconds * 1e-9);
  }
  return best;
}

/// Returns once no other thread of this process is running — OpenBLAS's workers spin for a while
/// after each call before they block, and would take cores from whatever is measured next. Polls
/// the threads' states in /proc/self/task (yielding between polls); gives up after 5 s of polls
/// (a thread that never blocks), saying so.
inline void wait_for_other_threads_to_block() {
  const std::string self = std::to_string(::syscall(SYS_gettid));
  const auto t0 = Clock::now();
  for (;;) {
    bool running = false;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      if (task.path().filename() == self) continue;
      std::ifstream stat(task.path() / "stat");
      std::string line;
      std::getline(stat, line);
      const auto close = line.rfind(')');  // "tid (name) S ...": the state follows the name
      running = running || (close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'R');
    }
    if (!running) return;
    if (seconds_since(t0) > 5.0) {
      std::fprintf(stderr, "bench: another thread is still running after 5 s; measuring anyway\n");
      return;
    }
    std::this_thread::yield();
  }
}

/// A short FMA probe (3 × ~30 ms): the peak as the machine delivers it right now. On a shared or
/// virtual machine the cores' speed varies; every percentage below is taken against the larger
/// of two probes, one before and one after the measurement (a conservative ratio). The probe
/// first waits until no other thread runs (OpenBLAS's workers, after BLAS calls).
inline double probe_peak() {
  wait_for_other_threads_to_block();
  // The best of three: a single short probe right after other work sometimes runs its two
  // threads on one core for part of its ~30 ms (the scheduler has not spread them yet).
  double best = 0;
  for (int i = 0; i < 3; ++i) best = std::max(best, fma_rate(3'000'000));
  return best;
}

}  // namespace qkv::bench
