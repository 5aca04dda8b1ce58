// How long the DSL takes to record a multi-head attention graph and to hash it (the key of the
// kernel cache), against copying the finished graph as a baseline in the same run.
#include <benchmark/benchmark.h>

#include <qkv/qkv.hpp>

namespace {
QKV_AXIS(Batch);
QKV_AXIS(Seq);
QKV_AXIS(Key);
QKV_AXIS(Model);
QKV_AXIS(Heads);
QKV_AXIS(HeadDim);

qkv::Graph build_mha() {
  using namespace qkv;
  constexpr int E = 512, H = 8;
  Graph g;
  auto x = input<Tensor<f32, Batch<>, Seq<>, Model<E>>>(g, "x");
  auto heads = [](auto t) { return permute<Batch, Heads, Seq, HeadDim>(split<Model, Heads<H>, HeadDim<E / H>>(t)); };
  auto q = heads(linear(x, linear_params<Model<E>, Model<E>>(g, "q_proj")));
  auto k = rename<Seq, Key>(heads(linear(x, linear_params<Model<E>, Model<E>>(g, "k_proj"))));
  auto v = rename<Seq, Key>(heads(linear(x, linear_params<Model<E>, Model<E>>(g, "v_proj"))));
  auto o = contract<Key>(softmax<Key>(scaled(contract<HeadDim>(q, k))), v);
  auto y = linear(merge<Heads, HeadDim, Model>(permute<Batch, Seq, Heads, HeadDim>(o)),
                  linear_params<Model<E>, Model<E>>(g, "out_proj"));
  output(y, "out");
  return g;
}

void BM_BuildMultiHeadGraph(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(build_mha());
}
BENCHMARK(BM_BuildMultiHeadGraph);

void BM_HashGraph(benchmark::State& state) {
  const qkv::Graph g = build_mha();
  for (auto _ : state) benchmark::DoNotOptimize(g.hash());
}
BENCHMARK(BM_HashGraph);

void BM_CopyGraphBaseline(benchmark::State& state) {
  const qkv::Graph g = build_mha();
  for (auto _ : state) {
    qkv::Graph copy = g;
    benchmark::DoNotOptimize(copy);
  }
}
BENCHMARK(BM_CopyGraphBaseline);
}  // namespace

BENCHMARK_MAIN();
