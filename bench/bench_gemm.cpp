// The linear layer's GEMM on the CPU, 2 threads: y[M, N] = x[M, K] · W[N, K]ᵀ + b, in one run,
//   * qkv's fp32 GEMM (codegen::cpu::run_linear), against the FMA peak measured around it,
//   * qkv's bf16 GEMM (run_linear_bf16: vdpbf16ps on AVX512-BF16), against the vdpbf16ps peak and
//     as a multiple of qkv's fp32 GEMM on the same shape (x_fp32),
//   * OpenBLAS sgemm on the same layout (B transposed), against the FMA peak.
// BM_Projection: GPT-2's Conv1D layout through the whole CPU backend (below).
// GFLOP/s counts 2·M·N·K. Every call packs W into the kernel's panels, as a linear layer that is
// not prepared does (a prepared one packs once: CompiledGraph::prepare).
//
//   bench_gemm --benchmark_min_time=0.2 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/cpu/gemm.hpp>
#include <qkv/qkv.hpp>

#include "bench_util.hpp"
#include "graph_timing.hpp"
#include "peaks.hpp"

namespace {

using qkv::bench::Clock;
using qkv::bench::kThreads;
using qkv::bench::seconds_since;

enum Kind : std::int64_t { kQkvF32 = 0, kQkvBf16 = 1, kOpenBlas = 2 };

std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, double> g_fp32_gflops;  // qkv fp32 per shape

std::vector<std::uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    out[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(v[i]) >> 16);
  return out;
}

void BM_Linear(benchmark::State& state) {
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const auto kind = static_cast<Kind>(state.range(3));
  if (kind == kQkvBf16 && !qkv::bench::has_avx512bf16()) {
    state.SkipWithError("no AVX512-BF16 on this CPU (run_linear_bf16 would widen to f32)");
    return;
  }
  const auto x = qkv::bench::random_values(static_cast<std::size_t>(m * k), 1);
  const auto w = qkv::bench::random_values(static_cast<std::size_t>(n * k), 2);
  const auto bias = qkv::bench::random_values(static_cast<std::size_t>(n), 3);
  const auto xh = to_bf16(x), wh = to_bf16(w);
  std::vector<float> y(static_cast<std::size_t>(m * n));
  openblas_set_num_threads(kThreads);
  auto call = [&] {
    switch (kind) {
      case kQkvF32:
        qkv::codegen::cpu::run_linear(x.data(), w.data(), bias.data(), y.data(), m, n, k, kThreads);
        break;
      case kQkvBf16:
        qkv::codegen::cpu::run_linear_bf16(xh.data(), wh.data(), bias.data(), y.data(), m, n, k, kThreads);
        break;
      case kOpenBlas:
        for (std::int64_t i = 0; i < m; ++i) std::copy(bias.begin(), bias.end(), y.begin() + i * n);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                    static_cast<int>(k), 1.0f, x.data(), static_cast<int>(k), w.data(), static_cast<int>(k), 1.0f,
                    y.data(), static_cast<int>(n));
        break;
    }
  };
  call();  // compile (qkv) or warm up (OpenBLAS)
  const bool bf16 = kind == kQkvBf16;
  const double peak_before = bf16 ? qkv::bench::probe_bf16_peak() : qkv::bench::probe_peak();
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    call();
    seconds += seconds_since(t0);
    benchmark::DoNotOptimize(y.data());
  }
  const double peak = std::max(peak_before, bf16 ? qkv::bench::probe_bf16_peak() : qkv::bench::probe_peak());
  const double gflops = 2.0 * static_cast<double>(m * n * k) * static_cast<double>(state.iterations()) / seconds * 1e-9;
  state.counters["GFLOP/s"] = gflops;
  state.counters["peak"] = peak;
  state.counters["pct_peak"] = 100.0 * gflops / peak;
  if (kind == kQkvF32) g_fp32_gflops[{m, n, k}] = gflops;
  if (auto it = g_fp32_gflops.find({m, n, k}); kind != kQkvF32 && it != g_fp32_gflops.end())
    state.counters["x_fp32"] = gflops / it->second;
}

// qkv fp32 first on each shape, so that the others can report their ratio to it.
BENCHMARK(BM_Linear)
    ->ArgNames({"M", "N", "K", "kind"})
    ->ArgsProduct({{2048}, {4096}, {4096}, {kQkvF32, kQkvBf16, kOpenBlas}})
    ->ArgsProduct({{2048}, {512}, {512}, {kQkvF32, kQkvBf16, kOpenBlas}})
    // A 512-token prefill of a Llama of width 1024: q/o, k/v (GQA 4 of 16), gate/up, down, lm_head.
    ->ArgsProduct({{512}, {1024, 256, 2816, 32000}, {1024}, {kQkvF32, kOpenBlas}})
    ->ArgsProduct({{512}, {1024}, {2816}, {kQkvF32, kOpenBlas}})
    // The GPT-2-small-shaped training step's forward linears (2048 tokens, width 384, `qkv train`).
    ->ArgsProduct({{2048}, {1152, 1536, 384}, {384}, {kQkvF32, kOpenBlas}})
    ->ArgsProduct({{2048}, {384}, {1536}, {kQkvF32, kOpenBlas}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// GPT-2's Conv1D projection (the weight stored [in, out]) as a graph on the CPU backend, 2
// threads, M = 1024 rows, 256 -> 768: as torch.nn.Linear's layout (the GEMM), as conv1d_params
// (the weight transposed by a strided copy in the graph, then the GEMM), and as the contraction a
// user wrote before conv1d_params existed (contract<Model>(x, W): a loop nest). Each call runs the
// compiled graph (compiled by the first); the peak is probed around the run.
QKV_AXIS(Seq);
QKV_AXIS(Model);
QKV_AXIS(Hidden);
enum Form : std::int64_t { kLinear = 0, kConv1d = 1, kContract = 2 };

/// GFLOP/s of a compiled graph doing `flops` a call, and its share of the FMA peak.
void time_graph(benchmark::State& state, const qkv::Graph& g, const qkv::Feeds& feeds, double flops) {
  const qkv::bench::GraphTiming t = qkv::bench::time_graph(state, g, feeds);
  const double gflops = flops * static_cast<double>(state.iterations()) / t.seconds * 1e-9;
  state.counters["GFLOP/s"] = gflops;
  state.counters["pct_peak"] = 100.0 * gflops / t.peak;
}

void BM_Projection(benchmark::State& state) {
  using namespace qkv;
  const std::int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const auto form = static_cast<Form>(state.range(3));
  Graph g;
  auto x = input<Tensor<f32, Seq<dyn>, Model<256>>>(g, "x");
  if (form == kLinear) output(linear(x, linear_params<Model<256>, Hidden<768>>(g, "p")), "y");
  if (form == kConv1d) output(linear(x, conv1d_params<Model<256>, Hidden<768>>(g, "p")), "y");
  if (form == kContract) output(contract<Model>(x, input<Tensor<f32, Model<256>, Hidden<768>>>(g, "w")), "y");
  Feeds feeds;
  feeds["x"] = NdArray::from_f32(qkv::bench::random_values(static_cast<std::size_t>(m * k), 1), {m, k});
  const auto w = qkv::bench::random_values(static_cast<std::size_t>(n * k), 2);
  feeds[form == kContract ? "w" : "p.weight"] =
      form == kLinear ? NdArray::from_f32(w, {n, k}) : NdArray::from_f32(w, {k, n});
  if (form != kContract)
    feeds["p.bias"] = NdArray::from_f32(qkv::bench::random_values(static_cast<std::size_t>(n), 3), {n});
  time_graph(state, g, feeds, 2.0 * static_cast<double>(m * n * k));
}
BENCHMARK(BM_Projection)
    ->ArgNames({"M", "K", "N", "form"})
    ->ArgsProduct({{1024}, {256}, {768}, {kLinear, kConv1d, kContract}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A weight's gradient as the training step computes it: dW[Out, In] = Σ over Seq of dy[Seq, Out]
// x[Seq, In] — a contraction over the leading axis of both operands (the GEMM with A given
// transposed, A = dy as [K, M], Bᵀ's panels packed from x as [K, N]), through the whole CPU
// backend. The shapes of the GPT-2-small-shaped step's linears (2048 tokens, width 384).
QKV_AXIS(Out);
QKV_AXIS(In);

template <std::int64_t O, std::int64_t N>
void BM_WeightGradient(benchmark::State& state) {
  using namespace qkv;
  constexpr std::int64_t t = 2048;
  Graph g;
  auto dy = input<Tensor<f32, Seq<t>, Out<O>>>(g, "dy");
  auto x = input<Tensor<f32, Seq<t>, In<N>>>(g, "x");
  output(contract<Seq>(dy, x), "dw");
  Feeds feeds;
  feeds["dy"] = NdArray::from_f32(qkv::bench::random_values(static_cast<std::size_t>(t * O), 1), {t, O});
  feeds["x"] = NdArray::from_f32(qkv::bench::random_values(static_cast<std::size_t>(t * N), 2), {t, N});
  time_graph(state, g, feeds, 2.0 * static_cast<double>(t * O * N));
}
BENCHMARK(BM_WeightGradient<1152, 384>)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_WeightGradient<1536, 384>)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_WeightGradient<384, 384>)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_WeightGradient<384, 1536>)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
