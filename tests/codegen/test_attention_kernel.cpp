// The fused CPU attention kernel (JIT) against the reference interpreter running the same
// attention built as a Graph with the DSL's ops: contract<HeadDim> → scaled → biased / masked /
// causal → softmax<Key> → dropout → contract<Key>.
//
// Over odd lengths (1, 7, 33, 257), L != S both ways, head widths 32/64/80/128 with dv != dk,
// causal top-left and bottom-right (incl. rows that see no key), key padding with fully padded
// batch rows, an additive bias with −inf entries, GQA/MQA, dropout (the mask must be identical:
// a weight is zero in the kernel exactly where it is zero in the interpreter), with and without
// the weights, and forced small/odd tilings and narrower vectors to reach every tail path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include <qkv/codegen/cpu/attention.hpp>
#include <qkv/codegen/cpu/run_attention.hpp>
#include <qkv/codegen/target.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>

namespace qkv {
namespace {

using codegen::cpu::AttentionArgs;
using codegen::cpu::AttentionSpec;
using nn::Batch;
using nn::Group;
using nn::HeadDim;
using nn::Heads;
using nn::Key;
using nn::KvHeads;
using nn::Seq;
using nn::ValueDim;

constexpr float kInf = std::numeric_limits<float>::infinity();
// Relative tolerance on outputs and weights (the interpreter computes in fp64): |got − want| <=
// kRel · (|want| + typical magnitude of the tensor), so that entries near zero are not held to a
// relative bound their own cancellation makes meaningless.
constexpr double kRel = 2e-5;

struct Case {
  std::string name{};
  std::int64_t batch = 1, hq = 1, hkv = 1, len_q = 7, len_k = 7, dk = 64, dv = 64;
  bool causal = false;
  CausalAlign align = CausalAlign::top_left;
  bool key_padding = false;
  std::vector<std::int64_t> visible_keys{};  // per batch row with key_padding: keys [0, n) kept (0 = fully padded)
  bool bias = false;
  double dropout = 0.0;
  bool weights = false;
  double scale = 0.0;
  // tiling overrides
  int vector_floats = 0, query_vectors = 0, key_tile = 0, qk_keys = 0, pv_dims = 0;
  // the split-KV decode kernel: L <= decode_queries runs it (0: the default 4, −1: never)
  int decode_queries = 0, decode_chunk = 0;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

std::vector<float> random_values(std::size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

AttentionSpec spec_of(const Case& c) {
  AttentionSpec s;
  s.dk = c.dk;
  s.dv = c.dv;
  s.hq = c.hq;
  s.hkv = c.hkv;
  s.scale = c.scale;
  s.causal = c.causal;
  s.align = c.align;
  s.key_padding = c.key_padding;
  s.bias = c.bias;
  s.dropout_p = c.dropout;
  s.write_weights = c.weights;
  s.vector_floats = c.vector_floats;
  s.query_vectors = c.query_vectors;
  s.key_tile = c.key_tile;
  s.qk_keys = c.qk_keys;
  s.pv_dims = c.pv_dims;
  s.decode_queries = c.decode_queries;
  s.decode_chunk = c.decode_chunk;
  return s;
}

constexpr std::uint64_t kSeed = 0x5eed1234abcdull;

/// The masks, softmax, dropout and P·V after the (scaled) scores, shared by both layouts.
template <class S, class V>
void finish_graph(const Case& c, Graph& g, S s, const V& v) {
  if (c.bias) s = biased(s, input<Tensor<f32, Seq<dyn>, Key<dyn>>>(g, "bias"));
  if (c.key_padding) s = masked(s, input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep"));
  if (c.causal)
    s = c.align == CausalAlign::top_left ? causal<Seq, Key>(s, top_left) : causal<Seq, Key>(s, bottom_right);
  auto p = softmax<Key>(s);
  if (c.dropout > 0) p = dropout(p, c.dropout, kSeed);
  output(contract<Key>(p, v), "out");
  output(p, "weights");
}

std::optional<double> custom_scale(const Case& c) {
  return c.scale != 0.0 ? std::optional<double>(c.scale) : std::nullopt;
}

/// q [B, Heads, Seq, HeadDim] — one kv head per query head.
Graph mha_graph(const Case& c) {
  Graph g;
  auto q = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Seq<dyn>, HeadDim<dyn>>>(g, "q");
  auto k = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Key<dyn>, HeadDim<dyn>>>(g, "k");
  auto v = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Key<dyn>, ValueDim<dyn>>>(g, "v");
  finish_graph(c, g, scaled(contract<HeadDim>(q, k), custom_scale(c)), v);
  return g;
}

/// q [B, KvHeads, Group, Seq, HeadDim] — the memory layout of [B, Hq, L, Dk] with h = kv·G + g,
/// which is also the dropout head index the interpreter uses for this rank.
Graph gqa_graph(const Case& c) {
  Graph g;
  auto q = input<Tensor<f32, Batch<dyn>, KvHeads<dyn>, Group<dyn>, Seq<dyn>, HeadDim<dyn>>>(g, "q");
  auto k = input<Tensor<f32, Batch<dyn>, KvHeads<dyn>, Key<dyn>, HeadDim<dyn>>>(g, "k");
  auto v = input<Tensor<f32, Batch<dyn>, KvHeads<dyn>, Key<dyn>, ValueDim<dyn>>>(g, "v");
  finish_graph(c, g, scaled(contract<HeadDim>(q, k), custom_scale(c)), v);
  return g;
}

struct Inputs {
  std::vector<float> q, k, v, bias;
  std::vector<std::uint8_t> keep;
};

Inputs make_inputs(const Case& c, unsigned seed) {
  Inputs in;
  const auto nq = static_cast<std::size_t>(c.batch * c.hq * c.len_q * c.dk);
  const auto nk = static_cast<std::size_t>(c.batch * c.hkv * c.len_k * c.dk);
  const auto nv = static_cast<std::size_t>(c.batch * c.hkv * c.len_k * c.dv);
  // Wide enough that the softmax is far from uniform (scores of a few units after scaling).
  in.q = random_values(nq, seed, -2.0f, 2.0f);
  in.k = random_values(nk, seed + 1, -2.0f, 2.0f);
  in.v = random_values(nv, seed + 2, -1.0f, 1.0f);
  if (c.bias) {
    in.bias = random_values(static_cast<std::size_t>(c.len_q * c.len_k), seed + 3, -1.0f, 1.0f);
    for (std::size_t i = 0; i < in.bias.size(); i += 5) in.bias[i] = -kInf;  // some entries masked by the bias
  }
  if (c.key_padding) {
    in.keep.assign(static_cast<std::size_t>(c.batch * c.len_k), 0);
    for (std::int64_t b = 0; b < c.batch; ++b) {
      const std::int64_t n = b < static_cast<std::int64_t>(c.visible_keys.size()) ? c.visible_keys[b] : c.len_k;
      for (std::int64_t j = 0; j < std::min(n, c.len_k); ++j) in.keep[b * c.len_k + j] = 1;
    }
  }
  return in;
}

struct Reference {
  std::vector<float> out, weights;
};

Reference interpret_case(const Case& c, const Inputs& in) {
  const bool gqa = c.hq != c.hkv;
  const std::int64_t group = c.hq / c.hkv;
  Feeds feeds;
  if (gqa) {
    feeds["q"] = NdArray::from_f32(in.q, {c.batch, c.hkv, group, c.len_q, c.dk});
  } else {
    feeds["q"] = NdArray::from_f32(in.q, {c.batch, c.hq, c.len_q, c.dk});
  }
  feeds["k"] = NdArray::from_f32(in.k, {c.batch, c.hkv, c.len_k, c.dk});
  feeds["v"] = NdArray::from_f32(in.v, {c.batch, c.hkv, c.len_k, c.dv});
  if (c.bias) feeds["bias"] = NdArray::from_f32(in.bias, {c.len_q, c.len_k});
  if (c.key_padding) {
    NdArray keep = NdArray::zeros(DType::boolean, {c.batch, c.len_k});
    for (std::size_t i = 0; i < in.keep.size(); ++i) keep.bytes[i] = std::byte{in.keep[i]};
    feeds["keep"] = keep;
  }
  const Graph g = gqa ? gqa_graph(c) : mha_graph(c);
  const RunResult r = interpret(g, feeds);
  return {r.outputs.at("out").to_f32(), r.outputs.at("weights").to_f32()};
}

struct Kernel {
  std::vector<float> out, weights;
};

Kernel run_kernel(const Case& c, const Inputs& in, int threads) {
  Kernel k;
  k.out.assign(static_cast<std::size_t>(c.batch * c.hq * c.len_q * c.dv), std::numeric_limits<float>::quiet_NaN());
  if (c.weights)
    k.weights.assign(static_cast<std::size_t>(c.batch * c.hq * c.len_q * c.len_k),
                     std::numeric_limits<float>::quiet_NaN());
  AttentionArgs a;
  a.q = in.q.data();
  a.k = in.k.data();
  a.v = in.v.data();
  a.out = k.out.data();
  a.weights = c.weights ? k.weights.data() : nullptr;
  a.key_keep = c.key_padding ? in.keep.data() : nullptr;
  a.bias = c.bias ? in.bias.data() : nullptr;
  a.batch = c.batch;
  a.len_q = c.len_q;
  a.len_k = c.len_k;
  a.seed = kSeed;
  codegen::cpu::run_attention(spec_of(c), a, threads);
  return k;
}

double mean_abs(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += std::abs(static_cast<double>(x));
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

/// Every entry within tolerance; returns the worst error relative to the bound (<= 1 passes).
double expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  const double typical = mean_abs(want);
  double worst = 0;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double bound = kRel * (std::abs(static_cast<double>(want[i])) + typical) + 1e-30;
    worst = std::max(worst, std::isnan(err) ? kInf : err / bound);
    if (!(err <= bound) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: kernel " << got[i] << ", interpreter " << want[i];
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " entries out of tolerance";
  return worst;
}

class AttentionKernel : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionKernel, MatchesTheReferenceInterpreter) {
  const Case& c = GetParam();
  const Inputs in = make_inputs(c, 17);
  const Reference ref = interpret_case(c, in);
  const Kernel got = run_kernel(c, in, 2);

  const double worst_out = expect_close(got.out, ref.out, "out");
  RecordProperty("worst_out_error_vs_tolerance", std::to_string(worst_out));
  if (c.weights) {
    expect_close(got.weights, ref.weights, "weights");
    // Zero pattern (masks, causal, padding, dropout): identical, not merely close.
    std::size_t differ = 0;
    for (std::size_t i = 0; i < ref.weights.size(); ++i) differ += (got.weights[i] == 0.0f) != (ref.weights[i] == 0.0f);
    EXPECT_EQ(differ, 0u) << "entries zero in one and not in the other";
  }
}

std::vector<Case> cases() {
  std::vector<Case> v;
  auto add = [&](Case c) { v.push_back(std::move(c)); };
  // --- shapes
  add({.name = "L1_S1_d32", .len_q = 1, .len_k = 1, .dk = 32, .dv = 32});
  add({.name = "L7_S7_d64_B2_H2", .batch = 2, .hq = 2, .hkv = 2, .len_q = 7, .len_k = 7});
  add({.name = "L33_S33_d80", .hq = 2, .hkv = 2, .len_q = 33, .len_k = 33, .dk = 80, .dv = 80});
  add({.name = "L257_S257_d128", .hq = 2, .hkv = 2, .len_q = 257, .len_k = 257, .dk = 128, .dv = 128});
  add({.name = "L7_S33_dk64_dv32", .len_q = 7, .len_k = 33, .dk = 64, .dv = 32});
  add({.name = "L33_S7_dk32_dv80", .batch = 2, .len_q = 33, .len_k = 7, .dk = 32, .dv = 80});
  add({.name = "L1_S257_dk128_dv64", .hq = 3, .hkv = 3, .len_q = 1, .len_k = 257, .dk = 128, .dv = 64});
  add({.name = "L257_S1_d64", .len_q = 257, .len_k = 1});
  add({.name = "custom_scale", .len_q = 33, .len_k = 33, .scale = 0.37});
  // --- causal
  add({.name = "causal_L257_S257", .hq = 2, .hkv = 2, .len_q = 257, .len_k = 257, .causal = true});
  add({.name = "causal_top_left_L33_S257", .len_q = 33, .len_k = 257, .dk = 80, .dv = 80, .causal = true});
  add({.name = "causal_top_left_L257_S33", .len_q = 257, .len_k = 33, .causal = true});
  add({.name = "causal_bottom_right_L33_S257",
       .len_q = 33,
       .len_k = 257,
       .causal = true,
       .align = CausalAlign::bottom_right});
  add({.name = "causal_bottom_right_L257_S33_empty_rows",
       .len_q = 257,
       .len_k = 33,
       .dk = 32,
       .dv = 128,
       .causal = true,
       .align = CausalAlign::bottom_right,
       .weights = true});
  add({.name = "causal_bottom_right_decode_L1_S257",
       .hq = 2,
       .hkv = 2,
       .len_q = 1,
       .len_k = 257,
       .causal = true,
       .align = CausalAlign::bottom_right});
  add({.name = "causal_top_left_weights_L257_S257",
       .len_q = 257,
       .len_k = 257,
       .dk = 32,
       .dv = 32,
       .causal = true,
       .weights = true});
  // --- key padding, bias
  add({.name = "key_padding_with_fully_padded_row",
       .batch = 3,
       .hq = 2,
       .hkv = 2,
       .len_q = 33,
       .len_k = 257,
       .key_padding = true,
       .visible_keys = {257, 0, 100},
       .weights = true});
  add({.name = "key_padding_causal_bottom_right",
       .batch = 2,
       .len_q = 7,
       .len_k = 33,
       .causal = true,
       .align = CausalAlign::bottom_right,
       .key_padding = true,
       .visible_keys = {20, 33},
       .weights = true});
  add({.name = "bias_with_neg_inf", .len_q = 33, .len_k = 257, .dk = 32, .dv = 64, .bias = true, .weights = true});
  add({.name = "bias_key_padding_causal",
       .batch = 2,
       .hq = 2,
       .hkv = 2,
       .len_q = 257,
       .len_k = 257,
       .causal = true,
       .key_padding = true,
       .visible_keys = {200, 7},
       .bias = true});
  // --- GQA / MQA
  add({.name = "gqa_4q_2kv", .batch = 2, .hq = 4, .hkv = 2, .len_q = 33, .len_k = 33});
  add({.name = "mqa_4q_1kv_causal", .hq = 4, .hkv = 1, .len_q = 257, .len_k = 257, .dk = 80, .dv = 32, .causal = true});
  // --- dropout (the mask must be the interpreter's, bit for bit)
  add({.name = "dropout_weights",
       .batch = 2,
       .hq = 2,
       .hkv = 2,
       .len_q = 33,
       .len_k = 257,
       .dropout = 0.3,
       .weights = true});
  add({.name = "dropout_no_weights", .hq = 2, .hkv = 2, .len_q = 257, .len_k = 257, .dropout = 0.1});
  add({.name = "dropout_gqa_causal_weights",
       .batch = 2,
       .hq = 4,
       .hkv = 2,
       .len_q = 33,
       .len_k = 33,
       .causal = true,
       .dropout = 0.5,
       .weights = true});
  // --- forced tilings: odd blocks, narrow vectors, every tail path
  add({.name = "tiles_odd_blocks",
       .hq = 2,
       .hkv = 2,
       .len_q = 257,
       .len_k = 257,
       .dk = 80,
       .dv = 80,
       .causal = true,
       .key_padding = true,
       .visible_keys = {250},
       .weights = true,
       .query_vectors = 3,
       .key_tile = 9,
       .qk_keys = 3,
       .pv_dims = 3});
  add({.name = "tiles_avx2_width",
       .len_q = 33,
       .len_k = 257,
       .dk = 32,
       .dv = 80,
       .causal = true,
       .align = CausalAlign::bottom_right,
       .dropout = 0.2,
       .weights = true,
       .vector_floats = 8});
  add({.name = "tiles_sse_width", .len_q = 33, .len_k = 33, .dk = 64, .dv = 32, .bias = true, .vector_floats = 4});
  add({.name = "tiles_tiny_key_tile",
       .len_q = 7,
       .len_k = 33,
       .causal = true,
       .align = CausalAlign::bottom_right,
       .query_vectors = 1,
       .key_tile = 1,
       .qk_keys = 1,
       .pv_dims = 1});
  // --- the split-KV decode kernel (L <= 4, no weights or dropout, head widths whole vectors):
  // keys split in chunks merged by their log-sum-exp, GQA groups sharing each K/V row
  add({.name = "decode_gqa_8q_2kv_L1_S5000_d128",
       .hq = 8,
       .hkv = 2,
       .len_q = 1,
       .len_k = 5000,
       .dk = 128,
       .dv = 128,
       .causal = true,
       .align = CausalAlign::bottom_right});
  add({.name = "decode_fused_kernel_L1_S257",
       .hq = 3,
       .hkv = 3,
       .len_q = 1,
       .len_k = 257,
       .dk = 128,
       .dv = 64,
       .decode_queries = -1});
  add({.name = "decode_gqa_L3_causal_bottom_right",
       .batch = 2,
       .hq = 4,
       .hkv = 2,
       .len_q = 3,
       .len_k = 300,
       .dk = 64,
       .dv = 32,
       .causal = true,
       .align = CausalAlign::bottom_right});
  add({.name = "decode_chunks_padding_bias",
       .batch = 2,
       .hq = 2,
       .hkv = 1,
       .len_q = 2,
       .len_k = 100,
       .dk = 32,
       .dv = 48,
       .key_padding = true,
       .visible_keys = {0, 50},
       .bias = true,
       .decode_chunk = 7});
  add({.name = "decode_chunks_causal_top_left_empty_rows",
       .hq = 2,
       .hkv = 2,
       .len_q = 4,
       .len_k = 40,
       .dk = 32,
       .dv = 32,
       .causal = true,
       .decode_chunk = 3});
  add({.name = "decode_mqa_16q_1kv_L1_S1000", .hq = 16, .hkv = 1, .len_q = 1, .len_k = 1000, .dk = 64, .dv = 32});
  add({.name = "decode_group_17_heads_one_row_each", .hq = 17, .hkv = 1, .len_q = 1, .len_k = 40, .dk = 32, .dv = 32});
  add({.name = "decode_avx2_width_chunks",
       .hq = 6,
       .hkv = 3,
       .len_q = 1,
       .len_k = 513,
       .dk = 64,
       .dv = 64,
       .vector_floats = 8,
       .decode_chunk = 100});
  add({.name = "decode_sse_width_L8",
       .hq = 2,
       .hkv = 1,
       .len_q = 8,
       .len_k = 77,
       .dk = 32,
       .dv = 32,
       .vector_floats = 4,
       .decode_queries = 8});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionKernel, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& param) { return param.param.name; });

// The decode kernel's log-sum-exp and outputs, one chunk and many (merged), against the fused
// kernel on the same call (both against the interpreter through the cases above, for out).
TEST(AttentionKernelDecode, LogSumExpAndOutputsMatchTheFusedKernel) {
  for (int chunk : {0, 7}) {
    for (std::int64_t len_q : {1, 4}) {
      Case c{.name = "decode_lse",
             .batch = 2,
             .hq = 6,
             .hkv = 2,
             .len_q = len_q,
             .len_k = 90,
             .dk = 32,
             .dv = 48,
             .causal = true,
             .align = CausalAlign::bottom_right,
             .key_padding = true,
             .visible_keys = {0, 61}};
      c.decode_chunk = chunk;
      const Inputs in = make_inputs(c, 5);
      auto run = [&](int decode_queries, std::vector<float>& out, std::vector<float>& lse) {
        AttentionSpec s = spec_of(c);
        s.write_lse = true;
        s.decode_queries = decode_queries;
        out.assign(static_cast<std::size_t>(c.batch * c.hq * c.len_q * c.dv), std::numeric_limits<float>::quiet_NaN());
        lse.assign(static_cast<std::size_t>(c.batch * c.hq * c.len_q), std::numeric_limits<float>::quiet_NaN());
        AttentionArgs a;
        a.q = in.q.data();
        a.k = in.k.data();
        a.v = in.v.data();
        a.out = out.data();
        a.key_keep = in.keep.data();
        a.batch = c.batch;
        a.len_q = c.len_q;
        a.len_k = c.len_k;
        a.lse = lse.data();
        codegen::cpu::run_attention(s, a, 2);
      };
      std::vector<float> out_d, lse_d, out_f, lse_f;
      run(0, out_d, lse_d);
      run(-1, out_f, lse_f);
      SCOPED_TRACE("chunk " + std::to_string(chunk) + ", L = " + std::to_string(len_q));
      expect_close(out_d, out_f, "out");
      for (std::size_t i = 0; i < lse_f.size(); ++i) {
        if (std::isinf(lse_f[i])) {
          EXPECT_EQ(lse_d[i], lse_f[i]) << i;  // batch 0 sees no key: −inf
        } else {
          EXPECT_NEAR(lse_d[i], lse_f[i], 1e-5 * (1 + std::abs(lse_f[i]))) << i;
        }
      }
    }
  }
}

// Tasks are independent and each is computed in a fixed order: 1 thread and 3 threads agree
// bit for bit (on the cases small enough to run twice quickly).
TEST(AttentionKernelThreads, ThreadCountDoesNotChangeTheResult) {
  for (const Case& c : cases()) {
    if (c.batch * c.hq * c.len_q * c.len_k > 40000) continue;
    SCOPED_TRACE(c.name);
    const Inputs in = make_inputs(c, 29);
    const Kernel one = run_kernel(c, in, 1), three = run_kernel(c, in, 3);
    EXPECT_EQ(one.out, three.out);
    EXPECT_EQ(one.weights, three.weights);
  }
}

// --- API behaviour ------------------------------------------------------------------------------

TEST(AttentionKernelApi, SecondPrepareComesFromTheCache) {
  AttentionSpec s;
  s.dk = 48;
  s.dv = 16;
  s.hq = 6;
  s.hkv = 3;
  const auto first = codegen::cpu::prepare_attention(s);
  const auto again = codegen::cpu::prepare_attention(s);
  EXPECT_TRUE(again.cached);
  EXPECT_EQ(first.name, again.name);
  EXPECT_GT(first.query_rows, 0);
  AttentionSpec other = s;
  other.causal = true;
  EXPECT_NE(codegen::cpu::prepare_attention(other).name, first.name);
}

TEST(AttentionKernelApi, UsesTheHostVectorWidth) {
  const auto info = codegen::cpu::prepare_attention(AttentionSpec{});
  EXPECT_EQ(info.vector_floats, std::max(codegen::host_target().vector_floats, 4));
}

TEST(AttentionKernelApi, OptimisedIrHasNoLibraryCallsForExp) {
  AttentionSpec s;
  s.causal = true;
  s.dropout_p = 0.1;
  s.write_weights = true;
  const std::string ir = codegen::cpu::attention_kernel_ir(s, true);
  EXPECT_NE(ir.find("define void @qkv_attention_"), std::string::npos);
  for (const char* call : {"@expf", "@exp2f", "@llvm.exp.", "@llvm.exp2."})
    EXPECT_EQ(ir.find(call), std::string::npos) << call;
  const std::string raw = codegen::cpu::attention_kernel_ir(s, false);
  EXPECT_NE(raw.find("fmuladd.v"), std::string::npos);
}

TEST(AttentionKernelApi, RejectsInconsistentSpecsAndArguments) {
  std::vector<float> q(64), out(64);
  AttentionArgs a;
  a.q = q.data();
  a.k = q.data();
  a.v = q.data();
  a.out = out.data();
  a.batch = 1;
  a.len_q = 1;
  a.len_k = 1;
  AttentionSpec gqa;
  gqa.hq = 3;
  gqa.hkv = 2;
  EXPECT_THROW(codegen::cpu::run_attention(gqa, a), std::invalid_argument);
  AttentionSpec drop;
  drop.dropout_p = 1.0;
  EXPECT_THROW(codegen::cpu::run_attention(drop, a), std::invalid_argument);
  AttentionSpec weights;
  weights.write_weights = true;
  EXPECT_THROW(codegen::cpu::run_attention(weights, a), std::invalid_argument);
  AttentionSpec padding;
  padding.key_padding = true;
  EXPECT_THROW(codegen::cpu::run_attention(padding, a), std::invalid_argument);
  AttentionArgs negative = a;
  negative.len_k = -1;
  EXPECT_THROW(codegen::cpu::run_attention(AttentionSpec{}, negative), std::invalid_argument);
  try {
    codegen::cpu::run_attention(gqa, a);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of key/value heads"), std::string::npos) << e.what();
  }
}

TEST(AttentionKernelApi, EmptyKeysGiveZeroRows) {
  // S = 0: softmax over nothing; every output row is zero (as a fully masked row).
  std::vector<float> q(2 * 64, 1.0f), out(2 * 64, 7.0f);
  AttentionArgs a;
  a.q = q.data();
  a.out = out.data();
  a.batch = 1;
  a.len_q = 2;
  a.len_k = 0;
  codegen::cpu::run_attention(AttentionSpec{}, a);
  for (float x : out) EXPECT_EQ(x, 0.0f);
}

#if defined(__x86_64__)
TEST(AttentionKernelApi, FlushesDenormalResultsAndRestoresTheCallersMxcsr) {
  // The kernel runs with MXCSR's flush-to-zero bit (KernelConfig::flush_denormals): a value
  // row of denormals gives zeros, where the interpreter keeps them. The calling thread's MXCSR is
  // what it was.
  const std::int64_t L = 20, S = 30;
  std::vector<float> q(static_cast<std::size_t>(L * 64), 0.01f), k(static_cast<std::size_t>(S * 64), 0.02f);
  std::vector<float> v(static_cast<std::size_t>(S * 64), 1e-39f), out(static_cast<std::size_t>(L * 64), 7.0f);
  ASSERT_TRUE(std::fpclassify(v[0]) == FP_SUBNORMAL);
  AttentionArgs a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.out = out.data();
  a.batch = 1;
  a.len_q = L;
  a.len_k = S;
  const unsigned before = _mm_getcsr();
  codegen::cpu::run_attention(AttentionSpec{}, a, 1);
  EXPECT_EQ(_mm_getcsr(), before);
  for (float x : out) EXPECT_EQ(x, 0.0f);
  // Normal values are untouched: 1e-30 is far above the denormal range.
  std::fill(v.begin(), v.end(), 1e-30f);
  codegen::cpu::run_attention(AttentionSpec{}, a, 2);
  for (float x : out) EXPECT_NEAR(x, 1e-30f, 1e-36f);
}
#endif

}  // namespace
}  // namespace qkv
