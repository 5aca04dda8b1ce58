// Element-wise math on the CPU backend, 2 threads, x [4096, 1024] f32 (16 MiB in, 16 MiB out):
// each activation as its dedicated row-wise kernel (Op::gelu / relu / silu) beside the same function
// written as a pointwise expression (qkv/dsl/ops_pointwise.hpp) — the question issue 31 asks before
// the kernels are replaced by compositions — and gelu_tanh, which has only the expression.
// Counters: GB/s moved (4 bytes read + 4 written per element), elements/ns, x_kernel (this form's
// rate ÷ the dedicated kernel's, same run) and the FMA peak probed around the run (GFLOP/s), so a
// reader can see whether a form is bound by memory or by its arithmetic.
//
//   bench_pointwise --benchmark_min_time=0.2 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <map>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/qkv.hpp>

#include "bench_util.hpp"
#include "graph_timing.hpp"
#include "peaks.hpp"

namespace {

QKV_AXIS(Row);
QKV_AXIS(Col);

enum Form : std::int64_t {
  kGeluKernel,
  kGeluExpression,
  kReluKernel,
  kReluExpression,
  kSiluKernel,
  kSiluExpression,
  kGeluTanhExpression
};
std::map<std::int64_t, double> g_kernel_rate;  // elements/s of the dedicated kernel, by activation

qkv::Graph graph(Form form) {
  using namespace qkv;
  Graph g;
  auto x = input<Tensor<f32, Row<4096>, Col<1024>>>(g, "x");
  switch (form) {
    case kGeluKernel:
      output(gelu(x), "y");
      break;
    case kGeluExpression:
      output(0.5 * x * (1.0 + erf(x * 0.7071067811865476)), "y");
      break;
    case kReluKernel:
      output(relu(x), "y");
      break;
    case kReluExpression:
      output(clamp(x, 0.0, INFINITY), "y");
      break;
    case kSiluKernel:
      output(silu(x), "y");
      break;
    case kSiluExpression:
      output(x * sigmoid(x), "y");
      break;
    case kGeluTanhExpression:
      output(gelu_tanh(x), "y");
      break;
  }
  return g;
}

void BM_Activation(benchmark::State& state) {
  const auto form = static_cast<Form>(state.range(0));
  const qkv::Graph g = graph(form);
  qkv::Feeds feeds;
  feeds["x"] = qkv::NdArray::from_f32(qkv::bench::random_values(4096 * 1024, 1), {4096, 1024});
  const qkv::bench::GraphTiming t = qkv::bench::time_graph(state, g, feeds);
  const double elements = 4096.0 * 1024.0 * static_cast<double>(state.iterations());
  const double rate = elements / t.seconds;
  state.counters["GB/s"] = rate * 8 * 1e-9;
  state.counters["elem/ns"] = rate * 1e-9;
  state.counters["fma_peak_gflops"] = t.peak;
  const std::int64_t activation = form / 2;  // kernel and expression of one function share it
  if (form % 2 == 0 && form != kGeluTanhExpression) g_kernel_rate[activation] = rate;
  if (auto it = g_kernel_rate.find(activation); form % 2 == 1 && it != g_kernel_rate.end())
    state.counters["x_kernel"] = rate / it->second;
}

// Each kernel before its expression, so that the expression reports its ratio.
BENCHMARK(BM_Activation)
    ->ArgName("form")
    ->DenseRange(kGeluKernel, kGeluTanhExpression)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
