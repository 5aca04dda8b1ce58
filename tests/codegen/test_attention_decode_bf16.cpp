// The split-KV decode kernel (L <= 4) on bf16 (and, at the end, f16) q, k, v and out (issue #16): K and V rows widened
// as loaded, scores, softmax and accumulators f32, the chunks' partial records f32, the output
// rounded to bf16 once, at the store. Against fp64 from the same bf16 values and against the
// fused kernel on the same bf16 inputs (decode_queries = −1), over GQA 8/2 at S = 5000 (several
// chunks), L = 1 and L = 3 causal bottom-right, padded keys (a batch row that sees none), forced
// small chunks, and K/V read in place out of a cache of kv_rows > S rows (NaN past S).
//
// Q·K runs on vdpbf16ps (pairs of features as stored) where the host has AVX512-BF16 and dk is
// a multiple of 32, and on K widened as loaded otherwise (dk = 48, 8-float vectors): both here.
//
// Tolerances. The decode kernel rounds only its output: |out − ref| <= u·|ref| + f32's error,
// u = 2^-8 (bf16's unit roundoff: 8 significant bits, round to nearest), f32's error as in
// test_attention_kernel.cpp (kRel · (|ref| + typical)). The fused kernel, on a host with
// AVX512-BF16 (vdpbf16ps), also rounds P to bf16 before P·V: each p_j·v_j off by at most u·p_j·|v_j|,
// so its output by at most u · Σ p_j |v_j| / Σ p_j more (`spread` below, from the fp64 softmax),
// and its sum l by u relative (u·|ref| more).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <qkv/codegen/cpu/attention.hpp>
#include <qkv/codegen/cpu/run_attention.hpp>
#include <qkv/runtime/io/array.hpp>

namespace qkv {
namespace {

using codegen::cpu::AttentionArgs;
using codegen::cpu::AttentionSpec;

constexpr double kUnit = 1.0 / 256;  // bf16's unit roundoff, 2^-8
constexpr double kRel = 2e-5;        // f32's error, as in test_attention_kernel.cpp
constexpr std::uint16_t kNanBits = 0x7FC0;

struct DecodeCase {
  std::string name;
  std::int64_t batch = 1, hq = 1, hkv = 1, len_q = 1, len_k = 100, dk = 64, dv = 64;
  bool causal = false;                       // bottom-right: key j visible to row i iff j <= i + S − L
  std::vector<std::int64_t> visible_keys{};  // key padding (per batch row: keys [0, n) kept) when non-empty
  std::int64_t kv_rows = 0;                  // rows per K/V head as stored (0: S); rows past S hold NaN
  int decode_chunk = 0;
  int vector_floats = 0;  // 0: the host's; 8: AVX2's width (no vdpbf16ps: K widened as loaded)
};

void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name; }

std::vector<std::uint16_t> random_bf16(std::size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(dist(gen));
  return v;
}

struct Inputs {
  std::vector<std::uint16_t> q, k, v;
  std::vector<std::uint8_t> keep;
};

std::int64_t rows_of(const DecodeCase& c) { return c.kv_rows > 0 ? c.kv_rows : c.len_k; }

Inputs make_inputs(const DecodeCase& c) {
  Inputs in;
  const std::int64_t rows = rows_of(c);
  in.q = random_bf16(static_cast<std::size_t>(c.batch * c.hq * c.len_q * c.dk), 11, -2.0f, 2.0f);
  in.k = random_bf16(static_cast<std::size_t>(c.batch * c.hkv * rows * c.dk), 12, -2.0f, 2.0f);
  in.v = random_bf16(static_cast<std::size_t>(c.batch * c.hkv * rows * c.dv), 13, -1.0f, 1.0f);
  // The cache's rows past S: never read.
  for (std::int64_t h = 0; h < c.batch * c.hkv; ++h)
    for (std::int64_t j = c.len_k; j < rows; ++j) {
      std::fill_n(in.k.begin() + (h * rows + j) * c.dk, c.dk, kNanBits);
      std::fill_n(in.v.begin() + (h * rows + j) * c.dv, c.dv, kNanBits);
    }
  if (!c.visible_keys.empty()) {
    in.keep.assign(static_cast<std::size_t>(c.batch * c.len_k), 0);
    for (std::int64_t b = 0; b < c.batch; ++b)
      std::fill_n(in.keep.begin() + b * c.len_k, std::min(c.visible_keys.at(static_cast<std::size_t>(b)), c.len_k), 1);
  }
  return in;
}

struct Reference {
  std::vector<double> out;     // fp64 from the bf16 values
  std::vector<double> spread;  // Σ p_j |v_j| / Σ p_j per output (0 for a row that sees no key)
};

Reference reference(const DecodeCase& c, const Inputs& in) {
  const std::int64_t rows = rows_of(c), group = c.hq / c.hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.dk));
  Reference r;
  r.out.assign(static_cast<std::size_t>(c.batch * c.hq * c.len_q * c.dv), 0.0);
  r.spread = r.out;
  std::vector<double> s(static_cast<std::size_t>(c.len_k));
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.hq; ++h)
      for (std::int64_t i = 0; i < c.len_q; ++i) {
        const std::int64_t kv = b * c.hkv + h / group;
        const std::uint16_t* q = &in.q[static_cast<std::size_t>(((b * c.hq + h) * c.len_q + i) * c.dk)];
        double m = -INFINITY;
        for (std::int64_t j = 0; j < c.len_k; ++j) {
          const bool seen = (!c.causal || j <= i + c.len_k - c.len_q) && (in.keep.empty() || in.keep[b * c.len_k + j]);
          double d = 0;
          for (std::int64_t x = 0; seen && x < c.dk; ++x)
            d += static_cast<double>(bf16_to_f32(q[x])) * bf16_to_f32(in.k[(kv * rows + j) * c.dk + x]);
          s[j] = seen ? d * scale : -INFINITY;
          m = std::max(m, s[j]);
        }
        if (m == -INFINITY) continue;  // no visible key: zeros
        double z = 0;
        const std::size_t o = static_cast<std::size_t>(((b * c.hq + h) * c.len_q + i) * c.dv);
        for (std::int64_t j = 0; j < c.len_k; ++j) {
          const double p = std::exp(s[j] - m);
          z += p;
          for (std::int64_t x = 0; p > 0 && x < c.dv; ++x) {
            const double v = bf16_to_f32(in.v[(kv * rows + j) * c.dv + x]);
            r.out[o + x] += p * v;
            r.spread[o + x] += p * std::abs(v);
          }
        }
        for (std::int64_t x = 0; x < c.dv; ++x) {
          r.out[o + x] /= z;
          r.spread[o + x] /= z;
        }
      }
  return r;
}

/// run_attention on `storage` (q, k, v and out as it stores them): the decode kernel
/// (decode_queries 0) or the fused (−1).
void run_as(const DecodeCase& c, DType storage, const void* q, const void* k, const void* v,
            const std::vector<std::uint8_t>& keep, void* out, int decode_queries) {
  AttentionSpec s;
  s.dk = c.dk;
  s.dv = c.dv;
  s.hq = c.hq;
  s.hkv = c.hkv;
  s.causal = c.causal;
  s.align = CausalAlign::bottom_right;
  s.key_padding = !c.visible_keys.empty();
  s.storage = storage;
  s.decode_queries = decode_queries;
  s.decode_chunk = c.decode_chunk;
  s.vector_floats = c.vector_floats;
  AttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.key_keep = keep.empty() ? nullptr : keep.data();
  a.batch = c.batch;
  a.len_q = c.len_q;
  a.len_k = c.len_k;
  a.kv_rows = c.kv_rows;
  codegen::cpu::run_attention(s, a, 2);
}

/// run_as on the bf16 inputs.
std::vector<std::uint16_t> run(const DecodeCase& c, const Inputs& in, int decode_queries) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(c.batch * c.hq * c.len_q * c.dv), kNanBits);
  run_as(c, DType::bf16, in.q.data(), in.k.data(), in.v.data(), in.keep, out.data(), decode_queries);
  return out;
}

double typical(const std::vector<double>& v) {
  double t = 0;
  for (double x : v) t += std::abs(x);
  return v.empty() ? 0.0 : t / static_cast<double>(v.size());
}

/// Entries of `got` (bf16 bits) off `want` by more than bound(i); the worst error / bound.
double check(const std::vector<std::uint16_t>& got, const std::vector<double>& want,
             const std::function<double(std::size_t)>& bound, const char* what) {
  double worst = 0;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(bf16_to_f32(got[i]) - want[i]);
    const double b = bound(i) + 1e-30;
    worst = std::max(worst, std::isnan(err) ? INFINITY : err / b);
    if (!(err <= b) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: " << bf16_to_f32(got[i]) << ", want " << want[i] << " (bound " << b
                    << ")";
  }
  EXPECT_EQ(bad, 0u) << what << ": entries out of tolerance";
  return worst;
}

class DecodeBf16 : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeBf16, RoundsOnlyTheOutputAndMatchesTheFusedKernel) {
  const DecodeCase& c = GetParam();
  const Inputs in = make_inputs(c);
  const Reference ref = reference(c, in);
  const double t = typical(ref.out);
  const std::vector<std::uint16_t> decode = run(c, in, 0), fused = run(c, in, -1);
  const double worst = check(
      decode, ref.out, [&](std::size_t i) { return kUnit * std::abs(ref.out[i]) + kRel * (std::abs(ref.out[i]) + t); },
      "decode vs fp64");
  RecordProperty("decode_error_over_bound", std::to_string(worst));
  // The fused kernel against fp64 (its own bound), and the two against each other: both bounds.
  auto fused_bound = [&](std::size_t i) {
    return 2 * kUnit * std::abs(ref.out[i]) + kUnit * ref.spread[i] + kRel * (std::abs(ref.out[i]) + t);
  };
  check(fused, ref.out, fused_bound, "fused vs fp64");
  std::vector<double> fused_values(fused.size());
  for (std::size_t i = 0; i < fused.size(); ++i) fused_values[i] = bf16_to_f32(fused[i]);
  check(
      decode, fused_values,
      [&](std::size_t i) { return fused_bound(i) + kUnit * std::abs(ref.out[i]) + kRel * (std::abs(ref.out[i]) + t); },
      "decode vs fused");
  // A row that sees no key is zeros (not NaN), exactly.
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    if (ref.spread[i] == 0 && ref.out[i] == 0) {
      EXPECT_EQ(decode[i], 0u) << i;
    }
  }
}

std::vector<DecodeCase> cases() {
  return {
      {.name = "gqa_8q_2kv_L1_S5000_d128_causal",
       .hq = 8,
       .hkv = 2,
       .len_q = 1,
       .len_k = 5000,
       .dk = 128,
       .dv = 128,
       .causal = true},
      {.name = "gqa_8q_2kv_L1_S5000_chunk_300",
       .hq = 8,
       .hkv = 2,
       .len_q = 1,
       .len_k = 5000,
       .dk = 128,
       .dv = 128,
       .decode_chunk = 300},
      {.name = "gqa_L3_causal_bottom_right",
       .batch = 2,
       .hq = 4,
       .hkv = 2,
       .len_q = 3,
       .len_k = 300,
       .dk = 64,
       .dv = 32,
       .causal = true,
       .decode_chunk = 64},
      {.name = "padding_L2_chunks_empty_row",
       .batch = 2,
       .hq = 2,
       .hkv = 1,
       .len_q = 2,
       .len_k = 100,
       .dk = 32,
       .dv = 48,
       .visible_keys = {0, 50},
       .decode_chunk = 7},
      {.name = "kv_cache_in_place_kv_rows_gt_S",
       .batch = 2,
       .hq = 8,
       .hkv = 2,
       .len_q = 1,
       .len_k = 1000,
       .dk = 128,
       .dv = 64,
       .causal = true,
       .kv_rows = 1100,
       .decode_chunk = 128},
      {.name = "kv_cache_in_place_L3_one_chunk",
       .batch = 1,
       .hq = 4,
       .hkv = 4,
       .len_q = 3,
       .len_k = 77,
       .dk = 64,
       .dv = 64,
       .causal = true,
       .kv_rows = 96},
      // Q·K on vdpbf16ps needs dk a multiple of 32 (and AVX512-BF16): these widen K as loaded.
      {.name = "dk_48_widened_keys",
       .batch = 2,
       .hq = 4,
       .hkv = 2,
       .len_q = 2,
       .len_k = 700,
       .dk = 48,
       .dv = 48,
       .causal = true,
       .kv_rows = 720,
       .decode_chunk = 256},
      {.name = "avx2_width_widened_keys",
       .hq = 8,
       .hkv = 2,
       .len_q = 1,
       .len_k = 2000,
       .dk = 64,
       .dv = 64,
       .decode_chunk = 300,
       .vector_floats = 8},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, DecodeBf16, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& p) { return p.param.name; });

// f16 storage: K and V widened as loaded (no pair products), the output rounded once — so within
// f16's unit roundoff (2^-11) of the f32 decode kernel on the same values, plus f32's error.
class DecodeF16 : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeF16, RoundsOnlyTheOutputOfTheF32KernelsSums) {
  const DecodeCase& c = GetParam();
  const Inputs in = make_inputs(c);
  // The same values as f16 bits (rounded from the bf16 ones; NaN stays NaN) and as f32.
  std::vector<std::uint16_t> h[3];
  std::vector<float> f[3];
  const std::vector<std::uint16_t>* from[] = {&in.q, &in.k, &in.v};
  for (int t = 0; t < 3; ++t)
    for (std::uint16_t x : *from[t]) {
      h[t].push_back(f32_to_f16(bf16_to_f32(x)));
      f[t].push_back(f16_to_f32(h[t].back()));
    }
  const std::size_t n = static_cast<std::size_t>(c.batch * c.hq * c.len_q * c.dv);
  std::vector<std::uint16_t> got(n, kNanBits);
  std::vector<float> want(n, std::numeric_limits<float>::quiet_NaN());
  run_as(c, DType::f16, h[0].data(), h[1].data(), h[2].data(), in.keep, got.data(), 0);
  run_as(c, DType::f32, f[0].data(), f[1].data(), f[2].data(), in.keep, want.data(), 0);
  std::vector<double> ref(want.begin(), want.end());
  const double t = typical(ref);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double err = std::abs(static_cast<double>(f16_to_f32(got[i])) - want[i]);
    const double bound = std::abs(want[i]) / 2048 + kRel * (std::abs(want[i]) + t);
    if (!(err <= bound) && bad++ < 5)
      ADD_FAILURE() << "[" << i << "]: " << f16_to_f32(got[i]) << ", want " << want[i] << " (bound " << bound << ")";
  }
  EXPECT_EQ(bad, 0u);
}

INSTANTIATE_TEST_SUITE_P(Cases, DecodeF16, ::testing::Values(cases()[2], cases()[3], cases()[4], cases()[7]),
                         [](const ::testing::TestParamInfo<DecodeCase>& p) { return p.param.name; });

}  // namespace
}  // namespace qkv
