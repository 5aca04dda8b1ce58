// The GPU backend's host side, without a GPU: the sm choice, the attention tiling, the plan of
// the CLI's models (every node on a GPU kernel, launch grids by the nvptx header's rules, buffer
// lifetimes), the documented host fallbacks, and NoGpu from cuda::run where there is no GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <type_traits>
#include <variant>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/cuda/executor.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/cuda.hpp>
#include <qkv/runtime/random_feeds.hpp>

#include "../support/cases.hpp"
#include "host_machine.hpp"

namespace qkv::test {
namespace {

using codegen::cuda::Arg;
using codegen::cuda::Plan;
using codegen::cuda::Step;
namespace nvptx = codegen::nvptx;

TEST(GpuPlan, PicksTheLargestSupportedSmNotAboveTheDevice) {
  using codegen::cuda::pick_sm;
  EXPECT_EQ(pick_sm(8, 0), 80);
  EXPECT_EQ(pick_sm(8, 6), 86);
  EXPECT_EQ(pick_sm(8, 7), 87);
  EXPECT_EQ(pick_sm(8, 8), 87);
  EXPECT_EQ(pick_sm(8, 9), 89);
  EXPECT_EQ(pick_sm(9, 0), 90);
  EXPECT_EQ(pick_sm(10, 0), 90);  // Blackwell: sm_90 PTX, JIT-compiled forward by the driver
  EXPECT_EQ(pick_sm(12, 0), 90);
  try {
    (void)pick_sm(7, 5);
    ADD_FAILURE() << "compute capability 7.5 accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("needs compute capability >= 8.0"));
  }
}

TEST(GpuPlan, AttentionTilingFallsBackToSmallerBlocksThenToNothing) {
  codegen::cpu::AttentionSpec s;
  s.dk = s.dv = 64;
  auto k = codegen::cuda::choose_attention_kernel(s, 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(k->block_q, 64);  // the header's defaults
  EXPECT_EQ(k->block_k, 64);
  s.dk = s.dv = 256;
  k = codegen::cuda::choose_attention_kernel(s, 0);
  ASSERT_TRUE(k);
  EXPECT_EQ(k->block_q, 32);
  EXPECT_EQ(k->block_k, 32);
  // A device with less shared memory gets a smaller tiling, within its limit.
  k = codegen::cuda::choose_attention_kernel(s, 64 * 1024);
  ASSERT_TRUE(k);
  EXPECT_LE(nvptx::attention_shared_bytes(*k), 64 * 1024);
  EXPECT_LT(k->block_q * 1000 + k->block_k, 32 * 1000 + 32);
  std::string why;
  s.dk = s.dv = 4096;
  EXPECT_FALSE(codegen::cuda::choose_attention_kernel(s, 0, &why));
  EXPECT_THAT(why, ::testing::HasSubstr("no tiling"));
}

Plan plan_of(const Case& c, const Graph& lowered, int max_shared = 0) {
  codegen::cuda::PlanOptions o;
  o.max_shared_bytes = max_shared;
  return codegen::cuda::plan(lowered, bind_extents(lowered, c.feeds), o);
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
std::int64_t i64(const std::vector<Arg>& a, std::size_t k) { return a.at(k).i64; }

/// Each launch's grid and parameter count against the nvptx header's rules, worked out here from
/// the launch's own size parameters (not with the *_grid helpers the plan uses).
void expect_header_geometry(const Plan& p, const std::string& name) {
  for (std::size_t id = 0; id < p.steps.size(); ++id)
    for (const auto& l : p.steps[id].launches) {
      const auto& a = l.args;
      std::visit(
          [&](const auto& r) {
            using T = std::decay_t<decltype(r)>;
            nvptx::Dim3 want;
            std::size_t params = 0;
            if constexpr (std::is_same_v<T, nvptx::AttentionKernel>) {
              params = 14;
              const int bq = r.block_q > 0                   ? r.block_q
                             : r.spec.storage == DType::bf16 ? 16 * (r.threads / 32)  // 16 rows per warp
                             : r.spec.dv <= 128              ? 64
                                                             : 32;
              want = {ceil_div(i64(a, 10), bq), r.spec.hq, i64(a, 9)};
              EXPECT_EQ(r.spec.write_weights, a.at(4).kind == Arg::Kind::buffer) << name;
              EXPECT_EQ(r.spec.write_lse, a.at(13).kind == Arg::Kind::buffer) << name;
              EXPECT_EQ(r.spec.key_padding, a.at(5).kind == Arg::Kind::buffer) << name;
              EXPECT_EQ(r.spec.bias, a.at(6).kind == Arg::Kind::buffer) << name;
              // The mod's tensors: one table, addresses then extents.
              const bool table = !r.spec.tensors.empty();
              EXPECT_EQ(table, a.at(7).kind == Arg::Kind::buffer) << name;
              EXPECT_EQ(table, a.at(8).kind == Arg::Kind::buffer) << name;
              if (table) {
                EXPECT_EQ(a.at(7).buffer, a.at(8).buffer) << name;
                EXPECT_EQ(a.at(7).offset, 0) << name;
                EXPECT_EQ(a.at(8).offset, static_cast<std::int64_t>(8 * r.spec.tensors.size())) << name;
              }
              EXPECT_LE(nvptx::attention_shared_bytes(r), 227 * 1024) << name;
            } else if constexpr (std::is_same_v<T, nvptx::DecodeAttentionKernel>) {
              params = 14;
              const std::int64_t S = i64(a, 10), len = i64(a, 12);
              const std::int64_t chunks = S > 0 ? ceil_div(S, len) : 1;
              want = {chunks, i64(a, 8) * r.spec.hkv * i64(a, 9), 1};
              EXPECT_LE(i64(a, 9), nvptx::kDecodeQueries) << name;
              EXPECT_EQ(r.spec.write_lse, a.at(11).kind == Arg::Kind::buffer) << name;
              EXPECT_EQ(chunks > 1, a.at(13).kind == Arg::Kind::buffer) << name << ": a workspace iff chunks > 1";
            } else if constexpr (std::is_same_v<T, nvptx::DecodeMergeKernel>) {
              params = 6;
              want = {i64(a, 3) * r.spec.hkv * i64(a, 4), 1, 1};
              EXPECT_GT(i64(a, 5), 1) << name << ": a merge of one chunk";
              EXPECT_EQ(a.at(2).kind, Arg::Kind::buffer) << name;
            } else if constexpr (std::is_same_v<T, nvptx::LinearKernel>) {
              params = 7;
              want = {ceil_div(i64(a, 4), r.block_m), ceil_div(i64(a, 5), r.block_n), 1};
            } else if constexpr (std::is_same_v<T, nvptx::LayerNormKernel>) {
              params = 7;
              want = {ceil_div(i64(a, 4), r.threads / 32), 1, 1};
              EXPECT_EQ(a.at(6).kind, Arg::Kind::f32) << name;
            } else if constexpr (std::is_same_v<T, nvptx::ElementwiseKernel>) {
              params = 4;
              want = {std::min<std::int64_t>(ceil_div(i64(a, 3), r.threads), 65535), 1, 1};
              EXPECT_EQ(r.op == nvptx::ElementwiseOp::add, a.at(1).kind == Arg::Kind::buffer) << name;
            } else if constexpr (std::is_same_v<T, nvptx::AttentionBackwardKernel>) {
              params = 18;
              want = nvptx::attention_backward_grid(r, i64(a, 14), i64(a, 15), i64(a, 16));
              EXPECT_EQ(r.spec.key_padding, a.at(10).kind == Arg::Kind::buffer) << name;
              EXPECT_EQ(r.spec.bias, a.at(11).kind == Arg::Kind::buffer) << name;
              EXPECT_EQ(!r.spec.tensors.empty(), a.at(12).kind == Arg::Kind::buffer) << name;
            } else {
              params = 16;
              want = {std::min<std::int64_t>(ceil_div(i64(a, 2), r.threads), 65535), 1, 1};
              std::int64_t count = 1;
              for (int k = 0; k < 6; ++k) count *= i64(a, 4 + static_cast<std::size_t>(k));
              EXPECT_EQ(count, i64(a, 2)) << name << ": copy count";
              EXPECT_GE(r.rank, 1);
              EXPECT_LE(r.rank, 6);
            }
            EXPECT_EQ(a.size(), params) << name << " node " << id;
            EXPECT_TRUE(l.grid == want) << name << " node " << id << ": grid " << l.grid.x << "," << l.grid.y << ","
                                        << l.grid.z << ", the header says " << want.x << "," << want.y << "," << want.z;
            EXPECT_GT(l.grid.x * l.grid.y * l.grid.z, 0) << name;
          },
          l.request);
    }
}

/// Buffers: every launch reads and writes buffers alive at its step; graph outputs live to the
/// end; everything else is freed after its last reader, exactly once.
void expect_lifetimes(const Plan& p, const Graph& g, const std::string& name) {
  const int end = static_cast<int>(g.size());
  for (const auto& o : g.outputs())
    EXPECT_EQ(p.buffers.at(static_cast<std::size_t>(p.buffer[static_cast<std::size_t>(o.node)])).last, end) << name;
  for (std::size_t id = 0; id < p.steps.size(); ++id) {
    for (const auto& l : p.steps[id].launches)
      for (const auto& a : l.args)
        if (a.kind == Arg::Kind::buffer) {
          const auto& b = p.buffers.at(static_cast<std::size_t>(a.buffer));
          EXPECT_LE(b.first, static_cast<int>(id)) << name << " node " << id;
          EXPECT_GE(b.last, static_cast<int>(id)) << name << " node " << id;
        }
    for (int x : g.node(static_cast<int>(id)).inputs)
      EXPECT_GE(p.buffers.at(static_cast<std::size_t>(p.buffer[static_cast<std::size_t>(x)])).last,
                static_cast<int>(id))
          << name << ": %" << x << " freed before %" << id << " reads it";
  }
  std::vector<int> freed(p.buffers.size(), 0);
  for (const auto& list : p.free_after)
    for (int b : list) ++freed.at(static_cast<std::size_t>(b));
  for (std::size_t b = 0; b < p.buffers.size(); ++b)
    EXPECT_EQ(freed[b], p.buffers[b].last == end ? 0 : 1) << name << " buffer " << b;
}

TEST(GpuPlan, CliModelsRunEveryNodeOnAGpuKernel) {
  int models = 0;
  for (const Case& c : cli_model_cases()) {
    const Graph lowered = codegen::lower(c.graph);
    const Plan p = plan_of(c, lowered);
    ++models;
    for (std::size_t id = 0; id < p.steps.size(); ++id) {
      const Step& s = p.steps[id];
      const Node& n = lowered.node(static_cast<int>(id));
      EXPECT_NE(s.kind, Step::Kind::host) << c.name << ": %" << id << " " << op_name(n.op) << " on the host: " << s.why;
      if (s.kind == Step::Kind::gpu) {
        EXPECT_FALSE(s.launches.empty()) << c.name << ": %" << id;
      }
    }
    EXPECT_EQ(p.host_steps(), 0) << c.name << "\n" << lowered.table();
    expect_header_geometry(p, c.name);
    expect_lifetimes(p, lowered, c.name);
  }
  EXPECT_GE(models, 10);
}

TEST(GpuPlan, SweepAndFixturesFollowTheHeaderRulesAndLifetimes) {
  for (const auto& shape : sweep_shapes()) {
    const Case c = sweep_case(shape);
    const Graph lowered = codegen::lower(c.graph);
    const Plan p = plan_of(c, lowered);
    EXPECT_EQ(p.host_steps(), 0) << c.name << "\n" << lowered.table();
    expect_header_geometry(p, c.name);
    expect_lifetimes(p, lowered, c.name);
  }
  for (const auto& name : fixture_names()) {
    const Case c = fixture_case(name);
    const Graph lowered = codegen::lower(c.graph);
    const Plan p = plan_of(c, lowered);
    // Every fused attention runs on the GPU, whatever its mod (the kernel evaluates it).
    for (std::size_t id = 0; id < p.steps.size(); ++id) {
      if (lowered.node(static_cast<int>(id)).op == Op::fused_attention) {
        EXPECT_EQ(p.steps[id].kind, Step::Kind::gpu) << c.name << ": " << p.steps[id].why;
      }
    }
    expect_header_geometry(p, c.name);
    expect_lifetimes(p, lowered, c.name);
  }
}

TEST(GpuPlan, EveryKernelOfEveryFixtureAndCliModelAssemblesForSm80AndSm90) {
  // The PTX the GPU backend would load for each fixture's graph and each CLI model, through
  // ptxas for both targets (here, without a GPU: the toolkit's assembler is enough).
  if (!nvptx::find_ptxas()) GTEST_SKIP() << "no ptxas ($QKV_PTXAS, PATH, /usr/local/cuda/bin)";
  std::vector<Case> cases;
  for (const auto& name : fixture_names()) cases.push_back(fixture_case(name));
  for (auto& c : cli_model_cases()) cases.push_back(std::move(c));
  std::map<std::string, nvptx::KernelRequest> kernels;  // by name: each distinct kernel once
  for (const auto& c : cases) {
    const Graph lowered = codegen::lower(c.graph);
    const Plan p = plan_of(c, lowered);
    for (const auto& step : p.steps)
      for (const auto& launch : step.launches) kernels.emplace(nvptx::kernel_name(launch.request), launch.request);
  }
  ASSERT_GE(kernels.size(), 8u);  // attention variants, linear, layer norm, elementwise, copies
  for (const auto& [name, request] : kernels)
    for (int sm : {80, 90}) {
      const nvptx::PtxKernel k = nvptx::emit_ptx(request, sm);
      std::string error;
      const auto report = nvptx::run_ptxas(k.ptx, sm, &error);
      ASSERT_TRUE(report) << name << " sm_" << sm << ": " << error;
      EXPECT_GT(report->registers, 0) << name;
      EXPECT_EQ(report->spill_stores, 0) << name << " sm_" << sm;
    }
  std::cout << "  " << kernels.size() << " distinct kernels assembled for sm_80 and sm_90\n";
}

TEST(GpuPlan, TheEncoderLayerFreesIntermediatesBeforeTheEnd) {
  for (const Case& c : cli_model_cases()) {
    if (c.name.rfind("encoder_layer", 0) != 0) continue;
    const Graph lowered = codegen::lower(c.graph);
    const Plan p = plan_of(c, lowered);
    HostMachine m;
    (void)codegen::cuda::execute_on(m, lowered, c.feeds);
    std::size_t total = 0;
    for (const auto& b : p.buffers) total += b.bytes;
    EXPECT_LT(m.peak_bytes, total) << c.name << ": nothing freed early";
    EXPECT_EQ(m.live_bytes, 0u) << c.name << ": device memory left allocated after the run";
    EXPECT_TRUE(m.errors.empty()) << c.name;
  }
}

TEST(GpuPlan, PerHeadMasksRunInTheGpuAttentionKernelAndStayCorrect) {
  // A [batch, heads, L, S] keep-mask fuses (a load of the mod expression). The PTX kernel
  // evaluates the mod itself, so the fused node runs on the GPU, reading the mask through its
  // tensor table. (This used to be a host fallback when the kernel took only the classic
  // causal / key-padding / bias flags: an improvement, not a looser check.)
  const Case c = fixture_case("mask_3d");
  const Graph lowered = codegen::lower(c.graph);
  const Plan p = plan_of(c, lowered);
  int attention_on_gpu = 0;
  for (std::size_t id = 0; id < p.steps.size(); ++id)
    if (lowered.node(static_cast<int>(id)).op == Op::fused_attention) {
      const Step& s = p.steps[id];
      EXPECT_EQ(s.kind, Step::Kind::gpu) << s.why;
      ASSERT_EQ(s.launches.size(), 1u);
      EXPECT_GE(s.tensor_table, 0);
      const auto& r = std::get<nvptx::AttentionKernel>(s.launches[0].request);
      EXPECT_FALSE(r.spec.mod.empty());
      EXPECT_FALSE(r.spec.tensors.empty());
      ++attention_on_gpu;
    }
  EXPECT_EQ(attention_on_gpu, 1) << lowered.table();
  expect_header_geometry(p, c.name);
  expect_lifetimes(p, lowered, c.name);
  HostMachine m;
  const RunResult got = codegen::cuda::execute_on(m, lowered, c.feeds);
  const RunResult want = interpret(c.graph, c.feeds);
  EXPECT_TRUE(m.errors.empty()) << (m.errors.empty() ? "" : m.errors.front());
  EXPECT_EQ(m.launches["attention"], 1);
  for (const auto& [name, w] : want.outputs) EXPECT_LE(relative_error(got.outputs.at(name), w).worst, 2e-5) << name;
}

TEST(GpuPlan, AnAttentionNoTilingFitsRunsOnTheHostCpuKernel) {
  SweepShape s;
  s.batch = 2;
  s.heads = 2;
  s.kv_heads = 2;
  s.len_q = 9;
  s.len_k = 13;
  s.padding = true;
  s.bias = true;
  s.weights = true;
  const Case c = sweep_case(s);
  const Graph lowered = codegen::lower(c.graph);
  HostMachine tiny(1024);  // 1 KiB of shared memory: no attention tiling fits
  const Plan p = plan_of(c, lowered, tiny.max_shared_bytes());
  int attention_on_host = 0;
  for (std::size_t id = 0; id < p.steps.size(); ++id)
    if (lowered.node(static_cast<int>(id)).op == Op::fused_attention) {
      EXPECT_EQ(p.steps[id].kind, Step::Kind::host);
      EXPECT_THAT(p.steps[id].why, ::testing::HasSubstr("no tiling"));
      ++attention_on_host;
    }
  EXPECT_EQ(attention_on_host, 1);
  const RunResult got = codegen::cuda::execute_on(tiny, lowered, c.feeds);
  const RunResult want = interpret(c.graph, c.feeds);
  EXPECT_TRUE(tiny.errors.empty());
  EXPECT_EQ(tiny.launches.count("attention"), 0u);
  for (const auto& [name, w] : want.outputs) EXPECT_LE(relative_error(got.outputs.at(name), w).worst, 2e-5) << name;
}

TEST(GpuPlan, TheLogSumExpComesFromTheGpuKernelAndFromTheHostFallback) {
  // logsumexp<Key> beside the softmax: the attention kernel's 14th parameter on the GPU, the CPU
  // kernel's args.lse on the host fallback; L > S bottom-right, so the first rows are -inf.
  using namespace qkv::nn;
  Graph g;
  auto q = input<Tensor<f32, Batch<dyn>, Heads<2>, Seq<dyn>, HeadDim<32>>>(g, "q");
  auto k = input<Tensor<f32, Batch<dyn>, Heads<2>, Key<dyn>, HeadDim<32>>>(g, "k");
  auto v = input<Tensor<f32, Batch<dyn>, Heads<2>, Key<dyn>, HeadDim<32>>>(g, "v");
  auto s = modded(scaled(contract<HeadDim>(q, k)), mods::causal(bottom_right), mods::softcap(4.0));
  output(contract<Key>(softmax<Key>(s), v), "out");
  output(logsumexp<Key>(s), "lse");
  const Feeds feeds = random_feeds(g, {{"Batch", 2}, {"Seq", 41}, {"Key", 29}}, 77);
  const Graph lowered = codegen::lower(g);
  const RunResult want = interpret(g, feeds);
  for (const int shared : {227 * 1024, 1024}) {  // the device's limit; 1 KiB: no tiling fits
    HostMachine m(shared);
    const RunResult got = codegen::cuda::execute_on(m, lowered, feeds);
    EXPECT_TRUE(m.errors.empty()) << (m.errors.empty() ? "" : m.errors.front());
    EXPECT_EQ(m.launches.count("attention"), shared > 1024 ? 1u : 0u);
    for (const auto& [name, w] : want.outputs)
      EXPECT_LE(relative_error(got.outputs.at(name), w).worst, 2e-5) << name << " shared " << shared;
    EXPECT_TRUE(std::isinf(got.outputs.at("lse").to_f32()[0]));
  }
  // The kernel with its lse store assembles without spills.
  if (!nvptx::find_ptxas()) return;
  const Plan p = codegen::cuda::plan(lowered, bind_extents(lowered, feeds));
  for (const auto& step : p.steps)
    for (const auto& launch : step.launches)
      if (const auto* a = std::get_if<nvptx::AttentionKernel>(&launch.request)) {
        ASSERT_TRUE(a->spec.write_lse);
        for (int sm : {80, 90}) {
          std::string error;
          const auto report = nvptx::run_ptxas(nvptx::emit_ptx(launch.request, sm).ptx, sm, &error);
          ASSERT_TRUE(report) << error;
          EXPECT_EQ(report->spill_stores, 0) << "sm_" << sm;
          std::cout << "  attention with lse, sm_" << sm << ": " << report->registers << " registers\n";
        }
      }
}

TEST(GpuPlan, Bf16AttentionRunsOnTheTensorCoreKernelOrFallsBackWithAReason) {
  // bf16 q, k, v: the fused attention is the tensor-core kernel (its inputs uploaded as bf16 bits,
  // its output downloaded as bf16) — and with its weights asked for, which that kernel does not
  // write, the CPU's bf16 kernel on the host, saying why.
  using namespace qkv::nn;
  for (const bool weights : {false, true}) {
    Graph g;
    auto q = input<Tensor<bf16, Batch<dyn>, Heads<2>, Seq<dyn>, HeadDim<64>>>(g, "q");
    auto k = input<Tensor<bf16, Batch<dyn>, Heads<2>, Key<dyn>, HeadDim<64>>>(g, "k");
    auto v = input<Tensor<bf16, Batch<dyn>, Heads<2>, Key<dyn>, HeadDim<64>>>(g, "v");
    auto p = softmax<Key>(modded(scaled(contract<HeadDim>(q, k)), mods::causal(bottom_right)));
    output(contract<Key>(p, v), "out");
    if (weights) output(p, "weights");
    const Feeds feeds = random_feeds(g, {{"Batch", 2}, {"Seq", 37}, {"Key", 70}}, 5, 1.0f);
    const Graph lowered = codegen::lower(g);
    const Plan plan = codegen::cuda::plan(lowered, bind_extents(lowered, feeds));
    int fused = 0;
    for (std::size_t id = 0; id < plan.steps.size(); ++id) {
      if (lowered.node(static_cast<int>(id)).op != Op::fused_attention) continue;
      ++fused;
      const Step& s = plan.steps[id];
      if (weights) {
        EXPECT_EQ(s.kind, Step::Kind::host);
        EXPECT_THAT(s.why, ::testing::HasSubstr("tensor-core kernel"));
        EXPECT_THAT(s.why, ::testing::HasSubstr("weights"));
      } else {
        EXPECT_EQ(s.kind, Step::Kind::gpu) << s.why;
        ASSERT_EQ(s.launches.size(), 1u);
        const auto& r = std::get<nvptx::AttentionKernel>(s.launches[0].request);
        EXPECT_EQ(r.spec.storage, DType::bf16);
        EXPECT_EQ(r.block_k, 64);
      }
    }
    EXPECT_EQ(fused, 1) << lowered.table();
    expect_header_geometry(plan, "bf16 attention");
    expect_lifetimes(plan, lowered, "bf16 attention");
    HostMachine m;
    const RunResult got = codegen::cuda::execute_on(m, lowered, feeds);
    const RunResult want = interpret(g, feeds);  // rounds the scores and the weights to bf16 too
    EXPECT_TRUE(m.errors.empty()) << (m.errors.empty() ? "" : m.errors.front());
    EXPECT_EQ(m.launches.count("attention_bf16"), weights ? 0u : 1u);
    ASSERT_EQ(got.outputs.at("out").dtype, DType::bf16);
    for (const auto& [name, w] : want.outputs) EXPECT_LE(relative_error(got.outputs.at(name), w).worst, 2e-2) << name;
  }
}

TEST(GpuPlan, Bf16LinearsRunOnTheTensorCoreGemm) {
  // An attention layer moved to bf16 as a whole: each linear (q/k/v with a bias, out without)
  // is the bf16 tensor-core GEMM — x, W and the bias read as stored, y written as bf16 into the
  // value of the convert that rounds the CPU GEMM's f32 (that convert a view) — and the
  // attention the tensor-core attention kernel. Against the interpreter, which rounds each op's
  // value to bf16 as the kernels do (the sums in other orders): within bf16's precision.
  using namespace qkv::nn;
  Graph model;
  constexpr int E = 64;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<E>>>(model, "x");
  auto heads = [](auto t) { return permute<Batch, Heads, Seq, HeadDim>(split<Model, Heads<2>, HeadDim<E / 2>>(t)); };
  auto q = heads(linear(x, linear_params<Model<E>, Model<E>>(model, "q_proj")));
  auto k = rename<Seq, Key>(heads(linear(x, linear_params<Model<E>, Model<E>>(model, "k_proj"))));
  auto v = rename<Seq, Key>(heads(linear(x, linear_params<Model<E>, Model<E>>(model, "v_proj"))));
  auto p = softmax<Key>(modded(scaled(contract<HeadDim>(q, k)), mods::causal(bottom_right)));
  auto o = merge<Heads, HeadDim, Model>(permute<Batch, Seq, Heads, HeadDim>(contract<Key>(p, v)));
  output(linear(o, linear_params<Model<E>, Model<E>>(model, "out_proj", /*bias=*/false)), "out");
  const Graph g = with_float_dtype(model, DType::bf16);
  // Small values: scores of order 1 (at scale 1 the softmax is one-hot and the interpreter's
  // bf16 scores pick other keys than the kernels' f32 ones).
  const Feeds feeds = random_feeds(g, {{"Batch", 2}, {"Seq", 37}}, 3, 0.25f);
  const Graph lowered = codegen::lower(g);
  const Plan plan = codegen::cuda::plan(lowered, bind_extents(lowered, feeds));
  int gemms = 0, biases = 0;
  for (std::size_t id = 0; id < plan.steps.size(); ++id) {
    const Node& n = lowered.node(static_cast<int>(id));
    const Step& s = plan.steps[id];
    if (n.op == Op::linear) {
      ++gemms;
      EXPECT_EQ(s.kind, Step::Kind::gpu) << s.why;
      ASSERT_EQ(s.launches.size(), 1u);
      const auto& r = std::get<nvptx::LinearKernel>(s.launches[0].request);
      EXPECT_EQ(r.storage, DType::bf16);
      biases += s.launches[0].args.at(2).kind == Arg::Kind::buffer;
    }
    if (n.op == Op::convert && lowered.node(n.inputs[0]).op == Op::linear) {
      EXPECT_EQ(s.kind, Step::Kind::view);
      EXPECT_EQ(plan.buffer[id], plan.buffer[static_cast<std::size_t>(n.inputs[0])]);
    }
    if (n.op == Op::fused_attention) {
      EXPECT_EQ(s.kind, Step::Kind::gpu) << s.why;
    }
  }
  EXPECT_EQ(gemms, 4) << lowered.table();
  EXPECT_EQ(biases, 3);
  expect_header_geometry(plan, "bf16 linears");
  expect_lifetimes(plan, lowered, "bf16 linears");
  HostMachine m;
  const RunResult got = codegen::cuda::execute_on(m, lowered, feeds);
  EXPECT_TRUE(m.errors.empty()) << (m.errors.empty() ? "" : m.errors.front());
  EXPECT_EQ(m.launches["linear_bf16"], 4);
  EXPECT_EQ(m.launches.count("attention_bf16"), 1u);
  ASSERT_EQ(got.outputs.at("out").dtype, DType::bf16);
  const RunResult want = interpret(g, feeds);
  const double err = relative_error(got.outputs.at("out"), want.outputs.at("out")).worst;
  RecordProperty("error_vs_interpreter", std::to_string(err));
  EXPECT_LE(err, 2e-2);
  // The same graph on the CPU backend (its GEMM and attention kernels read bf16 too).
  const RunResult cpu = codegen::cpu::run(g, feeds, 2);
  EXPECT_LE(relative_error(got.outputs.at("out"), cpu.outputs.at("out")).worst, 2e-2);
}

TEST(GpuPlan, AKvCacheAppendIsCopiedOnTheGpuAndTheAttentionReadsItsPrefix) {
  // cache_append's update_slice: the cache copied whole, then the step's rows of each (batch,
  // head), all by the strided-copy kernel; the prefix the attention reads is a slice (a copy).
  const Graph g = cached_attention_layer();
  const Graph lowered = codegen::lower(g);
  for (std::int64_t seq : {1, 5}) {  // the split-KV decode kernel and the fused one
    SCOPED_TRACE("seq " + std::to_string(seq));
    Feeds f = random_feeds(g,
                           {{"Batch", 2},
                            {"Seq", seq},
                            {"Slot", 20},
                            {"Past", 9},
                            {"KvHeads", 2},
                            {"HeadDim", 8},
                            {"QProj", 32},
                            {"KvProj", 16}},
                           3 + static_cast<std::uint64_t>(seq), 0.5f);
    NdArray positions = NdArray::zeros(DType::i64, {2, seq});
    for (std::int64_t k = 0; k < 2 * seq; ++k) positions.as<std::int64_t>()[static_cast<std::size_t>(k)] = 9 + k % seq;
    f["positions"] = positions;
    const Plan p = codegen::cuda::plan(lowered, bind_extents(lowered, f), {});
    for (std::size_t id = 0; id < p.steps.size(); ++id)
      if (lowered.node(static_cast<int>(id)).op == Op::update_slice) {
        EXPECT_EQ(p.steps[id].kind, Step::Kind::gpu) << p.steps[id].why;
        EXPECT_EQ(p.steps[id].launches.size(), 1u + 4u) << "the cache, then the rows of each of 2 × 2 (batch, head)";
      }
    HostMachine m;
    const RunResult got = codegen::cuda::execute_on(m, lowered, f);
    const RunResult want = interpret(g, f);
    EXPECT_TRUE(m.errors.empty()) << (m.errors.empty() ? "" : m.errors.front());
    for (const auto& [name, w] : want.outputs) EXPECT_LE(relative_error(got.outputs.at(name), w).worst, 2e-5) << name;
  }
}

TEST(GpuPlan, RunWithoutAGpuThrowsNoGpu) {
  if (cuda::why_no_gpu().empty()) GTEST_SKIP() << "a GPU is present: this test checks the error without one";
  const Case c = sweep_case(sweep_shapes().front());
  try {
    (void)codegen::cuda::run(c.graph, c.feeds);
    ADD_FAILURE() << "cuda::run returned without a GPU";
  } catch (const cuda::NoGpu& e) {
    EXPECT_EQ(std::string(e.what()).rfind(cuda::no_gpu_prefix, 0), 0u) << e.what();
  }
  EXPECT_THROW((void)codegen::cuda::execute(codegen::lower(c.graph), c.feeds), cuda::NoGpu);
  EXPECT_THROW((void)codegen::cuda::AttentionBench({}, 1, 1, 1), cuda::NoGpu);
}

}  // namespace
}  // namespace qkv::test
