// bench/bench_util.hpp — what the CPU benchmarks share: a wall clock and seeded inputs.
#pragma once

#include <chrono>
#include <cstddef>
#include <random>
#include <vector>

namespace qkv::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// n values uniform in [-1, 1) from a generator seeded with `seed`.
inline std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

}  // namespace qkv::bench
