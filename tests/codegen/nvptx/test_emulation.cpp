// The GPU kernels' logic on the CPU: each generator's host-emulation variant (the same IR, with
// thread ids, __syncthreads, __syncwarp, warp shuffles, ex2 and lg2 turned into calls to the hooks
// below and shared memory a host buffer) is JIT-compiled for the host and run with one host
// thread per GPU thread, block after block — then compared with the CPU kernels (attention,
// linear, layer norm, GELU/ReLU/add) or exact expectations (scale, strided copy).
//
// What this checks: the tiling, indexing, masks and mods (loads of captured tensors, named head
// axes, exp / log / tanh), tile skipping by the keep predicate's bounds (every thread of a block
// must take the same branch: a skipped barrier deadlocks), online softmax, dropout counters,
// weights, GQA, bounds handling and the barrier / shuffle protocol (a barrier reached by only part
// of a block deadlocks here and aborts the test after a minute). What it cannot check:
// the NVPTX backend's lowering and the hardware itself — that needs a GPU.
//
// The emulated GPU is emulated_gpu.hpp; the dense kernels' tests are test_emulation_dense.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <qkv/codegen/cpu/gemm.hpp>
#include <qkv/codegen/cpu/rowwise.hpp>
#include <qkv/codegen/cpu/run_attention.hpp>
#include <qkv/codegen/cpu/run_attention_backward.hpp>
#include <qkv/codegen/jit.hpp>
#include <qkv/codegen/lowering/attention_call.hpp>
#include <qkv/codegen/lowering/select.hpp>
#include <qkv/codegen/nvptx.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

#include "emulated_gpu.hpp"
#include "nvptx/geometry.hpp"
#include "nvptx/kernel_builder.hpp"

namespace qkv {
namespace {

using namespace codegen::nvptx;
using emulation::emulate;
using emulation::Emulated;
using emulation::expect_close;
using emulation::random_vec;

// ------------------------------------------------------------------------------------------------
// attention against the CPU kernel

/// A captured tensor of a mod (spec.tensors[k]): its extents and its bytes as the kernels read
/// them (f32, bool as one byte, i32).
struct ModData {
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;
};

struct AttnCase {
  std::string label;
  AttentionKernel kernel;
  std::int64_t batch, len_q, len_k;
  /// The data of spec.tensors (captured), made from (B, L, S) and a generator.
  std::function<std::vector<ModData>(std::int64_t, std::int64_t, std::int64_t, std::mt19937&)> tensors;
  bool batch1_masked = false;  // the mod masks out every key of batch 1
};

template <class T>
ModData mod_data(std::vector<std::int64_t> shape, const std::vector<T>& values) {
  ModData d;
  d.shape = std::move(shape);
  d.bytes.resize(values.size() * sizeof(T));
  std::memcpy(d.bytes.data(), values.data(), d.bytes.size());
  return d;
}

std::ostream& operator<<(std::ostream& os, const AttnCase& c) { return os << c.label; }

std::vector<AttnCase> attention_cases() {
  std::vector<AttnCase> cases;
  auto base = [](std::int64_t dk, std::int64_t dv, std::int64_t hq, std::int64_t hkv) {
    AttentionKernel a;
    a.spec.dk = dk;
    a.spec.dv = dv;
    a.spec.hq = hq;
    a.spec.hkv = hkv;
    return a;
  };
  cases.push_back({"d64_gqa", base(64, 64, 4, 2), 2, 70, 90, {}});
  {
    auto a = base(64, 32, 2, 1);
    a.spec.causal = true;
    cases.push_back({"causal_top_left", a, 1, 70, 90, {}});
    a.spec.align = CausalAlign::bottom_right;
    a.spec.key_padding = true;
    a.spec.write_lse = true;  // batch 1 has every key padded: −inf rows
    cases.push_back({"causal_bottom_right_padding_L_gt_S_lse", a, 2, 90, 70, {}});
  }
  {
    auto a = base(33, 17, 2, 2);  // scalar shared-memory path, partial value chunks
    a.spec.bias = true;
    a.spec.dropout_p = 0.3;
    a.spec.write_weights = true;
    a.block_q = 32;
    a.block_k = 16;
    a.threads = 64;
    a.spec.write_lse = true;  // from the statistics sweep; row 3 sees no key
    cases.push_back({"scalar_bias_dropout_weights_lse", a, 1, 45, 40, {}});
  }
  {
    auto a = base(80, 80, 4, 1);
    a.spec.causal = true;
    a.spec.align = CausalAlign::bottom_right;
    a.spec.write_weights = true;
    a.spec.key_padding = true;
    a.spec.dropout_p = 0.2;
    a.spec.scale = 0.2;
    cases.push_back({"d80_mqa_everything", a, 2, 40, 75, {}});
  }
  {
    // GQA with a mod: a sliding window over bottom-right positions (|i + S − L − j| <= 20), an
    // ALiBi-style score term −e^(slope[h])·|i + S − L − j| plus a per-key bias [B, S], and a
    // captured [B, S] keep-mask (batch 1: every key masked out). Tiles outside the window are
    // skipped; the keep-mask's tiles are bounded by scanning it.
    auto a = base(64, 64, 4, 2);
    ModBuilder x;
    const int score = x.score();
    const int q = x.leaf(ModOp::position, "q"), k = x.leaf(ModOp::index, "k");
    const int dist = x.op(ModOp::abs, x.op(ModOp::sub, q, k));
    const int slope = x.op(ModOp::exp, x.load(0, {x.leaf(ModOp::index, "h")}));
    const int key_bias = x.load(1, {x.leaf(ModOp::index, "b"), x.leaf(ModOp::index, "k")});
    x.replace_score(x.op(ModOp::add, score, x.op(ModOp::sub, key_bias, x.op(ModOp::mul, slope, dist))));
    const int window = x.op(ModOp::le, dist, x.constant(20.0));
    const int keep =
        x.op(ModOp::ne, x.load(2, {x.leaf(ModOp::index, "b"), x.leaf(ModOp::index, "k")}), x.constant(0.0));
    x.keep_also(x.op(ModOp::logical_and, window, keep));
    x.expr().query = "q";
    x.expr().key = "k";
    x.expr().align = CausalAlign::bottom_right;
    a.spec.mod = x.finish();
    a.spec.tensors = {{codegen::cpu::ModTensor::Source::captured, DType::f32, 1},
                      {codegen::cpu::ModTensor::Source::captured, DType::f32, 2},
                      {codegen::cpu::ModTensor::Source::captured, DType::boolean, 2}};
    a.block_k = 16;  // many tiles: most outside the window
    auto tensors = [](std::int64_t B, std::int64_t, std::int64_t S, std::mt19937& gen) {
      std::uniform_real_distribution<float> u(-2.0f, 0.0f), w(-1.0f, 1.0f);
      std::bernoulli_distribution drop(0.2);
      std::vector<float> slopes(4), biases(static_cast<std::size_t>(B * S));
      std::vector<std::uint8_t> kept(static_cast<std::size_t>(B * S));
      for (auto& v : slopes) v = u(gen);
      for (auto& v : biases) v = w(gen);
      for (std::size_t i = 0; i < kept.size(); ++i) kept[i] = static_cast<std::int64_t>(i) >= S || drop(gen) ? 0 : 1;
      return std::vector<ModData>{mod_data({4}, slopes), mod_data({B, S}, biases), mod_data({B, S}, kept)};
    };
    cases.push_back({"mod_window_alibi_keep_gqa", a, 2, 70, 150, tensors, true});
    a.spec.write_weights = true;
    a.spec.dropout_p = 0.25;
    cases.push_back({"mod_window_alibi_keep_gqa_weights_dropout", a, 2, 70, 150, tensors, true});
  }
  {
    // Document masking with a causal flag: keep iff doc[i] == doc[j] (an i32 document id per
    // position, sorted: tiles inside one document are full, between two are skipped); the score
    // soft-capped 30·tanh(s / 30) (from the log2-unit score) plus log w[j] (converted: nats, lg2).
    auto a = base(33, 17, 2, 2);
    a.spec.causal = true;
    a.spec.write_weights = true;
    a.block_q = 32;
    a.block_k = 16;
    a.threads = 64;
    ModBuilder x;
    const int score = x.score();
    const int cap = x.constant(30.0);
    const int soft = x.op(ModOp::mul, cap, x.op(ModOp::tanh, x.op(ModOp::div, score, cap)));
    x.replace_score(x.op(ModOp::add, soft, x.op(ModOp::log, x.load(1, {x.leaf(ModOp::index, "k")}))));
    x.keep_also(x.op(ModOp::eq, x.load(0, {x.leaf(ModOp::index, "q")}), x.load(0, {x.leaf(ModOp::index, "k")})));
    a.spec.mod = x.finish();
    a.spec.tensors = {{codegen::cpu::ModTensor::Source::captured, DType::i32, 1},
                      {codegen::cpu::ModTensor::Source::captured, DType::f32, 1}};
    auto tensors = [](std::int64_t, std::int64_t, std::int64_t S, std::mt19937& gen) {
      std::vector<std::int32_t> doc(static_cast<std::size_t>(S));
      for (std::int64_t j = 0; j < S; ++j) doc[static_cast<std::size_t>(j)] = j < 20 ? 0 : j < 53 ? 1 : j < 60 ? 2 : 3;
      std::uniform_real_distribution<float> u(0.5f, 2.0f);
      std::vector<float> w(static_cast<std::size_t>(S));
      for (auto& v : w) v = u(gen);
      return std::vector<ModData>{mod_data({S}, doc), mod_data({S}, w)};
    };
    cases.push_back({"mod_documents_softcap_log_causal_weights", a, 1, 80, 80, tensors});
  }
  {
    // A strong score modification (the backward's f' far from 1): scores of scale 2 soft-capped
    // at 2·tanh(s / 2), times a per-key weight, under a causal mask and GQA.
    auto a = base(32, 48, 4, 2);
    a.spec.scale = 2.0;
    a.spec.causal = true;
    ModBuilder x;
    const int cap = x.constant(2.0);
    const int soft = x.op(ModOp::mul, cap, x.op(ModOp::tanh, x.op(ModOp::div, x.score(), cap)));
    x.replace_score(x.op(ModOp::mul, soft, x.load(0, {x.leaf(ModOp::index, "k")})));
    a.spec.mod = x.finish();
    a.spec.tensors = {{codegen::cpu::ModTensor::Source::captured, DType::f32, 1}};
    auto tensors = [](std::int64_t, std::int64_t, std::int64_t S, std::mt19937& gen) {
      return std::vector<ModData>{mod_data({S}, random_vec(static_cast<std::size_t>(S), gen, 0.5f, 2.0f))};
    };
    cases.push_back({"mod_strong_softcap_times_key_weight_causal_gqa", a, 2, 50, 70, tensors});
  }
  {
    // Named head axes as describe_attention makes them for GQA (query head h = kvh·2 + g): a
    // per-(batch, kv head) keep-mask [B, kvh, L, S] (what a [batch, heads, L, S] mask fuses to)
    // and a per-group score offset [g]; the key padding and bias flags on top.
    auto a = base(32, 32, 4, 2);
    a.spec.key_padding = true;
    a.spec.bias = true;
    a.spec.axes.batch = "batch";
    a.spec.axes.query = "i";
    a.spec.axes.key = "j";
    a.spec.axes.heads = {{"kvh", 2, 2}, {"g", 1, 2}};
    ModBuilder x;
    x.add_to_score(x.load(1, {x.leaf(ModOp::index, "g")}));
    x.keep_also(x.op(ModOp::ne,
                     x.load(0, {x.leaf(ModOp::index, "batch"), x.leaf(ModOp::index, "kvh"), x.leaf(ModOp::index, "i"),
                                x.leaf(ModOp::index, "j")}),
                     x.constant(0.0)));
    a.spec.mod = x.finish();
    a.spec.tensors = {{codegen::cpu::ModTensor::Source::captured, DType::boolean, 4},
                      {codegen::cpu::ModTensor::Source::captured, DType::f32, 1}};
    a.block_k = 16;
    auto tensors = [](std::int64_t B, std::int64_t L, std::int64_t S, std::mt19937& gen) {
      std::bernoulli_distribution drop(0.3);
      std::vector<std::uint8_t> kept(static_cast<std::size_t>(B * 2 * L * S));
      for (auto& v : kept) v = drop(gen) ? 0 : 1;
      std::vector<float> offset{0.5f, -1.5f};
      return std::vector<ModData>{mod_data({B, 2, L, S}, kept), mod_data({2}, offset)};
    };
    a.spec.write_lse = true;
    cases.push_back({"mod_named_heads_4d_mask_with_flags_lse", a, 2, 37, 50, tensors, true});
  }
  return cases;
}

class EmulatedAttention : public ::testing::TestWithParam<AttnCase> {};

/// The inputs of an attention case for (B, L, S): q, k, v, the flags' masks (bias with a row
/// that sees no key, key padding with batch 1 fully padded) and the mod's captured tensors.
struct AttnInputs {
  std::vector<float> q, k, v, bias;
  std::vector<std::uint8_t> keep;
  std::vector<ModData> mods;
  std::vector<const void*> tensor_ptrs;
  std::vector<std::int64_t> extents;

  /// The CPU kernel's arguments over these inputs (seed 0x5eed), writing out (and lse if given).
  [[nodiscard]] codegen::cpu::AttentionArgs args(std::int64_t B, std::int64_t L, std::int64_t S, float* out,
                                                 float* lse) const {
    codegen::cpu::AttentionArgs a;
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.out = out;
    a.key_keep = keep.empty() ? nullptr : keep.data();
    a.bias = bias.empty() ? nullptr : bias.data();
    a.tensors = tensor_ptrs.empty() ? nullptr : tensor_ptrs.data();
    a.extents = extents.empty() ? nullptr : extents.data();
    a.batch = B;
    a.len_q = L;
    a.len_k = S;
    a.seed = 0x5eed;
    a.lse = lse;
    return a;
  }
};

AttnInputs attention_inputs(const AttnCase& c, std::int64_t B, std::int64_t L, std::int64_t S) {
  const auto& s = c.kernel.spec;
  std::mt19937 gen(1234);
  AttnInputs in;
  in.q = random_vec(static_cast<std::size_t>(B * s.hq * L * s.dk), gen);
  in.k = random_vec(static_cast<std::size_t>(B * s.hkv * S * s.dk), gen);
  in.v = random_vec(static_cast<std::size_t>(B * s.hkv * S * s.dv), gen);
  if (s.bias) {
    in.bias = random_vec(static_cast<std::size_t>(L * S), gen, -2.0f, 2.0f);
    const std::int64_t row = std::min<std::int64_t>(3, L - 1);
    for (std::int64_t j = 0; j < S; ++j) in.bias[static_cast<std::size_t>(row * S + j)] = -INFINITY;  // no key
    if (L > 5) in.bias[static_cast<std::size_t>(5 * S + 7)] = -INFINITY;
  }
  if (s.key_padding) in.keep = emulation::key_padding(B, S, gen);
  if (c.tensors) in.mods = c.tensors(B, L, S, gen);
  for (const auto& m : in.mods) {
    in.tensor_ptrs.push_back(m.bytes.data());
    in.extents.insert(in.extents.end(), m.shape.begin(), m.shape.end());
  }
  return in;
}

TEST_P(EmulatedAttention, MatchesCpuKernel) {
  const AttnCase& c = GetParam();
  const auto& s = c.kernel.spec;
  const std::int64_t B = c.batch, L = c.len_q, S = c.len_k;
  const AttnInputs in = attention_inputs(c, B, L, S);
  const auto &q = in.q, &k = in.k, &v = in.v;
  ASSERT_EQ(in.mods.size(), s.tensors.size());
  const std::size_t out_n = static_cast<std::size_t>(B * s.hq * L * s.dv);
  const std::size_t w_n = s.write_weights ? static_cast<std::size_t>(B * s.hq * L * S) : 0;
  std::vector<float> out_cpu(out_n), w_cpu(w_n);
  std::vector<float> out_gpu(out_n, NAN), w_gpu(w_n, NAN);
  const std::size_t lse_n = s.write_lse ? static_cast<std::size_t>(B * s.hq * L) : 0;
  std::vector<float> lse_cpu(lse_n), lse_gpu(lse_n, NAN);

  codegen::cpu::AttentionArgs args = in.args(B, L, S, out_cpu.data(), lse_n ? lse_cpu.data() : nullptr);
  args.weights = w_n ? w_cpu.data() : nullptr;
  codegen::cpu::run_attention(s, args, 1);

  Emulated e = emulate(c.kernel);
  using Fn =
      void(const float*, const float*, const float*, float*, float*, const std::uint8_t*, const float*,
           const void* const*, const std::int64_t*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float*);
  auto* fn = e.fn<Fn>();
  e.launch(attention_grid(c.kernel, B, L), [&] {
    fn(q.data(), k.data(), v.data(), out_gpu.data(), w_n ? w_gpu.data() : nullptr, args.key_keep, args.bias,
       args.tensors, args.extents, B, L, S, static_cast<std::int64_t>(args.seed), lse_n ? lse_gpu.data() : nullptr);
  });
  expect_close(out_gpu, out_cpu, 2e-5, "out");
  if (w_n) expect_close(w_gpu, w_cpu, 2e-5, "weights");
  if (lse_n) expect_close(lse_gpu, lse_cpu, 2e-5, "lse");
  if ((s.key_padding || c.batch1_masked) && B > 1) {  // a batch with every key padded: zeros, not NaN
    for (std::size_t i = out_n / static_cast<std::size_t>(B); i < 2 * out_n / static_cast<std::size_t>(B); ++i)
      ASSERT_EQ(out_gpu[i], 0.0f);
  }
}

/// The backward kernels (dq, then dkdv) of a case's forward against the CPU backward
/// (run_attention_backward): the same recomputed probabilities, mods and their f', dropout
/// counters, GQA sums and tile skipping. The forward (CPU) gives out and lse; dO is random.
TEST_P(EmulatedAttention, BackwardMatchesCpuKernel) {
  const AttnCase& c = GetParam();
  codegen::cpu::AttentionSpec s = c.kernel.spec;
  s.write_weights = false;
  s.write_lse = true;
  // The gradients of the mod's f32 tensors too: the dkdv kernel's slots, then the dtensor kernel.
  for (std::size_t t = 0; t < s.tensors.size(); ++t)
    if (s.tensors[t].dtype == DType::f32) s.tensor_grads.push_back({static_cast<int>(t)});
  const std::int64_t B = c.batch, L = c.len_q, S = c.len_k;
  const AttnInputs in = attention_inputs(c, B, L, S);
  const auto q_n = static_cast<std::size_t>(B * s.hq * L * s.dk), k_n = static_cast<std::size_t>(B * s.hkv * S * s.dk),
             v_n = static_cast<std::size_t>(B * s.hkv * S * s.dv), o_n = static_cast<std::size_t>(B * s.hq * L * s.dv),
             rows = static_cast<std::size_t>(B * s.hq * L);
  std::vector<float> out(o_n), lse(rows);
  const codegen::cpu::AttentionArgs args = in.args(B, L, S, out.data(), lse.data());
  codegen::cpu::run_attention(s, args, 1);
  std::mt19937 gen(99);
  const std::vector<float> d_out = random_vec(o_n, gen);

  std::vector<float> dq_cpu(q_n), dk_cpu(k_n), dv_cpu(v_n);
  // Each differentiated tensor's element count (its extents follow the table's order and ranks).
  std::vector<std::size_t> numel(s.tensors.size(), 1);
  for (std::size_t t = 0, at = 0; t < s.tensors.size(); ++t)
    for (int r = 0; r < s.tensors[t].rank; ++r) numel[t] *= static_cast<std::size_t>(in.extents[at++]);
  std::vector<std::vector<float>> dtensor_cpu;
  std::vector<float*> dtensor_ptrs;
  for (const auto& t : s.tensor_grads) {
    dtensor_cpu.emplace_back(numel[static_cast<std::size_t>(t.tensor)], NAN);
    dtensor_ptrs.push_back(dtensor_cpu.back().data());
  }
  codegen::cpu::AttentionBackwardArgs a;
  a.forward = args;
  a.d_out = d_out.data();
  a.dq = dq_cpu.data();
  a.dk = dk_cpu.data();
  a.dv = dv_cpu.data();
  a.dtensors = dtensor_ptrs.data();
  codegen::cpu::run_attention_backward(s, a, 1);

  std::vector<float> dq(q_n, NAN), dk(k_n, NAN), dv(v_n, NAN), delta(rows, NAN);
  // The partial sums (a slot per dkdv block, NaN until the block zeroes it), their addresses after
  // the extents in the tensor table.
  AttentionBackwardKernel kernel;
  kernel.spec = s;
  kernel.part = AttentionBackwardKernel::Part::dkdv;
  kernel.threads = c.kernel.threads;
  const Dim3 dkdv_grid = attention_backward_grid(kernel, B, L, S);
  std::vector<std::vector<float>> partials;
  std::vector<std::int64_t> table = in.extents;
  for (const auto& t : s.tensor_grads) {
    partials.emplace_back(
        numel[static_cast<std::size_t>(t.tensor)] * static_cast<std::size_t>(dkdv_grid.x * dkdv_grid.y * dkdv_grid.z),
        NAN);
    table.push_back(static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(partials.back().data())));
  }
  using Fn = void(const float*, const float*, const float*, const float*, const float*, const float*, float*, float*,
                  float*, float*, const std::uint8_t*, const float*, const void* const*, const std::int64_t*,
                  std::int64_t, std::int64_t, std::int64_t, std::int64_t);
  std::vector<AttentionBackwardKernel::Part> parts{AttentionBackwardKernel::Part::dq,
                                                   AttentionBackwardKernel::Part::dkdv};
  if (!s.tensor_grads.empty()) parts.push_back(AttentionBackwardKernel::Part::dtensor);
  for (auto part : parts) {
    kernel.part = part;
    Emulated e = emulate(kernel);
    auto* fn = e.fn<Fn>();
    e.launch(attention_backward_grid(kernel, B, L, S), [&] {
      fn(in.q.data(), in.k.data(), in.v.data(), out.data(), d_out.data(), lse.data(), delta.data(), dq.data(),
         dk.data(), dv.data(), args.key_keep, args.bias, args.tensors, table.empty() ? nullptr : table.data(), B, L, S,
         static_cast<std::int64_t>(args.seed));
    });
  }
  expect_close(dq, dq_cpu, 1e-4, "dq");
  expect_close(dk, dk_cpu, 1e-4, "dk");
  expect_close(dv, dv_cpu, 1e-4, "dv");
  for (std::size_t t = 0; t < partials.size(); ++t) {  // slot 0 holds the sum
    const std::vector<float> got(partials[t].begin(),
                                 partials[t].begin() + static_cast<std::ptrdiff_t>(dtensor_cpu[t].size()));
    expect_close(got, dtensor_cpu[t], 1e-4, "a mod tensor's gradient");
  }
  for (std::size_t r = 0; r < rows; ++r) {  // D = rowsum(dO ∘ O)
    double d = 0;
    for (std::int64_t col = 0; col < s.dv; ++col)
      d += static_cast<double>(d_out[r * static_cast<std::size_t>(s.dv) + static_cast<std::size_t>(col)]) *
           out[r * static_cast<std::size_t>(s.dv) + static_cast<std::size_t>(col)];
    ASSERT_NEAR(delta[r], d, 1e-5 * (1 + std::abs(d))) << "row " << r;
  }
}

std::string attn_case_name(const ::testing::TestParamInfo<AttnCase>& param) { return param.param.label; }

INSTANTIATE_TEST_SUITE_P(Emulation, EmulatedAttention, ::testing::ValuesIn(attention_cases()), attn_case_name);

// ------------------------------------------------------------------------------------------------
// attention as the fuse pass makes it: the DSL's built-in mods through the whole pipeline

/// The fused node of `g` after lowering, its inputs computed by the interpreter (as the GPU
/// executor's host steps would) and stored as the GPU stores them (storage.hpp), then the
/// emulated PTX kernel against the CPU kernel on the very spec the GPU plan would launch.
void expect_fused_mods_agree(const Graph& g, const Feeds& feeds) {
  const Graph lowered = codegen::lower(g);
  const Bindings sizes = bind_extents(lowered, feeds);
  int fused = -1;
  for (int id = 0; id < static_cast<int>(lowered.size()); ++id)
    if (lowered.node(id).op == Op::fused_attention) fused = id;
  ASSERT_GE(fused, 0) << lowered.table();
  std::vector<NdArray> values(lowered.size());
  for (int id = 0; id < fused; ++id) {
    const Node& n = lowered.node(id);
    if (codegen::select_kernel(lowered, id) == codegen::KernelKind::leaf) {
      values[static_cast<std::size_t>(id)] = feeds.at(n.name);
      continue;
    }
    std::vector<const NdArray*> in;
    for (int x : n.inputs) in.push_back(&values[static_cast<std::size_t>(x)]);
    values[static_cast<std::size_t>(id)] = evaluate_node(lowered, id, in, sizes);
  }
  const codegen::FusedAttentionCall call = codegen::describe_fused_attention(lowered, fused, sizes);
  const Node& n = lowered.node(fused);
  auto f32 = [&](int input) {
    return values[static_cast<std::size_t>(n.inputs[static_cast<std::size_t>(input)])].to_f32();
  };
  const std::vector<float> q = f32(0), k = f32(1), v = f32(2);
  std::vector<std::vector<std::byte>> stored;
  std::vector<const void*> tensors;
  for (int m : call.tensor_inputs) {
    const NdArray& a = values[static_cast<std::size_t>(n.inputs[static_cast<std::size_t>(m)])];
    if (a.dtype == DType::boolean) {
      stored.emplace_back(a.bytes.begin(), a.bytes.end());
    } else {
      const std::vector<float> x = a.to_f32();
      stored.emplace_back(x.size() * sizeof(float));
      std::memcpy(stored.back().data(), x.data(), stored.back().size());
    }
  }
  for (const auto& b : stored) tensors.push_back(b.data());
  AttentionKernel kernel;
  kernel.spec = call.spec;
  ASSERT_FALSE(kernel.spec.mod.empty());
  ASSERT_TRUE(kernel.spec.write_lse);  // the graphs here all ask for the log-sum-exp
  const auto& s = kernel.spec;
  const std::int64_t B = call.batch, L = call.len_q, S = call.len_k;
  const std::size_t out_n = static_cast<std::size_t>(B * s.hq * L * s.dv);
  std::vector<float> out_cpu(out_n), out_gpu(out_n, NAN);
  codegen::cpu::AttentionArgs args;
  args.q = q.data();
  args.k = k.data();
  args.v = v.data();
  args.out = out_cpu.data();
  args.tensors = tensors.data();
  args.extents = call.tensor_extents.data();
  args.batch = B;
  args.len_q = L;
  args.len_k = S;
  const std::size_t lse_n = s.write_lse ? static_cast<std::size_t>(B * s.hq * L) : 0;
  std::vector<float> lse_cpu(lse_n), lse_gpu(lse_n, NAN);
  args.lse = lse_n ? lse_cpu.data() : nullptr;
  codegen::cpu::run_attention(s, args, 1);
  Emulated e = emulate(kernel);
  using Fn =
      void(const float*, const float*, const float*, float*, float*, const std::uint8_t*, const float*,
           const void* const*, const std::int64_t*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float*);
  auto* fn = e.fn<Fn>();
  e.launch(attention_grid(kernel, B, L), [&] {
    fn(q.data(), k.data(), v.data(), out_gpu.data(), nullptr, nullptr, nullptr, args.tensors, args.extents, B, L, S, 0,
       lse_n ? lse_gpu.data() : nullptr);
  });
  expect_close(out_gpu, out_cpu, 2e-5, "out");
  if (lse_n) expect_close(lse_gpu, lse_cpu, 2e-5, "lse");
}

template <std::int64_t H, std::int64_t Hkv, std::int64_t D>
void built_in_mods(std::int64_t batch, std::int64_t l, std::int64_t s, bool br) {
  using namespace nn;
  constexpr std::int64_t G = H / Hkv;
  Graph g;
  auto q = input<Tensor<f32, Batch<dyn>, KvHeads<Hkv>, Group<G>, Seq<dyn>, HeadDim<D>>>(g, "q");
  auto k = input<Tensor<f32, Batch<dyn>, KvHeads<Hkv>, Key<dyn>, HeadDim<D>>>(g, "k");
  auto v = input<Tensor<f32, Batch<dyn>, KvHeads<Hkv>, Key<dyn>, HeadDim<D>>>(g, "v");
  auto slopes = input<Tensor<f32, KvHeads<Hkv>, Group<G>>>(g, "slopes");
  auto q_doc = input<Tensor<i32, Batch<dyn>, Seq<dyn>>>(g, "q_doc");
  auto kv_doc = input<Tensor<i32, Batch<dyn>, Key<dyn>>>(g, "kv_doc");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  auto sc = scaled(contract<HeadDim>(q, k));
  auto run = [&](auto align) {
    auto hand = score_mod([](auto x, auto, auto, auto qi, auto ki) { return x + 0.01 * min(qi, ki); }, align);
    auto m = modded(sc, mods::softcap(2.0), mods::alibi(slopes, align), hand,
                    mods::sliding_window(9, 3, align) && mods::document_mask(q_doc, kv_doc));
    auto visible = masked(m, keep);
    output(contract<Key>(softmax<Key>(visible), v), "out");
    output(logsumexp<Key>(visible), "lse");
  };
  if (br)
    run(bottom_right);
  else
    run(top_left);
  Feeds feeds = random_feeds(g, {{"Batch", batch}, {"Seq", l}, {"Key", s}}, 21, 0.5f);
  // Documents of 13 queries / 11 keys (ids increase along the sequence).
  std::vector<std::int32_t> qd, kd;
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < l; ++i) qd.push_back(static_cast<std::int32_t>(i / 13));
    for (std::int64_t j = 0; j < s; ++j) kd.push_back(static_cast<std::int32_t>(j / 11));
  }
  auto ids = [](const std::vector<std::int32_t>& x, std::vector<std::int64_t> shape) {
    NdArray a;
    a.dtype = DType::i32;
    a.shape = std::move(shape);
    a.bytes.resize(x.size() * sizeof(std::int32_t));
    std::memcpy(a.bytes.data(), x.data(), a.bytes.size());
    return a;
  };
  feeds["q_doc"] = ids(qd, {batch, l});
  feeds["kv_doc"] = ids(kd, {batch, s});
  expect_fused_mods_agree(g, feeds);
}

/// The split-KV decode kernel and its merge (DecodeAttentionKernel, DecodeMergeKernel) on `c`'s
/// spec for L query rows, against the CPU's fused kernel.
void expect_decode_matches(const AttnCase& c, std::int64_t L, std::int64_t S, int threads) {
  SCOPED_TRACE(c.label + ", L = " + std::to_string(L) + ", S = " + std::to_string(S));
  codegen::cpu::AttentionSpec s = c.kernel.spec;
  const std::int64_t B = c.batch;
  const AttnInputs in = attention_inputs(c, B, L, S);
  const std::size_t out_n = static_cast<std::size_t>(B * s.hq * L * s.dv);
  const std::size_t lse_n = s.write_lse ? static_cast<std::size_t>(B * s.hq * L) : 0;
  std::vector<float> out_cpu(out_n), out_gpu(out_n, NAN), lse_cpu(lse_n), lse_gpu(lse_n, NAN);
  const codegen::cpu::AttentionArgs args = in.args(B, L, S, out_cpu.data(), lse_n ? lse_cpu.data() : nullptr);
  codegen::cpu::AttentionSpec fused = s;
  fused.decode_queries = -1;  // the reference: the fused kernel, not the CPU's own decode kernel
  codegen::cpu::run_attention(fused, args, 1);

  const DecodeAttentionKernel dk{s, threads};
  const DecodeMergeKernel mk{s, threads};
  const DecodeSplit split = decode_split(dk, B, L, S);
  std::vector<float> partials;
  if (split.chunks > 1)
    partials.assign(static_cast<std::size_t>(B * s.hq * L * split.chunks * codegen::cpu::decode_record_floats(s)), NAN);
  Emulated e = emulate(dk);
  using Fn =
      void(const float*, const float*, const float*, float*, const std::uint8_t*, const float*, const void* const*,
           const std::int64_t*, std::int64_t, std::int64_t, std::int64_t, float*, std::int64_t, float*);
  auto* fn = e.fn<Fn>();
  float* work = partials.empty() ? nullptr : partials.data();
  e.launch(decode_grid(dk, B, L, S), [&] {
    fn(in.q.data(), in.k.data(), in.v.data(), out_gpu.data(), args.key_keep, args.bias, args.tensors, args.extents, B,
       L, S, lse_n ? lse_gpu.data() : nullptr, split.chunk_len, work);
  });
  if (work) {
    Emulated m = emulate(mk);
    using Merge = void(float*, float*, const float*, std::int64_t, std::int64_t, std::int64_t);
    auto* merge = m.fn<Merge>();
    m.launch(decode_merge_grid(mk, B, L),
             [&] { merge(out_gpu.data(), lse_n ? lse_gpu.data() : nullptr, work, B, L, split.chunks); });
  }
  expect_close(out_gpu, out_cpu, 2e-5, "out");
  if (lse_n) expect_close(lse_gpu, lse_cpu, 2e-5, "lse");
}

TEST_P(EmulatedAttention, DecodeKernelMatchesCpuKernelForFewQueryRows) {
  AttnCase c = GetParam();  // without the weights and dropout, which only the fused kernel does
  c.kernel.spec.write_weights = false;
  c.kernel.spec.dropout_p = 0.0;
  std::string why;
  if (!decode_attention_supported(c.kernel.spec, &why)) GTEST_SKIP() << "not a decode spec: " << why;
  for (std::int64_t L : {1, 3}) expect_decode_matches(c, L, c.len_k, 128);
}

TEST(EmulatedDecode, LongCacheGqaSplitsIntoChunks) {
  AttnCase c;
  c.label = "gqa_8_2_d128_causal_bottom_right";
  c.kernel.spec.dk = c.kernel.spec.dv = 128;
  c.kernel.spec.hq = 8;
  c.kernel.spec.hkv = 2;
  c.kernel.spec.causal = true;
  c.kernel.spec.align = CausalAlign::bottom_right;
  c.kernel.spec.write_lse = true;
  c.batch = 1;
  EXPECT_GT(decode_split(DecodeAttentionKernel{c.kernel.spec}, 1, 1, 1000).chunks, 4);
  expect_decode_matches(c, 1, 1000, 128);
  c.kernel.spec.dk = 40;  // lanes past dk and dv idle; odd widths; 2 warps
  c.kernel.spec.dv = 24;
  c.kernel.spec.hq = 6;
  c.kernel.spec.hkv = 1;
  expect_decode_matches(c, 2, 333, 64);
  expect_decode_matches(c, 1, 0, 64);  // no keys: zero rows, −inf log-sum-exp
}

TEST(EmulatedDecode, UnsupportedSpecsSayWhy) {
  codegen::cpu::AttentionSpec s;
  s.write_weights = true;
  std::string why;
  EXPECT_FALSE(decode_attention_supported(s, &why));
  EXPECT_NE(why.find("weights"), std::string::npos) << why;
  s.write_weights = false;
  s.hq = 64;
  EXPECT_FALSE(decode_attention_supported(s, &why));
  EXPECT_NE(why.find("32 query heads"), std::string::npos) << why;
}

TEST(EmulatedAttentionFromTheDsl, BuiltInModsMatchTheCpuKernel) {
  // softcap, ALiBi over named head axes (GQA), a hand-written score mod, a sliding window and
  // document masks, key padding, the rows' log-sum-exp: the spec the fuse pass makes and the GPU
  // plan launches.
  built_in_mods<4, 2, 32>(2, 37, 37, false);
  built_in_mods<2, 1, 32>(1, 29, 71, true);
}

}  // namespace
}  // namespace qkv
