// qkv against PyTorch: every fixture under tests/numerics/fixtures (made by make_fixtures.py
// with PyTorch 1.13) runs through the qkv::nn block that mirrors the PyTorch module, with the
// state dict imported by qkv's importer (the graphs: tests/support/cases.cpp, shared with the GPU
// tests) — on the reference interpreter and on the CPU backend (pass pipeline + compiled
// kernels), each checked on its own.
//
// Tolerance (the rule DESIGN.md pins, as FlashAttention's tests do): our fp32 error against
// PyTorch's fp64 re-run must be at most kMultiple times PyTorch's own fp32 error on the same
// case, with a floor of 2e-6 relative to the output's magnitude (PyTorch's error can be ~1e-8,
// below what two correct fp32 orders of summation agree on). Both errors are printed.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/io/npy.hpp>
#include <qkv/runtime/torch_import.hpp>

#include "../support/cases.hpp"

namespace qkv::nn {
namespace {

namespace fs = std::filesystem;
constexpr double kMultiple = 4.0;
constexpr double kFloor = 2e-6;

nlohmann::json config(const std::string& name) {
  std::ifstream in(fs::path(test::fixture_dir(name)) / "config.json");
  return nlohmann::json::parse(in);
}

/// max |ours - expected| over all elements, and max |expected|.
std::pair<double, double> max_error(const NdArray& ours, const NdArray& expected) {
  EXPECT_EQ(ours.shape, expected.shape);
  const auto a = ours.to_f32();
  const NdArray e64 = expected;
  double err = 0, mag = 0;
  const auto e = e64.as<double>();
  for (std::size_t i = 0; i < a.size() && i < e.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - e[i]));
    mag = std::max(mag, std::abs(e[i]));
  }
  return {err, mag};
}

void expect_close(const std::string& name, const NdArray& ours, const std::string& what, const std::string& backend) {
  const nlohmann::json cfg = config(name);
  const NdArray expected = read_npy(fs::path(test::fixture_dir(name)) / ("expected_" + what + "_f64.npy"));
  const auto [err, mag] = max_error(ours, expected);
  const double torch_err = cfg.at("torch_fp32_err_" + what);
  const double tol = std::max(kMultiple * torch_err, kFloor * std::max(1.0, mag));
  std::cout << "  " << name << " " << what << " (" << backend << "): qkv fp32 err " << err << ", PyTorch fp32 err "
            << torch_err << ", tolerance " << tol << "\n";
  ::testing::Test::RecordProperty(what + "_" + backend + "_err", std::to_string(err));
  ::testing::Test::RecordProperty(what + "_torch_err", std::to_string(torch_err));
  EXPECT_LE(err, tol) << what << " of " << name << " on " << backend;
}

/// Every output the case's graph has ("out", and "weights" for the attention modules), on both backends.
void check_both_backends(const std::string& name, const Graph& g, const Feeds& feeds) {
  const RunResult ref = interpret(g, feeds), cpu = codegen::cpu::run(g, feeds);
  ASSERT_FALSE(ref.outputs.empty());
  for (const auto& [what, value] : ref.outputs) {
    expect_close(name, value, what, "reference");
    expect_close(name, cpu.outputs.at(what), what, "cpu");
  }
}

class Fixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(Fixtures, MatchPyTorchOnBothBackends) {
  const test::Case c = test::fixture_case(GetParam());
  check_both_backends(c.name, c.graph, c.feeds);
}

INSTANTIATE_TEST_SUITE_P(All, Fixtures, ::testing::ValuesIn(test::fixture_names()),
                         [](const auto& i) { return i.param; });

TEST(FixtureSet, HasEveryKind) {
  // The fixtures the generator makes; a missing one would silently shrink the suite above.
  const auto names = test::fixture_names();
  for (const char* want : {"seed_tutorial", "e512_h8", "causal", "key_padding", "float_mask", "mask_3d",
                           "cross_kdim_vdim", "cross_bias_kv_zero_attn", "no_bias", "add_bias_kv", "add_zero_attn",
                           "fully_masked_rows", "encoder_relu_post", "encoder_gelu_pre", "encoder_relu_post_padding"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  // The tutorials' experiment: hand-written attention copied into nn.MultiheadAttention agrees.
  std::cout << "  hand-written vs nn.MultiheadAttention (PyTorch): max diff "
            << config("seed_tutorial").at("max_abs_diff_hand_vs_torch").get<double>() << "\n";
}

TEST(FixtureSet, KeyPaddingWithSizesFromTheStateDict) {
  // The CLI's form: d_model bound from the weights at run time, the head count given when the
  // graph is built.
  const test::Case c = test::fixture_case("key_padding");
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<dyn>>>(g, "query");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  auto [out, w] = MultiHeadAttention<dyn, dyn>::make(g, "", true, /*num_heads=*/4)(x, keep);
  output(out, "out");
  output(w, "weights");
  check_both_backends("key_padding", g, c.feeds);
}

}  // namespace
}  // namespace qkv::nn
