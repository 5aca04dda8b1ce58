// The AOT-compiled function (qkv/codegen/aot.hpp) against the in-process CPU backend
// (qkv::codegen::cpu::run, the same kernels driven by the executor) on the same graph and inputs,
// in one run: a multi-head attention layer (E = 512, H = 8) and a post-norm encoder layer.
// The AOT function runs on one thread per online CPU (its default); the executor with 1 and 2.
//
//   bench_aot --benchmark_min_time=0.01
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <vector>

#include <qkv/codegen/aot.hpp>
#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/random_feeds.hpp>

namespace {

using namespace qkv;
using namespace qkv::nn;

struct Case {
  Graph graph;
  Feeds feeds;
  Bindings sizes;
  double flops = 0;  // of the attention core, 4·B·H·L·S·D
};

Case mha_case(std::int64_t n) {
  Case c;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<512>>>(c.graph, "x");
  output(MultiHeadAttention<512, 8>::make(c.graph)(x).first, "out");
  c.feeds = random_feeds(c.graph, {{"Batch", 1}, {"Seq", n}, {"Key", n}}, 1, 0.5f);
  c.sizes = bind_extents(c.graph, c.feeds);
  c.flops = 4.0 * 8 * static_cast<double>(n) * static_cast<double>(n) * 64;
  return c;
}

Case encoder_case(std::int64_t n) {
  Case c;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<512>>>(c.graph, "x");
  output(EncoderLayer<512, 8, 2048>::make(c.graph)(x), "out");
  c.feeds = random_feeds(c.graph, {{"Batch", 2}, {"Seq", n}, {"Key", n}}, 2, 0.5f);
  c.sizes = bind_extents(c.graph, c.feeds);
  c.flops = 4.0 * 2 * 8 * static_cast<double>(n) * static_cast<double>(n) * 64;
  return c;
}

Case make(int which, std::int64_t n) { return which == 0 ? mha_case(n) : encoder_case(n); }

void BM_Aot(benchmark::State& state) {
  const Case c = make(static_cast<int>(state.range(0)), state.range(1));
  const auto model = codegen::AotModel::compile(c.graph, c.sizes);
  std::vector<std::vector<float>> data;
  std::vector<void*> args;
  for (const auto& a : model->signature().args) {
    data.push_back(a.output ? std::vector<float>(static_cast<std::size_t>(a.numel)) : c.feeds.at(a.name).to_f32());
    args.push_back(data.back().data());
  }
  for (auto _ : state)
    if (model->run(args.data()) != 0) state.SkipWithError("the arena could not be allocated");
  state.counters["GFLOP/s"] = benchmark::Counter(c.flops, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Executor(benchmark::State& state) {
  const Case c = make(static_cast<int>(state.range(0)), state.range(1));
  const int threads = static_cast<int>(state.range(2));
  codegen::cpu::run(c.graph, c.feeds, threads);  // lower and JIT outside the timing
  for (auto _ : state) benchmark::DoNotOptimize(codegen::cpu::run(c.graph, c.feeds, threads));
  state.counters["GFLOP/s"] = benchmark::Counter(c.flops, benchmark::Counter::kIsIterationInvariantRate);
}

// Args: model (0 = multi-head layer B=1, 1 = encoder layer B=2), N, [threads]
BENCHMARK(BM_Aot)->Args({0, 2048})->Args({1, 512})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Executor)
    ->Args({0, 2048, 1})
    ->Args({0, 2048, 2})
    ->Args({1, 512, 1})
    ->Args({1, 512, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
