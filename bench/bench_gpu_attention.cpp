// Attention on the GPU: the NVPTX fused attention kernel (qkv/codegen/nvptx.hpp) through
// qkv::codegen::cuda::AttentionBench, fp32 (FMA) and bf16 (tensor cores: mma.sync m16n8k16,
// fp32 accumulation; bf16=1), B = 4, H = 16, D = 64 and 128, N = L = S in {1024, …, 16384},
// causal and not. Each iteration is one launch timed with CUDA events (kernel
// time only: q/k/v are on the device before the loop, nothing is copied while timing);
// TFLOP/s counts 4·B·H·N²·D, half of it for causal.
//
//   bench_gpu_attention --benchmark_min_time=0.05        (benchmark 1.7.1: a number, no "s")
//
// Without a GPU every benchmark reports "no CUDA driver/GPU found: …" as its error and the
// program exits 0.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include <qkv/codegen/cuda/executor.hpp>
#include <qkv/runtime/cuda.hpp>

namespace {

constexpr std::int64_t kBatch = 4;
constexpr std::int64_t kHeads = 16;

/// The bench of `spec`, or null after saying why on `state` (no GPU, no kernel for the spec).
std::unique_ptr<qkv::codegen::cuda::AttentionBench> make_bench(benchmark::State& state,
                                                               const qkv::codegen::cpu::AttentionSpec& spec,
                                                               std::int64_t batch, std::int64_t len_q,
                                                               std::int64_t len_k, bool backward = false) {
  if (const std::string why = qkv::cuda::why_no_gpu(); !why.empty()) {
    state.SkipWithError(why.c_str());
    return nullptr;
  }
  try {
    return std::make_unique<qkv::codegen::cuda::AttentionBench>(spec, batch, len_q, len_k, backward);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return nullptr;
  }
}

/// Times one launch per iteration (manual time, CUDA events); returns the mean ms and sets the
/// `ms` counter.
double time_launches(benchmark::State& state, qkv::codegen::cuda::AttentionBench& bench) {
  double total_ms = 0;
  std::int64_t launches = 0;
  for (auto _ : state) {
    const double ms = bench.launch_ms(1);
    state.SetIterationTime(ms / 1e3);
    total_ms += ms;
    ++launches;
  }
  const double ms = launches > 0 ? total_ms / static_cast<double>(launches) : 0;
  state.counters["ms"] = ms;
  return ms;
}

void BM_GpuAttention(benchmark::State& state) {
  const std::int64_t d = state.range(0), n = state.range(1);
  const bool causal = state.range(2) != 0;
  qkv::codegen::cpu::AttentionSpec spec;
  spec.dk = spec.dv = d;
  spec.hq = spec.hkv = kHeads;
  spec.causal = causal;
  if (state.range(3) != 0) spec.storage = qkv::DType::bf16;
  const auto bench = make_bench(state, spec, kBatch, n, n);
  if (!bench) return;
  const double ms = time_launches(state, *bench);
  state.counters["TFLOP/s"] = ms > 0 ? bench->flops() / (ms * 1e-3) / 1e12 : 0;
  state.SetLabel(bench->kernel());
}

void arguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"D", "N", "causal", "bf16"});
  for (std::int64_t bf16 : {0, 1})
    for (std::int64_t d : {64, 128})
      for (std::int64_t causal : {0, 1})
        for (std::int64_t n : {1024, 2048, 4096, 8192, 16384}) b->Args({d, n, causal, bf16});
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_GpuAttention)->Apply(arguments);

// The backward (AttentionBackwardKernel: dq, then dkdv; fp32 FMA, or bf16 on tensor cores: bf16=1),
// B = 4, H = 16, D = 64 and 128, N = 1024 … 8192, causal and not. TFLOP/s counts
// attention_backward_flops (2.5 × the forward's).
void BM_GpuAttentionBackward(benchmark::State& state) {
  const std::int64_t d = state.range(0), n = state.range(1);
  qkv::codegen::cpu::AttentionSpec spec;
  spec.dk = spec.dv = d;
  spec.hq = spec.hkv = kHeads;
  spec.causal = state.range(2) != 0;
  if (state.range(3) != 0) spec.storage = qkv::DType::bf16;
  const auto bench = make_bench(state, spec, kBatch, n, n, /*backward=*/true);
  if (!bench) return;
  const double ms = time_launches(state, *bench);
  state.counters["TFLOP/s"] = ms > 0 ? bench->flops() / (ms * 1e-3) / 1e12 : 0;
  state.SetLabel(bench->kernel());
}
BENCHMARK(BM_GpuAttentionBackward)
    ->ArgNames({"D", "N", "causal", "bf16"})
    ->ArgsProduct({{64, 128}, {1024, 2048, 4096, 8192}, {0, 1}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// One decode step's attention (L = 1): B = 1, Hq = 32 over Hkv = 8, D = 128, causal bottom-right,
// S = 4096 … 32768 — the split-KV decode kernel and its merge. GB/s = bytes of K and V per step ÷
// the step's kernel time.
void BM_GpuDecode(benchmark::State& state) {
  const std::int64_t s = state.range(0);
  qkv::codegen::cpu::AttentionSpec spec;
  spec.dk = spec.dv = 128;
  spec.hq = 32;
  spec.hkv = 8;
  spec.causal = true;
  spec.align = qkv::CausalAlign::bottom_right;
  const auto bench = make_bench(state, spec, 1, 1, s);
  if (!bench) return;
  const double ms = time_launches(state, *bench);
  state.counters["GB/s"] = ms > 0 ? 2.0 * 8 * static_cast<double>(s) * 128 * 4 / (ms * 1e-3) / 1e9 : 0;
  state.SetLabel(bench->kernel());
}
BENCHMARK(BM_GpuDecode)
    ->ArgNames({"S"})
    ->Arg(4096)
    ->Arg(8192)
    ->Arg(16384)
    ->Arg(32768)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (const std::string why = qkv::cuda::why_no_gpu(); !why.empty()) {
    std::printf("%s\n", why.c_str());
  } else {
    try {
      const qkv::cuda::Device gpu = qkv::cuda::Device::open();
      std::printf("GPU 0: %s, %s, %d SMs, B = %lld, H = %lld, fp32 and bf16 (bf16:1)\n", gpu.name().c_str(),
                  gpu.arch().c_str(), gpu.sm_count(), static_cast<long long>(kBatch), static_cast<long long>(kHeads));
    } catch (const std::exception& e) {
      std::printf("%s\n", e.what());
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
