// The NVPTX backend without a GPU: every kernel kind over a sweep of specs is generated, optimised
// and emitted as PTX for sm_80 and sm_90, then checked for (1) its .entry and .target, (2) no
// unresolved calls (no .extern .func, every call's callee defined in the module), (3) acceptance
// by ptxas -arch=sm_80 / sm_90 with registers > 0, the expected shared memory, and no spills
// (the bound that holds for every kernel here: 0 bytes). ptxas' figures are printed per kernel.
// Without ptxas the assembling tests are skipped with the reason. Also: launch geometry, names,
// IR inspection and the errors every bad request must raise as std::runtime_error.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <qkv/codegen/nvptx.hpp>

namespace qkv {
namespace {

using namespace codegen::nvptx;

struct Case {
  std::string label;
  KernelRequest request;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.label; }

AttentionKernel attention(std::int64_t dk, std::int64_t dv) {
  AttentionKernel a;
  a.spec.dk = dk;
  a.spec.dv = dv;
  a.spec.hq = 4;
  a.spec.hkv = 4;
  return a;
}

/// A mod node by node (ModExpr::add).
int node(ModExpr& e, ModOp op, int a = -1, int b = -1, std::string axis = {}, double value = 0.0) {
  ModNode n;
  n.op = op;
  n.a = a;
  n.b = b;
  n.axis = std::move(axis);
  n.value = value;
  return e.add(std::move(n));
}
int load(ModExpr& e, int input, std::vector<int> at) {
  ModNode n;
  n.op = ModOp::load;
  n.input = input;
  n.at = std::move(at);
  return e.add(std::move(n));
}

/// A sliding window over bottom-right positions, an ALiBi-style score term −e^(slope[h])·|i − j|
/// plus a [B, S] key bias (the score + X path), and a captured [B, S] keep-mask.
void window_alibi_mod(AttentionKernel& a) {
  ModExpr e;
  const int score = node(e, ModOp::score);
  const int dist = node(e, ModOp::abs,
                        node(e, ModOp::sub, node(e, ModOp::position, -1, -1, "q"), node(e, ModOp::index, -1, -1, "k")));
  const int slope = node(e, ModOp::exp, load(e, 0, {node(e, ModOp::index, -1, -1, "h")}));
  const int bias = load(e, 1, {node(e, ModOp::index, -1, -1, "b"), node(e, ModOp::index, -1, -1, "k")});
  e.score = node(e, ModOp::add, score, node(e, ModOp::sub, bias, node(e, ModOp::mul, slope, dist)));
  const int window = node(e, ModOp::le, dist, node(e, ModOp::constant, -1, -1, {}, 128.0));
  const int keep =
      node(e, ModOp::ne, load(e, 2, {node(e, ModOp::index, -1, -1, "b"), node(e, ModOp::index, -1, -1, "k")}),
           node(e, ModOp::constant));
  e.keep = node(e, ModOp::logical_and, window, keep);
  e.query = "q";
  e.key = "k";
  e.align = CausalAlign::bottom_right;
  a.spec.mod = e;
  using codegen::cpu::ModTensor;
  a.spec.tensors = {{ModTensor::Source::captured, DType::f32, 1},
                    {ModTensor::Source::captured, DType::f32, 2},
                    {ModTensor::Source::captured, DType::boolean, 2}};
}

/// Document masking (keep iff doc[i] == doc[j], i32 ids) and a soft-capped score plus log w[j]
/// (the converted path: ×ln 2 → mod → ×log2 e, with tanh and lg2).
void documents_softcap_mod(AttentionKernel& a) {
  ModExpr e;
  const int score = node(e, ModOp::score);
  const int cap = node(e, ModOp::constant, -1, -1, {}, 30.0);
  const int soft = node(e, ModOp::mul, cap, node(e, ModOp::tanh, node(e, ModOp::div, score, cap)));
  e.score = node(e, ModOp::add, soft, node(e, ModOp::log, load(e, 1, {node(e, ModOp::index, -1, -1, "k")})));
  e.keep = node(e, ModOp::eq, load(e, 0, {node(e, ModOp::index, -1, -1, "q")}),
                load(e, 0, {node(e, ModOp::index, -1, -1, "k")}));
  a.spec.mod = e;
  using codegen::cpu::ModTensor;
  a.spec.tensors = {{ModTensor::Source::captured, DType::i32, 1}, {ModTensor::Source::captured, DType::f32, 1}};
}

std::vector<Case> attention_cases() {
  std::vector<Case> cases;
  auto add = [&](std::string label, AttentionKernel a) { cases.push_back({std::move(label), a}); };
  add("d64", attention(64, 64));
  add("d80", attention(80, 80));
  add("d128", attention(128, 128));
  add("d256", attention(256, 256));
  add("dk64_dv32", attention(64, 32));
  add("dk33_dv17_scalar", attention(33, 17));
  {
    auto a = attention(64, 64);
    a.spec.causal = true;
    add("d64_causal_top_left", a);
    a.spec.align = CausalAlign::bottom_right;
    add("d64_causal_bottom_right", a);
  }
  {
    auto a = attention(64, 64);
    a.spec.key_padding = true;
    add("d64_key_padding", a);
  }
  {
    auto a = attention(64, 64);
    a.spec.bias = true;
    add("d64_bias", a);
  }
  {
    auto a = attention(64, 64);
    a.spec.dropout_p = 0.1;
    add("d64_dropout", a);
  }
  {
    auto a = attention(64, 64);
    a.spec.write_weights = true;
    add("d64_weights", a);
  }
  {
    auto a = attention(64, 64);
    a.spec.hq = 8;
    a.spec.hkv = 2;
    add("d64_gqa_8_2", a);
  }
  {
    auto a = attention(128, 128);
    a.spec.hq = 8;
    a.spec.hkv = 2;
    a.spec.causal = true;
    a.spec.align = CausalAlign::bottom_right;
    a.spec.key_padding = true;
    a.spec.bias = true;
    a.spec.dropout_p = 0.25;
    a.spec.write_weights = true;
    a.spec.scale = 0.1;
    add("d128_everything", a);
  }
  {
    auto a = attention(64, 64);
    a.spec.causal = true;
    a.spec.dropout_p = 0.5;
    a.spec.write_weights = true;
    a.block_q = 32;
    a.block_k = 16;
    a.threads = 64;
    add("d64_small_tiles", a);
  }
  {
    auto a = attention(64, 64);
    a.spec.hq = 8;
    a.spec.hkv = 2;
    window_alibi_mod(a);
    add("d64_gqa_mod_window_alibi", a);
    a.spec.write_weights = true;
    a.spec.dropout_p = 0.1;
    add("d64_gqa_mod_window_alibi_weights", a);
  }
  {
    auto a = attention(128, 128);
    a.spec.causal = true;
    documents_softcap_mod(a);
    add("d128_mod_documents_softcap_causal", a);
  }
  // bf16 storage: the tensor-core kernel (attention_mma_ptx.cpp).
  for (std::int64_t d : {64, 128}) {
    auto a = attention(d, d);
    a.spec.storage = DType::bf16;
    a.spec.hq = 8;
    a.spec.hkv = 2;
    add("bf16_mma_d" + std::to_string(d), a);
    a.spec.causal = true;
    a.spec.write_lse = true;
    add("bf16_mma_d" + std::to_string(d) + "_causal_lse", a);
    a.spec.causal = false;
    a.spec.write_lse = false;
    window_alibi_mod(a);
    add("bf16_mma_d" + std::to_string(d) + "_mod_window_alibi", a);
  }
  return cases;
}

/// The split-KV decode kernel and its merge: Llama-3-8B's 32/8 heads at D = 128, a mod with
/// loads at D = 64 (GQA 8/2), MQA 6/1 at D = 80 with the log-sum-exp.
std::vector<Case> decode_cases() {
  std::vector<Case> v;
  auto spec = [](std::int64_t d, std::int64_t hq, std::int64_t hkv) {
    codegen::cpu::AttentionSpec s;
    s.dk = s.dv = d;
    s.hq = hq;
    s.hkv = hkv;
    s.causal = true;
    s.align = CausalAlign::bottom_right;
    return s;
  };
  v.push_back({"decode_d128_gqa_32_8", DecodeAttentionKernel{spec(128, 32, 8)}});
  v.push_back({"decode_merge_d128_gqa_32_8", DecodeMergeKernel{spec(128, 32, 8)}});
  AttentionKernel with_mod;
  with_mod.spec = spec(64, 8, 2);
  window_alibi_mod(with_mod);
  v.push_back({"decode_d64_gqa_8_2_mod", DecodeAttentionKernel{with_mod.spec}});
  codegen::cpu::AttentionSpec mqa = spec(80, 6, 1);
  mqa.write_lse = true;
  v.push_back({"decode_d80_mqa_6_lse", DecodeAttentionKernel{mqa, 64}});
  v.push_back({"decode_merge_d80_mqa_6_lse", DecodeMergeKernel{mqa, 64}});
  return v;
}

/// The backward's two kernels (dq, dkdv) over head widths, masks, dropout, GQA and mods.
std::vector<Case> backward_cases() {
  std::vector<Case> v;
  auto add = [&](const std::string& label, const AttentionKernel& a) {
    for (auto part : {AttentionBackwardKernel::Part::dq, AttentionBackwardKernel::Part::dkdv,
                      AttentionBackwardKernel::Part::dtensor}) {
      if (part == AttentionBackwardKernel::Part::dtensor && a.spec.tensor_grads.empty()) continue;
      AttentionBackwardKernel k;
      k.spec = a.spec;
      k.part = part;
      v.push_back({std::string(part == AttentionBackwardKernel::Part::dq     ? "bwd_dq_"
                               : part == AttentionBackwardKernel::Part::dkdv ? "bwd_dkdv_"
                                                                             : "bwd_dtensor_") +
                       label,
                   k});
    }
  };
  add("d64", attention(64, 64));
  add("d128", attention(128, 128));
  add("d256", attention(256, 256));
  add("dk33_dv17_scalar", attention(33, 17));
  {
    auto a = attention(64, 64);
    a.spec.hq = 8;
    a.spec.hkv = 2;
    a.spec.causal = true;
    a.spec.key_padding = true;
    a.spec.bias = true;
    a.spec.dropout_p = 0.1;
    add("d64_gqa_causal_padding_bias_dropout", a);
    window_alibi_mod(a);
    add("d64_gqa_mod_window_alibi_dropout", a);
    a.spec.tensor_grads = {{0}, {1}};  // the slopes' (a tile-wide sum) and the key bias's (entry by entry)
    add("d64_gqa_mod_window_alibi_dropout_dtensors", a);
  }
  {
    auto a = attention(128, 128);
    a.spec.causal = true;
    documents_softcap_mod(a);
    add("d128_mod_documents_softcap_causal", a);
  }
  // bf16 storage: the tensor-core kernels (attention_backward_mma_ptx.cpp)
  auto bf16 = [](AttentionKernel a) {
    a.spec.storage = DType::bf16;
    return a;
  };
  add("bf16_d64", bf16(attention(64, 64)));
  add("bf16_d128", bf16(attention(128, 128)));
  {
    auto a = bf16(attention(64, 64));
    a.spec.hq = 8;
    a.spec.hkv = 2;
    a.spec.causal = true;
    a.spec.dropout_p = 0.1;
    window_alibi_mod(a);
    add("bf16_d64_gqa_mod_window_alibi_dropout", a);
    a.spec.tensor_grads = {{0}, {1}};
    add("bf16_d64_gqa_mod_window_alibi_dropout_dtensors", a);
  }
  return v;
}

std::vector<Case> other_cases() {
  std::vector<Case> cases;
  cases.push_back({"linear_64x64x16", LinearKernel{}});
  cases.push_back({"linear_32x128x8", LinearKernel{32, 128, 8}});
  cases.push_back({"linear_bf16_mma_64x64x32", LinearKernel{64, 64, 32, DType::bf16}});
  cases.push_back({"linear_bf16_mma_128x128x32", LinearKernel{128, 128, 32, DType::bf16}});
  cases.push_back({"layer_norm_128", LayerNormKernel{}});
  cases.push_back({"layer_norm_256", LayerNormKernel{256}});
  cases.push_back({"relu", ElementwiseKernel{ElementwiseOp::relu, 1.0f, 256}});
  cases.push_back({"gelu", ElementwiseKernel{ElementwiseOp::gelu, 1.0f, 256}});
  cases.push_back({"add", ElementwiseKernel{ElementwiseOp::add, 1.0f, 256}});
  cases.push_back({"scale", ElementwiseKernel{ElementwiseOp::scale, 0.125f, 128}});
  for (int rank : {1, 2, 4, 6}) cases.push_back({"copy_rank" + std::to_string(rank), StridedCopyKernel{rank, 256}});
  return cases;
}

/// Callees of `call` instructions that the module does not define, and whether it declares any
/// external function.
std::set<std::string> unresolved_calls(const std::string& ptx) {
  static const std::regex def(R"(\.func\s+(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*))");
  static const std::regex call(R"(\bcall(?:\.uni)?\s+(?:\([^)]*\)\s*,\s*)?([A-Za-z_$][\w$]*))");
  std::set<std::string> defined, missing;
  for (std::sregex_iterator it(ptx.begin(), ptx.end(), def), end; it != end; ++it) defined.insert((*it)[1].str());
  for (std::sregex_iterator it(ptx.begin(), ptx.end(), call), end; it != end; ++it)
    if (!defined.count((*it)[1].str())) missing.insert((*it)[1].str());
  return missing;
}

class Kernels : public ::testing::TestWithParam<std::tuple<Case, int>> {};

TEST_P(Kernels, EmitsAssemblablePtx) {
  const auto& [c, sm] = GetParam();
  const PtxKernel k = emit_ptx(c.request, sm);
  if (const char* dir = std::getenv("QKV_NVPTX_DUMP")) {  // for inspection: <dir>/<label>_sm<sm>.ptx
    if (FILE* f = std::fopen((std::string(dir) + "/" + c.label + "_sm" + std::to_string(sm) + ".ptx").c_str(), "w")) {
      std::fputs(k.ptx.c_str(), f);
      std::fclose(f);
    }
  }
  EXPECT_EQ(k.name, kernel_name(c.request));
  EXPECT_EQ(k.sm, sm);

  // (1) the entry and the target; the signature comment first.
  EXPECT_EQ(k.ptx.rfind("// qkv kernel: " + k.signature + "\n", 0), 0u) << k.ptx.substr(0, 300);
  EXPECT_NE(k.ptx.find("// launch: grid " + k.grid_rule), std::string::npos);
  EXPECT_NE(k.ptx.find(".entry " + k.name + "("), std::string::npos);
  EXPECT_NE(k.ptx.find(".target sm_" + std::to_string(sm)), std::string::npos);
  EXPECT_NE(k.ptx.find(".maxntid " + std::to_string(k.block_x) + ", 1, 1"), std::string::npos);
  // (2) nothing to resolve at load time.
  EXPECT_EQ(k.ptx.find(".extern .func"), std::string::npos);
  EXPECT_TRUE(unresolved_calls(k.ptx).empty()) << *unresolved_calls(k.ptx).begin();

  const bool is_attention = std::holds_alternative<AttentionKernel>(c.request);
  const bool is_linear = std::holds_alternative<LinearKernel>(c.request);
  if (std::holds_alternative<DecodeAttentionKernel>(c.request)) {
    EXPECT_GT(k.shared_bytes, 0);  // the warps' partial results
    EXPECT_NE(k.ptx.find("shfl.sync.bfly.b32"), std::string::npos);
    EXPECT_NE(k.ptx.find("ex2.approx.ftz.f32"), std::string::npos);
    EXPECT_NE(k.ptx.find("bar.sync"), std::string::npos);
  } else if (is_attention) {
    EXPECT_GT(k.shared_bytes, 0);
    EXPECT_EQ(k.shared_bytes, attention_shared_bytes(std::get<AttentionKernel>(c.request)));
    EXPECT_NE(k.ptx.find("ex2.approx.ftz.f32"), std::string::npos);
    EXPECT_NE(k.ptx.find("shfl.sync.bfly.b32"), std::string::npos);
    EXPECT_NE(k.ptx.find("bar.sync"), std::string::npos);
    const bool mma = std::get<AttentionKernel>(c.request).spec.storage == DType::bf16;
    EXPECT_EQ(k.ptx.find("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") != std::string::npos, mma);
    EXPECT_EQ(k.ptx.find("ldmatrix.sync.aligned.m8n8.x4.shared.b16") != std::string::npos, mma);
    EXPECT_EQ(k.ptx.find("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") != std::string::npos, mma);
  } else if (const auto* bwd = std::get_if<AttentionBackwardKernel>(&c.request);
             bwd && bwd->part == AttentionBackwardKernel::Part::dtensor) {
    EXPECT_EQ(k.shared_bytes, 0);  // the slots summed by a grid-stride loop
    EXPECT_EQ(k.ptx.find("bar.sync"), std::string::npos);
    EXPECT_EQ(k.ptx.find("mma.sync"), std::string::npos);
  } else if (bwd) {
    EXPECT_EQ(k.shared_bytes, attention_backward_shared_bytes(*bwd));
    EXPECT_NE(k.ptx.find("ex2.approx.ftz.f32"), std::string::npos);
    EXPECT_NE(k.ptx.find("bar.sync"), std::string::npos);
    // dq sums D = rowsum(dO ∘ O) over a row's lanes; dkdv sums a tile's share of a uniform load
    // of a tensor gradient over the warp
    const bool dq = bwd->part == AttentionBackwardKernel::Part::dq;
    EXPECT_EQ(k.ptx.find("shfl.sync.bfly.b32") != std::string::npos, dq || !bwd->spec.tensor_grads.empty());
    const bool mma = bwd->spec.storage == DType::bf16;
    if (!mma) {
      EXPECT_NE(k.ptx.find("fma.rn.f32"), std::string::npos);  // the fp32 kernels' products
    }
    EXPECT_EQ(k.ptx.find("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") != std::string::npos, mma);
    EXPECT_EQ(k.ptx.find("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") != std::string::npos, mma);
  } else {
    EXPECT_EQ(k.shared_bytes, 0);
  }
  EXPECT_EQ(k.static_shared_bytes > 0, is_linear);
  if (is_linear) {
    const bool mma = std::get<LinearKernel>(c.request).storage == DType::bf16;
    EXPECT_EQ(k.ptx.find("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") != std::string::npos, mma);
    EXPECT_EQ(k.ptx.find("ldmatrix.sync.aligned.m8n8.x4.shared.b16") != std::string::npos, mma);
  }

  // (3) ptxas accepts it.
  std::string why;
  const auto report = run_ptxas(k.ptx, sm, &why);
  if (!report) {
    if (!find_ptxas()) GTEST_SKIP() << why;
    FAIL() << why;
  }
  EXPECT_EQ(report->function, k.name);
  EXPECT_GT(report->registers, 0);
  EXPECT_LE(report->registers, 255);
  // ptxas counts static shared memory only: the attention tiles are dynamic (k.shared_bytes).
  EXPECT_EQ(report->shared_bytes, k.static_shared_bytes);
  EXPECT_EQ(report->spill_stores, 0) << report->log;
  EXPECT_EQ(report->spill_loads, 0) << report->log;
  std::printf("[ptxas] %-28s sm_%d  registers %3d  smem %6d B (static %d + dynamic %d)  spills %d/%d B  stack %d B\n",
              c.label.c_str(), sm, report->registers, report->shared_bytes + k.shared_bytes, report->shared_bytes,
              k.shared_bytes, report->spill_stores, report->spill_loads, report->stack_bytes);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Case, int>>& info) {
  return std::get<0>(info.param).label + "_sm" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Attention, Kernels,
                         ::testing::Combine(::testing::ValuesIn(attention_cases()), ::testing::Values(80, 90)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Backward, Kernels,
                         ::testing::Combine(::testing::ValuesIn(backward_cases()), ::testing::Values(80, 90)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Decode, Kernels,
                         ::testing::Combine(::testing::ValuesIn(decode_cases()), ::testing::Values(80, 90)), case_name);
INSTANTIATE_TEST_SUITE_P(Dense, Kernels,
                         ::testing::Combine(::testing::ValuesIn(other_cases()), ::testing::Values(80, 90)), case_name);

TEST(NvptxLaunch, AttentionGeometry) {
  auto a = attention(64, 64);
  const PtxKernel k = emit_ptx(a, 80);
  EXPECT_EQ(k.block_x, 128);
  EXPECT_EQ(k.block_y, 1);
  EXPECT_EQ(k.block_z, 1);
  EXPECT_EQ(attention_grid(a, 3, 130), (Dim3{3, 4, 3}));  // ceil(130 / 64) query tiles, Hq, B
  EXPECT_EQ(attention_grid(a, 3, 0), (Dim3{0, 0, 0}));
  EXPECT_EQ(attention_grid(a, 0, 64), (Dim3{0, 0, 0}));
  // d64: block_q 64, block_k 64; Q and K rows padded to 68 floats, P rows to 68, V unpadded.
  EXPECT_EQ(attention_shared_bytes(a), 4 * (64 * 68 + 64 * 68 + 64 * 64 + 64 * 68));
  auto big = attention(128, 128);
  EXPECT_EQ(attention_grid(big, 2, 64), (Dim3{1, 4, 2}));
  EXPECT_EQ(attention_shared_bytes(big), 4 * (64 * 132 + 32 * 132 + 32 * 128 + 64 * 36));
  auto wide = attention(64, 256);  // dv > 128: 32 query rows per block by default
  EXPECT_EQ(attention_grid(wide, 1, 64), (Dim3{2, 4, 1}));
}

TEST(NvptxLaunch, OtherGrids) {
  EXPECT_EQ(linear_grid(LinearKernel{}, 130, 64), (Dim3{3, 1, 1}));
  EXPECT_EQ(linear_grid(LinearKernel{}, 0, 64), (Dim3{0, 0, 0}));
  EXPECT_EQ(layer_norm_grid(LayerNormKernel{}, 9), (Dim3{3, 1, 1}));  // 4 rows (warps) per block
  EXPECT_EQ(elementwise_grid(256, 1000), (Dim3{4, 1, 1}));
  EXPECT_EQ(elementwise_grid(256, std::int64_t{1} << 40), (Dim3{65535, 1, 1}));
  EXPECT_EQ(elementwise_grid(256, 0), (Dim3{0, 0, 0}));
  const PtxKernel lin = emit_ptx(LinearKernel{}, 90);
  EXPECT_EQ(lin.block_x, 128);
  EXPECT_EQ(lin.static_shared_bytes, 4 * 16 * (68 + 68));
}

TEST(NvptxNames, StableAndDistinct) {
  auto a = attention(64, 64);
  auto b = a;
  EXPECT_EQ(kernel_name(a), kernel_name(b));
  b.spec.vector_floats = 8;  // a CPU-only field: the same GPU kernel
  EXPECT_EQ(kernel_name(a), kernel_name(b));
  b.spec.causal = true;
  EXPECT_NE(kernel_name(a), kernel_name(b));
  auto c = a;
  c.block_k = 32;
  EXPECT_NE(kernel_name(a), kernel_name(c));
  EXPECT_NE(kernel_name(ElementwiseKernel{ElementwiseOp::scale, 2.0f, 256}),
            kernel_name(ElementwiseKernel{ElementwiseOp::scale, 3.0f, 256}));
}

TEST(NvptxIr, KernelsAreMarkedAndUseNvvmIntrinsics) {
  auto a = attention(64, 64);
  a.spec.dropout_p = 0.2;
  const std::string ir = nvptx_ir(a, 90, false);
  EXPECT_NE(ir.find("ptx_kernel void @" + kernel_name(a)), std::string::npos);
  EXPECT_NE(ir.find("!\"kernel\""), std::string::npos);
  EXPECT_NE(ir.find("llvm.nvvm.ex2.approx.ftz.f"), std::string::npos);
  EXPECT_NE(ir.find("llvm.nvvm.barrier0"), std::string::npos);
  EXPECT_NE(ir.find("addrspace(3)"), std::string::npos);
  EXPECT_NE(ir.find("nvptx64-nvidia-cuda"), std::string::npos);
  const std::string opt = nvptx_ir(a, 90, true);
  EXPECT_EQ(opt.find("llvm.exp."), std::string::npos);
  EXPECT_NE(opt.find("ptx_kernel"), std::string::npos);
  const std::string gelu = nvptx_ir(ElementwiseKernel{ElementwiseOp::gelu, 1.0f, 256}, 80, true);
  EXPECT_EQ(gelu.find("llvm.exp."), std::string::npos);  // the polynomial exp, not a libcall
}

TEST(NvptxIr, AModUsesEx2AndLg2AndReadsTheTensorTable) {
  auto a = attention(64, 64);
  documents_softcap_mod(a);
  const std::string ir = nvptx_ir(a, 80, true);
  EXPECT_NE(ir.find("llvm.nvvm.lg2.approx.ftz.f"), std::string::npos);  // log
  EXPECT_NE(ir.find("llvm.nvvm.ex2.approx.ftz.f"), std::string::npos);
  EXPECT_EQ(ir.find("llvm.log."), std::string::npos);  // no libcall
  EXPECT_EQ(ir.find("llvm.exp."), std::string::npos);
  const PtxKernel k = emit_ptx(a, 80);
  EXPECT_NE(k.ptx.find("lg2.approx.ftz.f32"), std::string::npos);
  EXPECT_NE(k.signature.find("const void* const* tensors, const int64_t* extents"), std::string::npos) << k.signature;
}

TEST(NvptxErrors, ModsTheKernelCannotEvaluateThrow) {
  auto bad = [](const AttentionKernel& a) { EXPECT_THROW(emit_ptx(a, 80), std::runtime_error); };
  {
    auto a = attention(64, 64);  // a keep predicate that reads the score
    ModExpr e;
    e.keep = node(e, ModOp::gt, node(e, ModOp::score), node(e, ModOp::constant));
    a.spec.mod = e;
    bad(a);
    EXPECT_THROW(attention_shared_bytes(a), std::runtime_error);  // refused before any IR: a planner falls back
  }
  {
    auto a = attention(64, 64);  // a 16-bit float tensor
    documents_softcap_mod(a);
    a.spec.tensors[1].dtype = DType::f16;
    bad(a);
  }
  {
    auto a = attention(64, 64);  // an axis the scores do not have
    ModExpr e;
    e.keep = node(e, ModOp::lt, node(e, ModOp::index, -1, -1, "nope"), node(e, ModOp::constant));
    a.spec.mod = e;
    bad(a);
  }
  {
    auto a = attention(64, 64);  // a load with the wrong number of indices
    documents_softcap_mod(a);
    a.spec.tensors[0].rank = 2;
    bad(a);
  }
}

TEST(NvptxErrors, BadRequestsThrow) {
  auto bad = [](auto request, int sm = 80) { EXPECT_THROW(emit_ptx(request, sm), std::runtime_error); };
  bad(attention(64, 64), 70);
  bad(attention(64, 64), 100);
  auto a = attention(64, 64);
  a.spec.hq = 3;
  a.spec.hkv = 2;
  bad(a);
  a = attention(64, 64);
  a.spec.dropout_p = 1.0;
  bad(a);
  a = attention(0, 64);
  bad(a);
  a = attention(64, 64);
  a.block_q = 48;  // 4 warps · 4 row groups · 3 rows per thread: allowed
  EXPECT_NO_THROW(attention_shared_bytes(a));
  a.block_q = 40;
  bad(a);
  a = attention(64, 64);
  a.block_k = 12;
  bad(a);
  a = attention(64, 64);
  a.threads = 100;
  bad(a);
  a = attention(512, 512);  // too many accumulators per thread
  bad(a);
  bad(LinearKernel{12, 64, 16});
  bad(LinearKernel{64, 64, 0});
  bad(LayerNormKernel{48});
  bad(ElementwiseKernel{ElementwiseOp::relu, 1.0f, 2048});
  bad(StridedCopyKernel{7, 256});
  bad(StridedCopyKernel{0, 256});
  a = attention(64, 64);
  a.spec.hkv = 3;
  EXPECT_THROW(attention_grid(a, 1, 1), std::runtime_error);
}

TEST(NvptxPtxas, ReportsAbsenceAndRejection) {
  // An explicit QKV_PTXAS that does not exist: no fallback, a reason.
  const char* old = std::getenv("QKV_PTXAS");
  const std::string saved = old ? old : "";
  ::setenv("QKV_PTXAS", "/nonexistent/ptxas", 1);
  std::string why;
  EXPECT_FALSE(run_ptxas(".version 7.0\n.target sm_80\n.address_size 64\n", 80, &why).has_value());
  EXPECT_NE(why.find("QKV_PTXAS"), std::string::npos) << why;
  if (old)
    ::setenv("QKV_PTXAS", saved.c_str(), 1);
  else
    ::unsetenv("QKV_PTXAS");

  if (!find_ptxas()) GTEST_SKIP() << "no ptxas (QKV_PTXAS unset, none on PATH, no /usr/local/cuda/bin/ptxas)";
  why.clear();
  EXPECT_FALSE(run_ptxas("this is not PTX\n", 80, &why).has_value());
  EXPECT_NE(why.find("failed"), std::string::npos) << why;
}

}  // namespace
}  // namespace qkv
