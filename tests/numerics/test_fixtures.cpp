// qkv against PyTorch: every fixture under tests/numerics/fixtures (made by make_fixtures.py
// with PyTorch 1.13) runs through the qkv::nn block that mirrors the PyTorch module, with the
// state dict imported by qkv's importer — on the reference interpreter and on the CPU backend
// (pass pipeline + JIT-compiled fused attention kernel), each checked on its own.
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

namespace qkv::nn {
namespace {

namespace fs = std::filesystem;
constexpr double kMultiple = 4.0;
constexpr double kFloor = 2e-6;

struct Fixture {
  fs::path dir;
  nlohmann::json cfg;
  Feeds feeds;
};

/// PyTorch's masks say true = ignore; qkv's keep-masks say true = may attend.
NdArray inverted(NdArray m) {
  for (bool& b : m.as<bool>()) b = !b;
  return m;
}

Fixture load(const std::string& name) {
  Fixture f;
  f.dir = fs::path(QKV_FIXTURES_DIR) / name;
  std::ifstream in(f.dir / "config.json");
  f.cfg = nlohmann::json::parse(in);
  const auto sd = SafetensorsFile::open(f.dir / "weights.safetensors");
  const std::int64_t heads = f.cfg.at("num_heads");
  if (f.cfg.at("module") == "mha") {
    f.feeds = import_mha(sd, infer_mha_config(sd, heads));
  } else {
    f.feeds = import_encoder_layer(sd, infer_encoder_layer_config(sd, heads));
  }
  for (const std::string input : f.cfg.at("inputs")) {
    NdArray a = read_npy(f.dir / (input + ".npy"));
    if (input == "key_padding_mask" || input == "src_key_padding_mask") {
      f.feeds["keep"] = inverted(std::move(a));
    } else if (input == "attn_mask" && a.dtype == DType::boolean) {
      if (a.shape.size() == 3) {  // [B*H, L, S] -> [B, H, L, S]: PyTorch's row order is b*H + h
        const std::int64_t h = heads;
        a.shape = {a.shape[0] / h, h, a.shape[1], a.shape[2]};
      }
      f.feeds["attn_keep"] = inverted(std::move(a));
    } else if (input == "attn_mask") {
      f.feeds["attn_bias"] = std::move(a);
    } else {
      f.feeds[input] = std::move(a);
    }
  }
  return f;
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

void expect_close(const Fixture& f, const NdArray& ours, const std::string& what, const std::string& backend) {
  const NdArray expected = read_npy(f.dir / ("expected_" + what + "_f64.npy"));
  const auto [err, mag] = max_error(ours, expected);
  const double torch_err = f.cfg.at("torch_fp32_err_" + what);
  const double tol = std::max(kMultiple * torch_err, kFloor * std::max(1.0, mag));
  std::cout << "  " << f.cfg.at("name").get<std::string>() << " " << what << " (" << backend << "): qkv fp32 err "
            << err << ", PyTorch fp32 err " << torch_err << ", tolerance " << tol << "\n";
  ::testing::Test::RecordProperty(what + "_" + backend + "_err", std::to_string(err));
  ::testing::Test::RecordProperty(what + "_torch_err", std::to_string(torch_err));
  EXPECT_LE(err, tol) << what << " of " << f.cfg.at("name") << " on " << backend;
}

template <class Out, class Weights>
void run_and_check(const Fixture& f, Graph& g, const Out& out, const Weights& weights) {
  output(out, "out");
  output(weights, "weights");
  const RunResult r = interpret(g, f.feeds);
  expect_close(f, r.outputs.at("out"), "out", "reference");
  expect_close(f, r.outputs.at("weights"), "weights", "reference");
  const RunResult c = codegen::cpu::run(g, f.feeds);
  expect_close(f, c.outputs.at("out"), "out", "cpu");
  expect_close(f, c.outputs.at("weights"), "weights", "cpu");
}

template <int E>
auto query(Graph& g) {
  return input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<E>>>(g, "query");
}

TEST(Fixtures, SeedTutorial) {
  const Fixture f = load("seed_tutorial");
  // The tutorials' experiment: hand-written attention copied into nn.MultiheadAttention agrees.
  std::cout << "  hand-written vs nn.MultiheadAttention (PyTorch): max diff "
            << f.cfg.at("max_abs_diff_hand_vs_torch").get<double>() << "\n";
  Graph g;
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  auto [out, w] = MultiHeadAttention<16, 1>::make(g)(query<16>(g), keep);
  run_and_check(f, g, out, w);
}

TEST(Fixtures, E512H8) {
  const Fixture f = load("e512_h8");
  Graph g;
  auto [out, w] = MultiHeadAttention<512, 8>::make(g)(query<512>(g));
  run_and_check(f, g, out, w);
}

TEST(Fixtures, CausalMatchesPyTorchsTriangularMask) {
  Fixture f = load("causal");
  f.feeds.erase("attn_keep");  // qkv's own causal op stands in for the explicit triangle
  Graph g;
  auto [out, w] = MultiHeadAttention<32, 4>::make(g)(query<32>(g), causal_mask);
  run_and_check(f, g, out, w);
}

TEST(Fixtures, KeyPadding) {
  const Fixture f = load("key_padding");
  Graph g;
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  auto [out, w] = MultiHeadAttention<32, 4>::make(g)(query<32>(g), keep);
  run_and_check(f, g, out, w);
}

TEST(Fixtures, KeyPaddingWithSizesFromTheStateDict) {
  // The CLI's form: d_model bound from the weights at run time, the head count given when the
  // graph is built.
  const Fixture f = load("key_padding");
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<dyn>>>(g, "query");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  auto [out, w] = MultiHeadAttention<dyn, dyn>::make(g, "", true, /*num_heads=*/4)(x, keep);
  run_and_check(f, g, out, w);
}

TEST(Fixtures, FloatAttnMask) {
  const Fixture f = load("float_mask");
  Graph g;
  auto bias = input<Tensor<f32, Seq<dyn>, Key<dyn>>>(g, "attn_bias");
  auto [out, w] = MultiHeadAttention<32, 4>::make(g)(query<32>(g), bias);
  run_and_check(f, g, out, w);
}

TEST(Fixtures, PerHeadAttnMask) {
  const Fixture f = load("mask_3d");
  Graph g;
  auto keep = input<KeepMask<Batch<dyn>, Heads<4>, Seq<dyn>, Key<dyn>>>(g, "attn_keep");
  auto [out, w] = MultiHeadAttention<32, 4>::make(g)(query<32>(g), keep);
  run_and_check(f, g, out, w);
}

TEST(Fixtures, CrossAttentionWithKdimVdim) {
  const Fixture f = load("cross_kdim_vdim");
  Graph g;
  auto key = input<Tensor<f32, Batch<dyn>, Mem<dyn>, Hidden<20>>>(g, "key");
  auto value = input<Tensor<f32, Batch<dyn>, Mem<dyn>, ValueDim<12>>>(g, "value");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  auto [out, w] = CrossAttention<32, 4, 20, 12>::make(g)(query<32>(g), key, value, keep);
  run_and_check(f, g, out, w);
}

TEST(Fixtures, NoBias) {
  const Fixture f = load("no_bias");
  Graph g;
  auto [out, w] = MultiHeadAttention<32, 4>::make(g, "", /*bias=*/false)(query<32>(g));
  run_and_check(f, g, out, w);
}

TEST(Fixtures, AddBiasKV) {
  const Fixture f = load("add_bias_kv");
  Graph g;
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  auto [out, w] = MultiHeadAttention<32, 4, MhaOptions{.add_bias_kv = true}>::make(g)(query<32>(g), keep);
  run_and_check(f, g, out, w);
}

TEST(Fixtures, AddZeroAttn) {
  const Fixture f = load("add_zero_attn");
  Graph g;
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  auto [out, w] = MultiHeadAttention<32, 4, MhaOptions{.add_zero_attn = true}>::make(g)(query<32>(g), keep);
  run_and_check(f, g, out, w);
}

TEST(Fixtures, FullyMaskedRowsGiveZeroWeightsAndBiasOutput) {
  const Fixture f = load("fully_masked_rows");
  Graph g;
  auto keep = input<AttnMask<Seq<dyn>, Key<dyn>>>(g, "attn_keep");
  auto [out, w] = MultiHeadAttention<32, 4>::make(g)(query<32>(g), keep);
  run_and_check(f, g, out, w);
}

template <Activation Act>
void encoder_case(const std::string& name, NormPlacement placement, bool padding) {
  const Fixture f = load(name);
  Graph g;
  auto src = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<32>>>(g, "src");
  auto layer = EncoderLayer<32, 4, 64, Act>::make(g, "", placement, f.cfg.at("layer_norm_eps").get<double>());
  if (padding)
    output(layer(src, input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep")), "out");
  else
    output(layer(src), "out");
  expect_close(f, interpret(g, f.feeds).outputs.at("out"), "out", "reference");
  expect_close(f, codegen::cpu::run(g, f.feeds).outputs.at("out"), "out", "cpu");
}

TEST(Fixtures, EncoderReluPostNorm) { encoder_case<Activation::relu>("encoder_relu_post", NormPlacement::post, false); }
TEST(Fixtures, EncoderGeluPreNorm) { encoder_case<Activation::gelu>("encoder_gelu_pre", NormPlacement::pre, false); }
TEST(Fixtures, EncoderReluPostNormPadding) {
  encoder_case<Activation::relu>("encoder_relu_post_padding", NormPlacement::post, true);
}

}  // namespace
}  // namespace qkv::nn
