// qkv/codegen/cuda/bench.hpp — the fused attention kernel timed alone on GPU 0 (for
// bench/bench_gpu_attention and scripts/gpu-check).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <qkv/codegen/cpu/attention.hpp>

namespace qkv::codegen::cuda {

/// Times the fused attention kernel alone on GPU 0: device buffers for q, k, v and out (filled
/// with seeded values in [-1, 1)), the kernel compiled and loaded once, launches timed with CUDA
/// events (no transfers). For the GPU benchmark. With `backward`, one launch is the backward's
/// pair (AttentionBackwardKernel dq then dkdv) over seeded q, k, v, out, dO and lse.
class AttentionBench {
 public:
  /// Throws cuda::NoGpu without a GPU, std::runtime_error when no tiling fits the spec.
  AttentionBench(const cpu::AttentionSpec& spec, std::int64_t batch, std::int64_t len_q, std::int64_t len_k,
                 bool backward = false);
  ~AttentionBench();
  AttentionBench(const AttentionBench&) = delete;
  AttentionBench& operator=(const AttentionBench&) = delete;

  /// Runs `launches` back-to-back launches between two events; returns milliseconds per launch.
  double launch_ms(int launches = 1);
  /// attention_flops of the problem (4·B·H·L·S·D, half when causal with L == S); backward:
  /// attention_backward_flops (2.5 × that).
  [[nodiscard]] double flops() const;
  /// The kernel's name and tiling, e.g. "qkv_attention_… block_q 64 block_k 64 threads 128 smem 52 KiB".
  [[nodiscard]] const std::string& kernel() const;
  /// "NVIDIA H100 80GB HBM3 (sm_90)".
  [[nodiscard]] const std::string& device() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace qkv::codegen::cuda
