// The fused CPU attention kernels on long rows, against fp64, within 2 × PyTorch fp32's own error
// on the same inputs (the rule, FlashAttention's for fp32). PyTorch's errors are in
// long_rows/torch_errors.json, written by make_long_rows.py, which builds the same inputs.
//
// What this guards: the sum of p·v over random values is a random walk much larger than its
// mean; accumulated key by key in fp32 it cost ~1e-7 absolute however long the row, so the
// error relative to the (shrinking) outputs grew with S (7.6 × PyTorch's at S = 20 000). The
// kernels sum each tile of keys from zero and add one term per tile.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <qkv/codegen/cpu/run_attention.hpp>

namespace qkv {
namespace {

using codegen::cpu::AttentionArgs;
using codegen::cpu::AttentionSpec;

struct LongRow {
  const char* name;
  int L, S, D, hq, hkv;
};
// Keep in step with CASES in make_long_rows.py (the index seeds the inputs).
constexpr LongRow kCases[] = {
    {"L16_S512_D32", 16, 512, 32, 1, 1},
    {"L16_S8192_D32", 16, 8192, 32, 1, 1},
    {"L16_S65536_D32", 16, 65536, 32, 1, 1},
    {"L16_S131072_D64_gqa2", 16, 131072, 64, 2, 1},
    {"L16_S20000_D128_gqa4x2", 16, 20000, 128, 4, 2},
    {"L1_S131072_D64_gqa6x3", 1, 131072, 64, 6, 3},
    {"L1_S131072_D128", 1, 131072, 128, 4, 4},
};

/// make_long_rows.py's uniform(): splitmix64 of seed·1000003 + i, its top 24 bits in [-1, 1).
std::vector<float> uniform(std::size_t count, std::uint64_t seed) {
  std::vector<float> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t x = seed * 1000003ull + i + 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    out[i] = static_cast<float>(static_cast<double>(x >> 40) / 16777216.0 * 2.0 - 1.0);
  }
  return out;
}

nlohmann::json torch_errors() {
  std::ifstream in(std::string(QKV_NUMERICS_DIR) + "/long_rows/torch_errors.json");
  return nlohmann::json::parse(in).at("cases");
}

class LongRows : public ::testing::TestWithParam<int> {};

TEST_P(LongRows, FusedKernelsStayWithinTwicePyTorchsFp32Error) {
  const int index = GetParam();
  const LongRow& c = kCases[index];
  const double torch_error = torch_errors().at(c.name).at("torch_fp32_max_abs_error").get<double>();
  const std::uint64_t base = 10 * static_cast<std::uint64_t>(index + 1);
  std::vector<float> q = uniform(static_cast<std::size_t>(c.hq) * c.L * c.D, base + 1);
  for (float& x : q) x *= 3.0f;
  const std::vector<float> k = uniform(static_cast<std::size_t>(c.hkv) * c.S * c.D, base + 2);
  const std::vector<float> v = uniform(static_cast<std::size_t>(c.hkv) * c.S * c.D, base + 3);

  // fp64: softmax(q·kᵀ / sqrt(D)) · v, max-subtracted.
  std::vector<double> ref(q.size());
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  std::vector<double> s(static_cast<std::size_t>(c.S));
  for (int h = 0; h < c.hq; ++h) {
    const std::size_t g = static_cast<std::size_t>(h / (c.hq / c.hkv));
    for (int i = 0; i < c.L; ++i) {
      const float* qi = &q[(static_cast<std::size_t>(h) * c.L + i) * c.D];
      double m = -INFINITY;
      for (int j = 0; j < c.S; ++j) {
        const float* kj = &k[(g * c.S + j) * c.D];
        double d = 0;
        for (int x = 0; x < c.D; ++x) d += static_cast<double>(qi[x]) * kj[x];
        s[j] = d * scale;
        m = std::max(m, s[j]);
      }
      double z = 0;
      std::vector<double> o(static_cast<std::size_t>(c.D), 0.0);
      for (int j = 0; j < c.S; ++j) {
        const double p = std::exp(s[j] - m);
        z += p;
        const float* vj = &v[(g * c.S + j) * c.D];
        for (int x = 0; x < c.D; ++x) o[x] += p * vj[x];
      }
      for (int x = 0; x < c.D; ++x) ref[(static_cast<std::size_t>(h) * c.L + i) * c.D + x] = o[x] / z;
    }
  }

  // The fused kernel (forced), and the split-KV decode kernel where it runs (L <= 4).
  for (int decode : {-1, 0}) {
    if (decode == 0 && c.L > 4) continue;
    AttentionSpec spec;
    spec.dk = spec.dv = c.D;
    spec.hq = c.hq;
    spec.hkv = c.hkv;
    spec.decode_queries = decode;
    std::vector<float> out(q.size(), NAN);
    AttentionArgs a;
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.out = out.data();
    a.batch = 1;
    a.len_q = c.L;
    a.len_k = c.S;
    codegen::cpu::run_attention(spec, a, 2);
    double err = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      const double e = std::abs(out[i] - ref[i]);
      err = std::isnan(e) ? INFINITY : std::max(err, e);
    }
    RecordProperty(std::string(decode < 0 ? "fused" : "decode") + "_over_torch", std::to_string(err / torch_error));
    EXPECT_LE(err, 2.0 * torch_error) << c.name << (decode < 0 ? " fused" : " split-KV decode") << ": error " << err
                                      << " = " << err / torch_error << " x PyTorch fp32's " << torch_error;
  }
}

INSTANTIATE_TEST_SUITE_P(All, LongRows, ::testing::Range(0, static_cast<int>(std::size(kCases))),
                         [](const ::testing::TestParamInfo<int>& p) { return std::string(kCases[p.param].name); });

}  // namespace
}  // namespace qkv
