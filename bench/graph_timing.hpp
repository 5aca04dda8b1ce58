// bench/graph_timing.hpp — timing a graph compiled by the CPU backend against the FMA peak.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/qkv.hpp>

#include "bench_util.hpp"
#include "peaks.hpp"

namespace qkv::bench {

struct GraphTiming {
  double seconds = 0;  // what the iterations took
  double peak = 0;     // GFLOP/s of the FMA loop, the higher of its probes before and after
};

/// Compiles `g` (its first run), then runs it once an iteration of `state` on kThreads threads.
inline GraphTiming time_graph(benchmark::State& state, const Graph& g, const Feeds& feeds) {
  (void)codegen::cpu::run(g, feeds, kThreads);
  const double peak_before = probe_peak();
  GraphTiming t;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    benchmark::DoNotOptimize(codegen::cpu::run(g, feeds, kThreads));
    t.seconds += seconds_since(t0);
  }
  t.peak = std::max(peak_before, probe_peak());
  return t;
}

}  // namespace qkv::bench
