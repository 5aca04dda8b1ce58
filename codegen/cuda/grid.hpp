// codegen/cuda/grid.hpp — CUDA's launch limits, shared by the planner and the executor (private).
#pragma once

#include <cstdint>

#include <qkv/codegen/nvptx.hpp>

namespace qkv::codegen::cuda {

constexpr std::int64_t kMaxGridX = 2147483647;  // CUDA: grid.x < 2^31, grid.y and grid.z <= 65535
constexpr std::int64_t kMaxGridYZ = 65535;

/// A grid CUDA accepts.
inline bool fits(const nvptx::Dim3& g) { return g.x <= kMaxGridX && g.y <= kMaxGridYZ && g.z <= kMaxGridYZ; }
/// A grid with nothing to do (not launched).
inline bool empty_grid(const nvptx::Dim3& g) { return g.x == 0 || g.y == 0 || g.z == 0; }

}  // namespace qkv::codegen::cuda
