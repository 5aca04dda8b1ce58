// qkv/runtime/rng.hpp — the counter-based generator behind dropout.
//
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a pure
// function of (key, counter), so any backend can ask "is entry (batch, head, row, col) kept
// under seed s?" in any order and get the same answer. The reference interpreter, the CPU
// kernel and the GPU kernel all call the same function (or its IR twin), which is what makes
// their dropout masks identical bit for bit.
#pragma once

#include <array>
#include <cstdint>

namespace qkv {

/// One Philox4x32-10 block: four 32-bit outputs for a 128-bit counter under a 64-bit key.
std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter, std::uint64_t key);

/// A uniform number in [0, 1) for the attention entry (batch, head, row, col) under `seed`.
/// The counter is (row, col, head, batch); the key is the seed.
float dropout_uniform(std::uint64_t seed, std::uint32_t batch, std::uint32_t head, std::uint32_t row,
                      std::uint32_t col);

/// True when dropout with probability p keeps the entry: uniform >= p.
inline bool dropout_keep(double p, std::uint64_t seed, std::uint32_t batch, std::uint32_t head, std::uint32_t row,
                         std::uint32_t col) {
  return dropout_uniform(seed, batch, head, row, col) >= static_cast<float>(p);
}

}  // namespace qkv
