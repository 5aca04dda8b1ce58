// The GPU backend against the reference interpreter: every PyTorch fixture, a sweep of attention
// shapes and the CLI's models, each run two ways:
//   gpu/…       qkv::codegen::cuda::run on GPU 0 — skipped, with the reason, without a GPU;
//   emulated/…  the same lowered graph, plan and executor (cuda::execute_on) on HostMachine, which
//               implements every NVPTX kernel on the CPU from the header's contract and checks
//               the memory the launches touch — runs everywhere.
//
// Tolerance: |got − ref| <= kTolerance · max(1, |ref|) element-wise (ref: the interpreter, fp64
// accumulation). The GPU computes in fp32 with fp32 accumulation: a dot product of n terms is off
// by about sqrt(n)·2^-24·Σ|terms| (n <= 512 here: the fixtures' linears, head widths <= 128),
// i.e. ~1e-6 for these magnitudes; the softmax's exp is ex2.approx.ftz (max relative error
// ~2^-22, 2.4e-7) of scores pre-multiplied by log2 e in fp32 (one rounding: a relative error
// |s − m|·2^-24 in e^(s−m), at most 2^-24/e ≈ 2.2e-8 absolute on a probability); the row sum and
// P·V add another sqrt(S)·2^-24. Layer norm divides by a standard deviation of ~1 here. The sum
// is a few 1e-6 relative to max(1, |ref|); 2e-5 leaves a 4–10× margin — the same margin the CPU
// backend's kernels (~2e-7-accurate exp, same fp32 accumulation) show against this bound, which
// the test prints next to each GPU error for comparison. Dropout uses the interpreter's Philox
// mask, so it is compared with the same tolerance, not statistically.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/cuda/executor.hpp>
#include <qkv/codegen/passes/canonicalize.hpp>
#include <qkv/codegen/passes/fuse_attention.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/dsl/grad.hpp>
#include <qkv/ir/float_dtype.hpp>
#include <qkv/ir/grad.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/cuda.hpp>
#include <qkv/runtime/random_feeds.hpp>

#include "../support/cases.hpp"
#include "host_machine.hpp"

namespace qkv::test {
namespace {

constexpr double kTolerance = 2e-5;

/// `tolerance`: per output, where its sums are longer than the fixtures' (else kTolerance).
void check(const Case& c, const std::string& backend, const std::map<std::string, double>& tolerance = {}) {
  RunResult got;
  if (backend == "gpu") {
    if (const std::string why = cuda::why_no_gpu(); !why.empty()) GTEST_SKIP() << why;
    got = codegen::cuda::run(c.graph, c.feeds);
  } else {
    HostMachine machine;
    got = codegen::cuda::execute_on(machine, codegen::lower(c.graph), c.feeds);
    for (const auto& e : machine.errors) ADD_FAILURE() << c.name << ": " << e;
    EXPECT_GT(machine.launches.size(), 0u) << c.name << ": nothing ran on the (emulated) GPU";
  }
  const RunResult want = interpret(c.graph, c.feeds);
  const RunResult cpu = codegen::cpu::run(c.graph, c.feeds);
  ASSERT_EQ(got.outputs.size(), want.outputs.size());
  for (const auto& [name, w] : want.outputs) {
    ASSERT_TRUE(got.outputs.count(name)) << name;
    const NdArray& g = got.outputs.at(name);
    EXPECT_EQ(g.dtype, w.dtype) << name;
    EXPECT_EQ(g.shape, w.shape) << name;
    const Error err = relative_error(g, w), cpu_err = relative_error(cpu.outputs.at(name), w);
    const double bound = tolerance.count(name) ? tolerance.at(name) : kTolerance;
    std::cout << "  " << c.name << " " << name << " (" << backend << "): max error " << err.worst
              << " (cpu backend: " << cpu_err.worst << "), tolerance " << bound << "\n";
    EXPECT_LE(err.worst, bound) << c.name << " " << name << " on " << backend << " at element " << err.at << ": "
                                << g.to_f32()[err.at] << " vs " << w.to_f32()[err.at];
  }
}

const std::vector<std::string> kBackends{"gpu", "emulated"};

std::string param_name(const std::string& backend, std::string what) {
  for (char& ch : what)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return backend + "_" + what;
}

// --- fixtures
class Fixture : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};
TEST_P(Fixture, MatchesTheInterpreter) {
  const auto& [backend, name] = GetParam();
  check(fixture_case(name), backend);
}
INSTANTIATE_TEST_SUITE_P(All, Fixture,
                         ::testing::Combine(::testing::ValuesIn(kBackends), ::testing::ValuesIn(fixture_names())),
                         [](const auto& i) { return param_name(std::get<0>(i.param), std::get<1>(i.param)); });

// --- the sweep
class Sweep : public ::testing::TestWithParam<std::tuple<std::string, SweepShape>> {};
TEST_P(Sweep, MatchesTheInterpreter) {
  const auto& [backend, shape] = GetParam();
  check(sweep_case(shape), backend);
}
INSTANTIATE_TEST_SUITE_P(All, Sweep,
                         ::testing::Combine(::testing::ValuesIn(kBackends), ::testing::ValuesIn(sweep_shapes())),
                         [](const auto& i) {
                           return param_name(std::get<0>(i.param), sweep_name(std::get<1>(i.param)));
                         });

// --- the CLI's models
class CliModel : public ::testing::TestWithParam<std::tuple<std::string, std::size_t>> {};
TEST_P(CliModel, MatchesTheInterpreter) {
  const auto& [backend, index] = GetParam();
  check(cli_model_cases().at(index), backend);
}
INSTANTIATE_TEST_SUITE_P(All, CliModel,
                         ::testing::Combine(::testing::ValuesIn(kBackends),
                                            ::testing::Range<std::size_t>(0, cli_model_cases().size())),
                         [](const auto& i) {
                           return param_name(std::get<0>(i.param), cli_model_cases().at(std::get<1>(i.param)).name);
                         });

// --- gradients: the fused attention backward planned for the GPU (its dq and dkdv launches, D,
// the dK / dV companions' buffers, the mod's tensor table). HostMachine runs each launch with the
// CPU backward; the kernels themselves are host-emulated in tests/codegen/nvptx.

/// GQA attention (2 kv heads × 2, L = 37, S = 45) with a causal mask, a softcap, key padding and
/// dropout; loss = Σ y ∘ probe, fused, then its gradients by q, k and v as outputs. With
/// `slopes`, ALiBi too and the gradient of its slopes [KvHeads, Group]. `dtype`: the graph's
/// floats (bf16: q, k, v, the attention and its gradients stored as bf16); DV the value width.
template <int DV = 12>
Case gradient_case(bool slopes = false, DType dtype = DType::f32) {
  using namespace nn;
  Graph g;
  auto q = input<Tensor<f32, Batch<dyn>, KvHeads<2>, Group<2>, Seq<dyn>, HeadDim<16>>>(g, "q");
  auto k = input<Tensor<f32, Batch<dyn>, KvHeads<2>, Key<dyn>, HeadDim<16>>>(g, "k");
  auto v = input<Tensor<f32, Batch<dyn>, KvHeads<2>, Key<dyn>, ValueDim<DV>>>(g, "v");
  auto s = scaled(contract<HeadDim>(q, k));
  s = decltype(s)(g, modded(s, mods::softcap(3.0)).id());
  if (slopes)
    s = decltype(s)(g,
                    modded(s, mods::alibi(input<Tensor<f32, KvHeads<2>, Group<2>>>(g, "slopes"), bottom_right)).id());
  s = masked(s, input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep"));
  s = causal<Seq, Key>(s, bottom_right);
  auto y = contract<Key>(dropout(softmax<Key>(s), 0.2, 0x5eedull), v);
  auto probe = input<Tensor<f32, Batch<dyn>, KvHeads<2>, Group<2>, Seq<dyn>, ValueDim<DV>>>(g, "probe");
  output(sum<Batch, KvHeads, Group, Seq, ValueDim>(y * probe), "loss");
  if (dtype != DType::f32) g = with_float_dtype(g, dtype);
  const std::int64_t B = 2, S = 45;
  Feeds feeds = random_feeds(g, {{"Batch", B}, {"Seq", 37}, {"Key", S}}, 5);
  NdArray& keep = feeds.at("keep");  // every 7th key from the 4th on padded
  for (std::int64_t j = 0; j < B * S; ++j) keep.bytes[static_cast<std::size_t>(j)] = std::byte{j % 7 != 3};
  Graph fused = codegen::fuse_attention(codegen::canonicalize(g));
  int loss = -1;
  std::vector<int> leaves;
  for (const auto& o : fused.outputs())
    if (o.name == "loss") loss = o.node;
  for (const char* name : {"q", "k", "v", "slopes"})
    for (std::size_t i = 0; i < fused.size(); ++i)
      if (is_array_leaf(fused.node(static_cast<int>(i))) && fused.node(static_cast<int>(i)).name == name)
        leaves.push_back(static_cast<int>(i));
  const std::vector<int> grads = append_gradients(fused, loss, leaves);
  for (std::size_t i = 0; i < grads.size(); ++i)
    fused.mark_output(grads[i], i < 3 ? std::string("d") + "qkv"[i] : std::string("dslopes"));
  return {"attention_gradients", std::move(fused), std::move(feeds), {}};
}

TEST(GpuGradients, TheFusedBackwardRunsOnTheGpuPlan) {
  const Case c = gradient_case();
  const Graph lowered = codegen::lower(c.graph);
  ASSERT_TRUE(std::any_of(lowered.nodes().begin(), lowered.nodes().end(), [](const Node& n) {
    return n.op == Op::fused_attention_backward;
  })) << lowered.table();
  const codegen::cuda::Plan plan = codegen::cuda::plan(lowered, bind_extents(lowered, c.feeds));
  int dq = 0, dkdv = 0;
  for (std::size_t id = 0; id < plan.steps.size(); ++id) {
    const auto& step = plan.steps[id];
    if (lowered.node(static_cast<int>(id)).op == Op::fused_attention_backward) {
      EXPECT_EQ(step.kind, codegen::cuda::Step::Kind::gpu) << step.why;
      ASSERT_EQ(step.launches.size(), 2u);
      dq += std::holds_alternative<codegen::nvptx::AttentionBackwardKernel>(step.launches[0].request);
      const auto& second = std::get<codegen::nvptx::AttentionBackwardKernel>(step.launches[1].request);
      dkdv += second.part == codegen::nvptx::AttentionBackwardKernel::Part::dkdv;
    }
  }
  EXPECT_EQ(dq, 1);
  EXPECT_EQ(dkdv, 1);
  check(c, "emulated");
  HostMachine machine;
  (void)codegen::cuda::execute_on(machine, lowered, c.feeds);
  EXPECT_EQ(machine.launches["attention_backward_dq"], 1);
  EXPECT_EQ(machine.launches["attention_backward_dkdv"], 1);
}

TEST(GpuGradients, TheFusedBackwardOnARealGpu) { check(gradient_case(), "gpu"); }  // skipped without one

/// The gradients of a bf16 gradient_case against the interpreter, which rounds each op's value to
/// bf16 as well: within bf16's precision (2e-2 relative, as the bf16 forward's plan test).
void expect_bf16_gradients(const Case& c, const RunResult& got, const char* backend) {
  const RunResult want = interpret(c.graph, c.feeds);
  for (const char* name : {"dq", "dk", "dv"}) {
    ASSERT_EQ(got.outputs.at(name).dtype, DType::bf16) << name;
    const Error err = relative_error(got.outputs.at(name), want.outputs.at(name));
    std::cout << "  bf16 " << name << " (" << backend << "): max error " << err.worst << "\n";
    EXPECT_LE(err.worst, 2e-2) << name << " on " << backend;
  }
}

/// bf16 q, k, v (dk 16, dv 32): the fused backward's dq and dkdv launches are the tensor-core kernels (bf16 in,
/// bf16 gradients out), run by HostMachine from their contract.
TEST(GpuGradients, TheBf16FusedBackwardRunsOnTheTensorCoreKernels) {
  const Case c = gradient_case<32>(/*slopes=*/false, DType::bf16);  // widths: multiples of 16
  const Graph lowered = codegen::lower(c.graph);
  const codegen::cuda::Plan plan = codegen::cuda::plan(lowered, bind_extents(lowered, c.feeds));
  int backward = 0;
  for (std::size_t id = 0; id < plan.steps.size(); ++id) {
    if (lowered.node(static_cast<int>(id)).op != Op::fused_attention_backward) continue;
    ++backward;
    const auto& step = plan.steps[id];
    EXPECT_EQ(step.kind, codegen::cuda::Step::Kind::gpu) << step.why;
    ASSERT_EQ(step.launches.size(), 2u);
    for (const auto& l : step.launches)
      EXPECT_EQ(std::get<codegen::nvptx::AttentionBackwardKernel>(l.request).spec.storage, DType::bf16);
  }
  EXPECT_EQ(backward, 1) << lowered.table();
  HostMachine machine;
  expect_bf16_gradients(c, codegen::cuda::execute_on(machine, lowered, c.feeds), "emulated");
  for (const auto& e : machine.errors) ADD_FAILURE() << e;
  EXPECT_EQ(machine.launches["attention_backward_dq"], 1);
  EXPECT_EQ(machine.launches["attention_backward_dkdv"], 1);
}

TEST(GpuGradients, TheBf16FusedBackwardOnARealGpu) {  // skipped without one
  if (const std::string why = cuda::why_no_gpu(); !why.empty()) GTEST_SKIP() << why;
  const Case c = gradient_case<32>(/*slopes=*/false, DType::bf16);
  expect_bf16_gradients(c, codegen::cuda::run(c.graph, c.feeds), "gpu");
}

/// ALiBi's slopes [KvHeads, Group] learned: their gradient is the third launch's (the dtensor
/// kernel sums the dkdv blocks' slots), against the interpreter. A slope's gradient is an fp32 sum
/// of B·L·S = 3 330 terms of both signs (∂L/∂score' · −distance), not the fixtures' dot products
/// of ≤ 512: its rounding is about sqrt(3 330)·2^-24·Σ|terms| ≈ 3.4e-6·Σ|terms|, and with terms of
/// both signs Σ|terms| can be several times |the sum|; its bound is 1e-4 relative (the other
/// outputs keep kTolerance; the errors of this GPU plan and of the CPU backend are printed).
const std::map<std::string, double> kSlopeTolerance{{"dslopes", 1e-4}};

TEST(GpuGradients, TheGradientOfAModsTensorRunsOnTheGpuPlan) {
  const Case c = gradient_case(/*slopes=*/true);
  const Graph lowered = codegen::lower(c.graph);
  const codegen::cuda::Plan plan = codegen::cuda::plan(lowered, bind_extents(lowered, c.feeds));
  int sums = 0;
  for (std::size_t id = 0; id < plan.steps.size(); ++id)
    if (lowered.node(static_cast<int>(id)).op == Op::fused_attention_backward) {
      const auto& step = plan.steps[id];
      EXPECT_EQ(step.kind, codegen::cuda::Step::Kind::gpu) << step.why;
      ASSERT_EQ(step.launches.size(), 3u);
      const auto& last = std::get<codegen::nvptx::AttentionBackwardKernel>(step.launches[2].request);
      sums += last.part == codegen::nvptx::AttentionBackwardKernel::Part::dtensor;
      EXPECT_EQ(step.tensor_partials.size(), 1u);
    }
  EXPECT_EQ(sums, 1);
  check(c, "emulated", kSlopeTolerance);
  HostMachine machine;
  (void)codegen::cuda::execute_on(machine, lowered, c.feeds);
  EXPECT_EQ(machine.launches["attention_backward_dtensor"], 1);
}

TEST(GpuGradients, TheGradientOfAModsTensorOnARealGpu) {
  check(gradient_case(/*slopes=*/true), "gpu", kSlopeTolerance);
}  // skipped without one

}  // namespace
}  // namespace qkv::test
