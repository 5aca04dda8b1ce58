// The qkv CLI end to end: happy paths on the PyTorch fixtures, and every kind of bad input —
// exit code 2 for usage errors, 1 for files and their contents, a one-line message, and no
// output file left behind.
#include "cli_test.hpp"

#include <cmath>

#include <qkv/runtime/cuda.hpp>

using ::testing::HasSubstr;
using ::testing::Not;

namespace qkv {
namespace {

using namespace qkv::test;

TEST_F(Cli, RunMhaMatchesEveryPyTorchFixtureOnBothBackends) {
  for (const std::string backend : {"cpu", "reference"}) {
    for (const char* name :
         {"seed_tutorial", "e512_h8", "causal", "key_padding", "float_mask", "mask_3d", "cross_kdim_vdim",
          "cross_bias_kv_zero_attn", "no_bias", "add_bias_kv", "add_zero_attn", "fully_masked_rows"}) {
      const auto c = config(name);
      const Result r = run("run mha " + mha_flags(c, name) + " --out " + tmp("o.npy") + " --weights-out " +
                           tmp("w.npy") + " --per-head-weights --backend " + backend);
      ASSERT_EQ(r.code, 0) << name << " on " << backend << ": " << r.err;
      const double tol = std::max(4.0 * c.at("torch_fp32_err_out").get<double>(), 1e-5);
      EXPECT_LE(error(tmp("o.npy"), fixture(name, "expected_out_f64.npy")), tol) << name << " on " << backend;
      EXPECT_LE(error(tmp("w.npy"), fixture(name, "expected_weights_f64.npy")), 1e-5) << name << " on " << backend;
    }
  }
}

TEST_F(Cli, RunMhaReadsABf16StateDictAsItIsUnderDtypeBf16) {
  // The key_padding fixture's state dict and query as PyTorch writes them after
  // model.to(torch.bfloat16) (each value rounded to nearest even).
  const std::string name = "key_padding";
  const auto c = config(name);
  const SafetensorsFile f = SafetensorsFile::open(fixture(name, "weights.safetensors"));
  std::map<std::string, NdArray> bf16;
  for (const auto& n : f.names()) bf16[n] = f.load(n).converted(DType::bf16);
  write_safetensors(tmp("bf16.safetensors"), bf16);
  write_npy(tmp("query_bf16.npy"), read_npy(fixture(name, "query.npy")).converted(DType::bf16));
  const std::string flags = "run mha --weights " + tmp("bf16.safetensors") + " --heads " +
                            std::to_string(c.at("num_heads").get<int>()) + " --key-padding-mask " +
                            fixture(name, "key_padding_mask.npy") + " -o " + tmp("o.npy");
  // Rounding the weights and the query to bf16 moves the output by about 1 % of its size; the
  // bf16 run also rounds every value it makes.
  const double tol = 5e-2;
  for (const std::string backend : {"cpu", "reference"}) {
    // As stored: nothing converted, the output bf16.
    Result r = run(flags + " --query " + tmp("query_bf16.npy") + " --dtype bf16 --backend " + backend);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("converted on load"))) << backend;
    EXPECT_EQ(read_npy(tmp("o.npy")).dtype, DType::bf16);
    EXPECT_LE(error(tmp("o.npy"), fixture(name, "expected_out_f64.npy")), tol) << backend;
    // An f32 query under --dtype bf16: converted, and named.
    r = run(flags + " --query " + fixture(name, "query.npy") + " --dtype bf16 --backend " + backend);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("qkv: note: the model computes in bf16 (--dtype bf16); converted on load: 1 stored "
                                 "as f32 (query)"));
    // The default f32: the bf16 weights widened (exactly), named, and an f32 output.
    r = run(flags + " --query " + tmp("query_bf16.npy") + " --backend " + backend);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("the model computes in f32 (--dtype f32); converted on load: "));
    EXPECT_THAT(r.err, HasSubstr("5 stored as bf16 ("));  // the 4 weights and the query
    EXPECT_EQ(read_npy(tmp("o.npy")).dtype, DType::f32);
    EXPECT_LE(error(tmp("o.npy"), fixture(name, "expected_out_f64.npy")), tol) << backend;
  }
  EXPECT_EQ(run(flags + " --query " + tmp("query_bf16.npy") + " --dtype f64").code, 2);  // not a model dtype
}

TEST_F(Cli, RunMhaAveragesWeightsOverHeadsByDefault) {
  const auto c = config("key_padding");
  ASSERT_EQ(
      run("run mha " + mha_flags(c, "key_padding") + " -o " + tmp("o.npy") + " --weights-out " + tmp("w.npy")).code, 0);
  const NdArray w = read_npy(tmp("w.npy"));
  EXPECT_EQ(w.shape, (std::vector<std::int64_t>{3, 6, 6}));
  NdArray per_head = read_npy(fixture("key_padding", "expected_weights_f64.npy"));
  const auto e = mean_over_axis(NdArray::from_f32(per_head.to_f32(), per_head.shape), 1).to_f32();
  const auto got = w.to_f32();
  for (std::size_t i = 0; i < e.size(); ++i) EXPECT_NEAR(got[i], e[i], 1e-5);
}

TEST_F(Cli, RunMhaCausalFlagEqualsTheExplicitTriangle) {
  const std::string base = "run mha --weights " + fixture("causal", "weights.safetensors") + " --query " +
                           fixture("causal", "query.npy") + " --heads 4";
  ASSERT_EQ(run(base + " --causal -o " + tmp("o.npy")).code, 0);
  EXPECT_LE(error(tmp("o.npy"), fixture("causal", "expected_out_f64.npy")), 1e-5);
}

TEST_F(Cli, RunEncoderLayerMatchesFixtures) {
  for (const char* name : {"encoder_relu_post", "encoder_gelu_pre", "encoder_relu_post_padding"}) {
    const auto c = config(name);
    std::string flags = "run encoder-layer --weights " + fixture(name, "weights.safetensors") + " --src " +
                        fixture(name, "src.npy") + " --heads 4 --activation " + c.at("activation").get<std::string>();
    if (c.at("norm_first").get<bool>()) flags += " --norm-first";
    if (fs::exists(fixture(name, "src_key_padding_mask.npy")))
      flags += " --src-key-padding-mask " + fixture(name, "src_key_padding_mask.npy");
    const Result r = run(flags + " -o " + tmp("o.npy"));
    ASSERT_EQ(r.code, 0) << name << ": " << r.err;
    EXPECT_LE(error(tmp("o.npy"), fixture(name, "expected_out_f64.npy")), 2e-5) << name;
  }
}

TEST_F(Cli, RunEncoderStackFindsItsLayers) {
  // A one-layer nn.TransformerEncoder: the layer's keys under layers.0.
  const auto sd = SafetensorsFile::open(fixture("encoder_relu_post", "weights.safetensors"));
  std::map<std::string, NdArray> stack;
  for (const auto& k : sd.names()) stack["layers.0." + k] = sd.load(k);
  write_safetensors(tmp("stack.safetensors"), stack);
  const Result r = run("run encoder --weights " + tmp("stack.safetensors") + " --src " +
                       fixture("encoder_relu_post", "src.npy") + " --heads 4 -o " + tmp("o.npy"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_LE(error(tmp("o.npy"), fixture("encoder_relu_post", "expected_out_f64.npy")), 2e-5);
}

/// Entry b of the leading axis of a (a batch element), without that axis.
NdArray batch_element(const NdArray& a, std::int64_t b) {
  NdArray e = a;
  e.shape.erase(e.shape.begin());
  const std::size_t n = e.bytes.size() / static_cast<std::size_t>(a.shape[0]);
  e.bytes.assign(a.bytes.begin() + static_cast<std::ptrdiff_t>(n * static_cast<std::size_t>(b)),
                 a.bytes.begin() + static_cast<std::ptrdiff_t>(n * static_cast<std::size_t>(b + 1)));
  return e;
}

TEST_F(Cli, UnbatchedInputsGiveUnbatchedOutputsAsInPyTorch) {
  // PyTorch's unbatched call ([L, E] query, [S] key padding mask) is its batched call on a batch
  // of one: each batch element of a fixture, run alone, gives that element of the expected output.
  struct Run {
    std::string name, command;
    std::vector<std::pair<std::string, std::string>> inputs;  // file -> flag
  };
  const std::vector<Run> runs = {
      {"key_padding", "run mha --heads 4", {{"query", "--query"}, {"key_padding_mask", "--key-padding-mask"}}},
      {"cross_kdim_vdim",
       "run mha --heads 4",
       {{"query", "--query"}, {"key", "--key"}, {"value", "--value"}, {"key_padding_mask", "--key-padding-mask"}}},
      {"encoder_relu_post_padding",
       "run encoder-layer --heads 4",
       {{"src", "--src"}, {"src_key_padding_mask", "--src-key-padding-mask"}}}};
  for (const auto& [name, command, inputs] : runs) {
    const NdArray expected = read_npy(fixture(name, "expected_out_f64.npy"));
    for (std::int64_t b = 0; b < expected.shape[0]; ++b) {
      std::string flags = command + " --weights " + fixture(name, "weights.safetensors") + " -o " + tmp("o.npy");
      for (const auto& [file, flag] : inputs) {
        write_npy(tmp(file + ".npy"), batch_element(read_npy(fixture(name, file + ".npy")), b));
        flags += " " + flag + " " + tmp(file + ".npy");
      }
      const Result r = run(flags);
      ASSERT_EQ(r.code, 0) << name << " element " << b << ": " << r.err;
      write_npy(tmp("e.npy"), batch_element(expected, b));
      EXPECT_LE(error(tmp("o.npy"), tmp("e.npy")), 2e-5) << name << " element " << b;
    }
  }
  // The masks keep their unbatched shapes too.
  write_npy(tmp("kpm.npy"), read_npy(fixture("key_padding", "key_padding_mask.npy")));
  const Result r = run("run mha --heads 4 --weights " + fixture("key_padding", "weights.safetensors") + " --query " +
                       tmp("query.npy") + " --key-padding-mask " + tmp("kpm.npy") + " -o " + tmp("o.npy"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--key-padding-mask: shape (3, 6) must be [S] for an unbatched query"));
}

TEST_F(Cli, RunEncoderLayerWithoutBiasesIsPyTorchsBiasFalse) {
  // TransformerEncoderLayer(bias=False) (PyTorch 2.1 on) stores no bias at all — no Linear, no
  // attention and no LayerNorm bias: the function of zero biases.
  const auto sd = SafetensorsFile::open(fixture("encoder_relu_post", "weights.safetensors"));
  std::map<std::string, NdArray> none, zero;
  for (const auto& k : sd.names()) {
    NdArray w = sd.load(k);
    if (k.ends_with("bias")) {
      zero[k] = NdArray::zeros(DType::f32, w.shape);
    } else {
      none[k] = w;
      zero[k] = w;
    }
  }
  write_safetensors(tmp("none.safetensors"), none);
  write_safetensors(tmp("zero.safetensors"), zero);
  const std::string base = "run encoder-layer --heads 4 --src " + fixture("encoder_relu_post", "src.npy");
  ASSERT_EQ(run(base + " --weights " + tmp("none.safetensors") + " -o " + tmp("none.npy")).code, 0);
  ASSERT_EQ(run(base + " --weights " + tmp("zero.safetensors") + " -o " + tmp("zero.npy")).code, 0);
  EXPECT_EQ(read_npy(tmp("none.npy")), read_npy(tmp("zero.npy")));
  // The biases matter (so the comparison above could fail), and one missing of six is refused.
  EXPECT_GT(error(tmp("none.npy"), fixture("encoder_relu_post", "expected_out_f64.npy")), 1e-3);
  std::map<std::string, NdArray> partial = none;
  partial["linear1.bias"] = sd.load("linear1.bias");
  write_safetensors(tmp("partial.safetensors"), partial);
  const Result r = run(base + " --weights " + tmp("partial.safetensors") + " -o " + tmp("p.npy"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("makes every bias or none"));
}

TEST_F(Cli, RunMhaTakesStaticKeysAndValuesAsPyTorchDoes) {
  // static_k / static_v are keys / values already projected, [B*H, S, head_dim]: the key_padding
  // fixture's own projections (made here from its weights) give its expected output.
  const std::string name = "key_padding";
  const auto sd = SafetensorsFile::open(fixture(name, "weights.safetensors"));
  const NdArray query = read_npy(fixture(name, "query.npy"));
  const std::int64_t B = query.shape[0], S = query.shape[1], E = query.shape[2], H = 4, D = E / H;
  const auto w = sd.load("in_proj_weight").to_f32(), bias = sd.load("in_proj_bias").to_f32(), x = query.to_f32();
  auto heads = [&](std::int64_t part) {  // 1: keys, 2: values
    std::vector<float> out(static_cast<std::size_t>(B * H * S * D));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t j = 0; j < E; ++j) {
          double acc = bias[static_cast<std::size_t>(part * E + j)];
          for (std::int64_t i = 0; i < E; ++i)
            acc += static_cast<double>(w[static_cast<std::size_t>((part * E + j) * E + i)]) *
                   x[static_cast<std::size_t>((b * S + s) * E + i)];
          out[static_cast<std::size_t>(((b * H + j / D) * S + s) * D + j % D)] = static_cast<float>(acc);
        }
    return NdArray::from_f32(out, {B * H, S, D});
  };
  write_npy(tmp("k.npy"), heads(1));
  write_npy(tmp("v.npy"), heads(2));
  const std::string base = "run mha " + mha_flags(config(name), name) + " -o " + tmp("o.npy");
  for (const std::string& given : {" --static-k " + tmp("k.npy") + " --static-v " + tmp("v.npy"),
                                   " --static-k " + tmp("k.npy"), " --static-v " + tmp("v.npy")}) {
    const Result r = run(base + given);
    ASSERT_EQ(r.code, 0) << given << ": " << r.err;
    EXPECT_LE(error(tmp("o.npy"), fixture(name, "expected_out_f64.npy")), 2e-5) << given;
  }
  // Zero values: every output row is out_proj.bias (the values are really the static ones).
  write_npy(tmp("v0.npy"), NdArray::zeros(DType::f32, {B * H, S, D}));
  ASSERT_EQ(run(base + " --static-v " + tmp("v0.npy")).code, 0);
  const auto out = read_npy(tmp("o.npy")).to_f32(), ob = sd.load("out_proj.bias").to_f32();
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ob[i % ob.size()], 1e-6) << i;
  // Shapes and the refused combination.
  write_npy(tmp("bad.npy"), NdArray::zeros(DType::f32, {B, S, D}));
  Result r = run(base + " --static-k " + tmp("bad.npy"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("--static-k: shape (3, 6, 8) must be [batch*heads, S, head_dim] = [12, S, 8]"));
  r = run("run mha " + mha_flags(config("add_bias_kv"), "add_bias_kv") + " -o " + tmp("o.npy") + " --static-k " +
          tmp("k.npy"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("PyTorch refuses them together"));
}

/// Every d<name>.npy of a gradient fixture (tests/numerics/make_grad_fixtures.py) against what
/// qkv grad wrote to `dir`, each within the fixture's tolerance; `dir` holds nothing else.
void expect_gradients(const std::string& name, const fs::path& dir) {
  const fs::path want = fs::path(QKV_FIXTURES_DIR).parent_path() / "grad_fixtures" / name;
  std::ifstream in(want / "case.json");
  const auto tol = nlohmann::json::parse(in).at("tol");
  std::size_t n = 0;
  for (const auto& [param, t] : tol.items()) {
    const fs::path got = dir / ("d" + param + ".npy");
    ASSERT_TRUE(fs::exists(got)) << name << ": no " << got.filename();
    const NdArray a = read_npy(got), e = read_npy(want / ("d" + param + ".npy"));
    ASSERT_EQ(a.shape, e.shape) << name << ": d" << param;
    const auto av = a.to_f32();
    const auto ev = e.as<double>();
    double err = 0;
    for (std::size_t i = 0; i < av.size(); ++i) err = std::max(err, std::abs(av[i] - ev[i]));
    EXPECT_LE(err, t.get<double>()) << name << ": d" << param;
    ++n;
  }
  EXPECT_EQ(static_cast<std::size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator{})), n) << name;
}

TEST_F(Cli, GradMatchesPyTorchAutogradOnEveryInputAndWeight) {
  // Every case on the reference backend; on the CPU (whose backward graphs take seconds to
  // compile) the encoder layers and sdpa, and the backends agree with each other on the rest by
  // numerics/test_grad.cpp.
  const fs::path grads = fs::path(QKV_FIXTURES_DIR).parent_path() / "grad_fixtures";
  for (const std::string backend : {"reference", "cpu"}) {
    for (const char* name : {"key_padding", "causal", "cross_kdim_vdim", "add_bias_kv"}) {
      if (backend == "cpu") continue;
      const Result r = run("grad mha " + mha_flags(config(name), name) + " --grad-output " +
                           (grads / name / "grad_output.npy").string() + " --grads-out " + tmp(backend + name) +
                           " --backend " + backend);
      ASSERT_EQ(r.code, 0) << name << " on " << backend << ": " << r.err;
      expect_gradients(name, tmp(backend + name));
    }
    for (const char* name : {"encoder_relu_post_padding", "encoder_gelu_pre"}) {
      if (backend == "cpu" && name == std::string("encoder_relu_post_padding")) continue;
      const auto c = config(name);
      std::string flags = "grad encoder-layer --weights " + fixture(name, "weights.safetensors") + " --src " +
                          fixture(name, "src.npy") + " --heads 4 --activation " + c.at("activation").get<std::string>();
      if (c.at("norm_first").get<bool>()) flags += " --norm-first";
      if (fs::exists(fixture(name, "src_key_padding_mask.npy")))
        flags += " --src-key-padding-mask " + fixture(name, "src_key_padding_mask.npy");
      const Result r = run(flags + " --grad-output " + (grads / name / "grad_output.npy").string() + " --grads-out " +
                           tmp(backend + name) + " --backend " + backend + " -o " + tmp(backend + name + ".npy"));
      ASSERT_EQ(r.code, 0) << name << " on " << backend << ": " << r.err;
      expect_gradients(name, tmp(backend + name));
      // --out: the forward output beside.
      EXPECT_LE(error(tmp(backend + name + ".npy"), fixture(name, "expected_out_f64.npy")), 2e-5) << name;
    }
    // The captured tensors' gradients: a float bias and ALiBi slopes.
    const fs::path s = grads / "sdpa_bias_alibi";
    const Result r =
        run("grad sdpa --query " + (s / "query.npy").string() + " --key " + (s / "key.npy").string() + " --value " +
            (s / "value.npy").string() + " --attn-bias " + (s / "attn_bias.npy").string() + " --alibi-slopes " +
            (s / "alibi_slopes.npy").string() + " --align top-left --grad-output " + (s / "grad_output.npy").string() +
            " --grads-out " + tmp(backend + "sdpa") + " --backend " + backend);
    ASSERT_EQ(r.code, 0) << "sdpa on " << backend << ": " << r.err;
    expect_gradients("sdpa_bias_alibi", tmp(backend + "sdpa"));
  }
}

TEST_F(Cli, GradProblemsAreOneLine) {
  const fs::path grads = fs::path(QKV_FIXTURES_DIR).parent_path() / "grad_fixtures";
  const std::string base = "grad mha " + mha_flags(config("key_padding"), "key_padding");
  // dO of the wrong shape; no --grads-out; the gradients' folder a file.
  write_npy(tmp("do.npy"), NdArray::zeros(DType::f32, {3, 6, 31}));
  Result r = run(base + " --grad-output " + tmp("do.npy") + " --grads-out " + tmp("g"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("--grad-output: shape (3, 6, 31) must be the output's (3, 6, 32)"));
  expect_one_line_error(r);
  EXPECT_FALSE(fs::exists(tmp("g")));
  r = run(base + " --grad-output " + (grads / "key_padding" / "grad_output.npy").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--grads-out is required"));
  write_text(tmp("file"), "x");
  r = run(base + " --grad-output " + (grads / "key_padding" / "grad_output.npy").string() + " --grads-out " +
          tmp("file"));
  EXPECT_NE(r.code, 0);
  expect_one_line_error(r);
  EXPECT_EQ(slurp(tmp("file")), "x");
}

TEST_F(Cli, RunSdpaWithBottomRightCausalAndDropoutIsDeterministic) {
  // q: 2 queries, k/v: 4 keys; bottom-right causal lets query i see keys 0..i+2.
  write_npy(tmp("q.npy"), NdArray::from_f32({0.1f, 0.2f, 0.3f, 0.4f}, {1, 1, 2, 2}));
  write_npy(tmp("k.npy"), NdArray::from_f32({1, 0, 0, 1, 1, 1, -1, 0}, {1, 1, 4, 2}));
  write_npy(tmp("v.npy"), NdArray::from_f32({1, 2, 3, 4, 5, 6, 7, 8}, {1, 1, 4, 2}));
  const std::string base = "run sdpa --query " + tmp("q.npy") + " --key " + tmp("k.npy") + " --value " + tmp("v.npy");
  ASSERT_EQ(run(base + " --causal bottom-right -o " + tmp("o.npy") + " --weights-out " + tmp("w.npy")).code, 0);
  const auto w = read_npy(tmp("w.npy")).to_f32();
  EXPECT_EQ(w[3], 0.0f);  // query 0 cannot see key 3
  EXPECT_GT(w[2], 0.0f);  // but sees key 2
  EXPECT_GT(w[7], 0.0f);  // query 1 sees all four
  ASSERT_EQ(run(base + " --dropout 0.5 --seed 7 -o " + tmp("d1.npy")).code, 0);
  ASSERT_EQ(run(base + " --dropout 0.5 --seed 7 -o " + tmp("d2.npy")).code, 0);
  EXPECT_EQ(read_npy(tmp("d1.npy")), read_npy(tmp("d2.npy")));
}

TEST_F(Cli, ShapesPrintsTheTable) {
  const Result r = run("shapes mha --batch 2 --heads 2 --seq 4 --embed-dim 16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("contract<HeadDim>"));
  EXPECT_THAT(r.out, HasSubstr("[Batch=2, Heads=2, Seq=4, Key=4]"));
  EXPECT_THAT(r.out, HasSubstr("softmax<Key>"));
}

TEST_F(Cli, ShapesCanDumpAndTimeThePassPipeline) {
  const Result r = run("shapes mha --batch 2 --heads 2 --seq 4 --embed-dim 16 --dump-after cleanup --time-passes");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("--- after cleanup ---"));
  EXPECT_THAT(r.out, HasSubstr("fused_attention"));
  EXPECT_THAT(r.out, HasSubstr("pass fuse-attention:"));
  EXPECT_EQ(run("shapes mha --batch 2 --heads 2 --seq 4 --embed-dim 16 --dump-after nonsense").code, 2);
}

TEST_F(Cli, BenchJsonHasTheFields) {
  const Result r = run("bench sdpa --batch 1 --heads 2 --seq 16 --head-dim 8 --causal --repeat 3 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"median_ms", "min_ms", "max_ms", "gflops", "peak_mem_mib", "repeat", "batch", "heads", "seq"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j.at("repeat").get<int>(), 3);
  EXPECT_LE(j.at("min_ms").get<double>(), j.at("median_ms").get<double>());
}

TEST_F(Cli, HeatmapWritesAPngForSmallAndLargeWeights) {
  for (int n : {8, 64}) {
    std::vector<float> w(static_cast<std::size_t>(2 * n * n), 1.0f / static_cast<float>(n));
    write_npy(tmp("w.npy"), NdArray::from_f32(w, {1, 2, n, n}));
    std::string tokens;
    for (int i = 0; i < n; ++i) tokens += "t" + std::to_string(i) + " ";
    const Result r =
        run("heatmap --weights " + tmp("w.npy") + " --tokens \"" + tokens + "\" --all-heads --out " + tmp("h.png"));
    ASSERT_EQ(r.code, 0) << r.err;
    std::ifstream png(tmp("h.png"), std::ios::binary);
    char sig[8] = {};
    png.read(sig, 8);
    EXPECT_EQ(std::string(sig + 1, 3), "PNG");
  }
}

TEST_F(Cli, HelpOnEverySubcommandHasAnExample) {
  for (const char* cmd :
       {"run mha", "run sdpa", "run encoder-layer", "run encoder", "shapes", "bench", "verify", "heatmap", "emit"}) {
    const Result r = run(std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_THAT(r.out, HasSubstr("Example:")) << cmd;
  }
  const Result v = run("--version");
  EXPECT_EQ(v.code, 0);
  EXPECT_THAT(v.out, HasSubstr("qkv "));
}

// --- bad input ---------------------------------------------------------------------------------

TEST_F(Cli, UsageErrorsExitTwo) {
  const std::string ok = "--weights " + fixture("key_padding", "weights.safetensors") + " --query " +
                         fixture("key_padding", "query.npy") + " --heads 4 -o " + tmp("o.npy");
  for (const std::string& bad :
       std::vector<std::string>{"run mha " + ok + " --no-such-flag", "run mha --query x.npy -o " + tmp("o.npy"),
                                "run mha " + ok + " --heads abc",
                                "bench sdpa --heads 2 --seq 4 --head-dim 8 --repeat x", std::string("frobnicate")}) {
    const Result r = run(bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.err;
    EXPECT_FALSE(fs::exists(tmp("o.npy")));
  }
}

TEST_F(Cli, EmitWritesEveryFormatAndRefusesBadFlags) {
  const std::string model = "emit sdpa --batch 1 --heads 2 --seq 9 --head-dim 16 --causal ";
  for (const char* f : {"ll", "asm", "obj", "so"}) {
    const std::string out = tmp(std::string("k.") + f);
    const Result r = run(model + "--format " + f + " --function attn -o " + out);
    EXPECT_EQ(r.code, 0) << f << "\n" << r.err;
    EXPECT_TRUE(fs::exists(out)) << f;
    const bool with_header = std::string(f) == "obj" || std::string(f) == "so";
    EXPECT_EQ(fs::exists(fs::path(out).replace_extension(".h")), with_header) << f;
    if (with_header) {
      EXPECT_THAT(slurp(fs::path(out).replace_extension(".h")), HasSubstr("int attn(const float* q,"));
    }
    fs::remove(fs::path(out).replace_extension(".h"));
  }
  const Result p = run(model + "--target nvptx --sm 90 -o " + tmp("k.ptx"));
  EXPECT_EQ(p.code, 0) << p.err;
  EXPECT_THAT(slurp(tmp("k.ptx")), HasSubstr(".target sm_90"));
  EXPECT_THAT(slurp(tmp("k.ptx")), HasSubstr("// qkv kernel: qkv_attention_"));
  // A model with several kernels: a directory of them and the launch list.
  const Result d = run("emit mha --batch 1 --heads 2 --seq 9 --embed-dim 16 --target nvptx -o " + tmp("mha_ptx"));
  ASSERT_EQ(d.code, 0) << d.err;
  int ptx_files = 0;
  for (const auto& f : fs::directory_iterator(tmp("mha_ptx"))) ptx_files += f.path().extension() == ".ptx";
  EXPECT_GE(ptx_files, 3);  // attention, linear, copies
  EXPECT_THAT(slurp(tmp("mha_ptx") + "/launches.txt"), HasSubstr("fused_attention: qkv_attention_"));

  for (const std::string& bad : std::vector<std::string>{
           model + "--cpu no-such-cpu -o " + tmp("x.so"), model + "--function 9lives -o " + tmp("x.so"),
           model + "--target nvptx --format so -o " + tmp("x.so"), model + "--target nvptx --sm 70 -o " + tmp("x.so"),
           model + "--format ptx -o " + tmp("x.so"), model + "--format so",
           model + "--function main -o " + tmp("x.so"),  // #28 item 10: every C program has a main
           model + "--window '' -o " + tmp("x.so")}) {   // #28 item 10: an empty window is not "none"
    const Result r = run(bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.err;
    expect_one_line_error(r);
    EXPECT_FALSE(fs::exists(tmp("x.so"))) << bad;
  }
}

TEST_F(Cli, EmitForAnotherArchitectureAndCpu) {
  const std::string model = "emit sdpa --batch 1 --heads 2 --seq 9 --head-dim 16 --causal ";
  const Result a = run(model + "--target aarch64 --cpu neoverse-n1 --function attn -o " + tmp("a.so"));
  ASSERT_EQ(a.code, 0) << a.err;
  const std::string elf = slurp(tmp("a.so"));
  ASSERT_GT(elf.size(), 20u);
  EXPECT_EQ(static_cast<unsigned char>(elf[18]), 183u);  // e_machine EM_AARCH64
  const std::string h = slurp(tmp("a.h"));
  EXPECT_THAT(h, HasSubstr("machine code for aarch64, CPU `neoverse-n1`"));
  EXPECT_THAT(h, HasSubstr("dotprod"));
  EXPECT_THAT(h, HasSubstr("const char* attn_check_cpu(void);"));
  EXPECT_THAT(h, HasSubstr("#define ATTN_ERROR_CPU 6"));
  const Result x = run(model + "--target x86_64 --cpu znver4 --features -avx512f --format asm -o " + tmp("z.s"));
  ASSERT_EQ(x.code, 0) << x.err;
  EXPECT_THAT(slurp(tmp("z.s")), Not(HasSubstr("zmm")));
  for (const std::string& bad : std::vector<std::string>{
           model + "--target aarch64 --cpu znver4 -o " + tmp("x.so"),        // an x86 CPU for aarch64
           model + "--cpu x86-64-v3 --features avx2 -o " + tmp("x.so"),      // no sign
           model + "--cpu x86-64-v3 --features -no-such -o " + tmp("x.so"),  // unknown feature
           model + "--target sparc -o " + tmp("x.so"), model + "--target nvptx --cpu generic -o " + tmp("x.ptx")}) {
    const Result r = run(bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.err;
    expect_one_line_error(r);
    EXPECT_FALSE(fs::exists(tmp("x.so"))) << bad;
  }
}

TEST_F(Cli, RunOnTheCpuBackendForANamedCpu) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "x86-64 CPU names";
#endif
  write_npy(tmp("q.npy"), NdArray::from_f32({0.1f, 0.2f, 0.3f, 0.4f, -0.5f, 0.6f}, {1, 1, 3, 2}));
  const std::string base = "run sdpa --query " + tmp("q.npy") + " --key " + tmp("q.npy") + " --value " + tmp("q.npy");
  ASSERT_EQ(run(base + " -o " + tmp("native.npy")).code, 0);
  const Result v2 = run(base + " --cpu x86-64-v2 -o " + tmp("v2.npy"));
  ASSERT_EQ(v2.code, 0) << v2.err;
  const auto a = read_npy(tmp("native.npy")).to_f32(), b = read_npy(tmp("v2.npy")).to_f32();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << i;
  // Code this CPU cannot run is refused before anything is compiled (FMA4: AMD's Bulldozer only).
  const Result r = run(base + " --features +fma4 -o " + tmp("x.npy"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("this CPU lacks fma4"));
  expect_one_line_error(r);
  EXPECT_FALSE(fs::exists(tmp("x.npy")));
  EXPECT_EQ(run(base + " --cpu no-such-cpu -o " + tmp("x.npy")).code, 2);
  EXPECT_EQ(run(base + " --backend reference --cpu x86-64-v2 -o " + tmp("x.npy")).code, 2);
  const Result host = run("host");
  ASSERT_EQ(host.code, 0);
  EXPECT_THAT(host.out, HasSubstr("requires: "));
  EXPECT_THAT(host.out, HasSubstr("--target aarch64"));
}

TEST_F(Cli, RunSdpaGroupedQueryEqualsRepeatedKeyValueHeads) {
  // k/v with 2 heads for 6 query heads: query head h reads kv head h / 3 (PyTorch's enable_gqa),
  // so the result must equal plain attention on k/v with every head repeated 3 times.
  const std::int64_t B = 2, H = 6, G = 2, L = 5, S = 7, D = 8;
  std::vector<float> q(B * H * L * D), k(B * G * S * D), v(B * G * S * D);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * static_cast<float>(i));
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.11f * static_cast<float>(i));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.05f * static_cast<float>(i) + 1.0f);
  std::vector<float> kr, vr;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const auto at = static_cast<std::ptrdiff_t>((b * G + h / (H / G)) * S * D);
      kr.insert(kr.end(), k.begin() + at, k.begin() + at + S * D);
      vr.insert(vr.end(), v.begin() + at, v.begin() + at + S * D);
    }
  write_npy(tmp("q.npy"), NdArray::from_f32(q, {B, H, L, D}));
  write_npy(tmp("k.npy"), NdArray::from_f32(k, {B, G, S, D}));
  write_npy(tmp("v.npy"), NdArray::from_f32(v, {B, G, S, D}));
  write_npy(tmp("kr.npy"), NdArray::from_f32(kr, {B, H, S, D}));
  write_npy(tmp("vr.npy"), NdArray::from_f32(vr, {B, H, S, D}));
  for (const char* backend : {"reference", "cpu"}) {
    const std::string common = " --causal bottom-right --backend " + std::string(backend);
    const Result a = run("run sdpa --query " + tmp("q.npy") + " --key " + tmp("k.npy") + " --value " + tmp("v.npy") +
                         common + " -o " + tmp("gqa.npy") + " --weights-out " + tmp("gqa_w.npy"));
    ASSERT_EQ(a.code, 0) << a.err;
    const Result b = run("run sdpa --query " + tmp("q.npy") + " --key " + tmp("kr.npy") + " --value " + tmp("vr.npy") +
                         common + " -o " + tmp("rep.npy") + " --weights-out " + tmp("rep_w.npy"));
    ASSERT_EQ(b.code, 0) << b.err;
    for (const auto& [x, y] : {std::pair{"gqa.npy", "rep.npy"}, std::pair{"gqa_w.npy", "rep_w.npy"}}) {
      const NdArray got = read_npy(tmp(x)), want = read_npy(tmp(y));
      ASSERT_EQ(got.shape, want.shape) << x;
      const auto gv = got.to_f32(), wv = want.to_f32();
      for (std::size_t i = 0; i < gv.size(); ++i) EXPECT_NEAR(gv[i], wv[i], 1e-6) << backend << " " << x << " " << i;
    }
  }
  write_npy(tmp("k5.npy"), NdArray::from_f32(std::vector<float>(B * 4 * S * D, 0.f), {B, 4, S, D}));
  const Result bad = run("run sdpa --query " + tmp("q.npy") + " --key " + tmp("k5.npy") + " --value " + tmp("k5.npy") +
                         " -o " + tmp("o.npy"));
  EXPECT_EQ(bad.code, 1);  // 4 key/value heads do not divide 6 query heads
  EXPECT_THAT(bad.err, HasSubstr("dividing the query's"));
  expect_one_line_error(bad);
}

TEST_F(Cli, CausalWithoutAlignmentOnDifferentLengthsIsAUsageError) {
  write_npy(tmp("q.npy"), NdArray::from_f32(std::vector<float>(8, 0.1f), {1, 1, 2, 4}));
  write_npy(tmp("k.npy"), NdArray::from_f32(std::vector<float>(12, 0.1f), {1, 1, 3, 4}));
  const Result r = run("run sdpa --query " + tmp("q.npy") + " --key " + tmp("k.npy") + " --value " + tmp("k.npy") +
                       " --causal -o " + tmp("o.npy"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("top-left"));
  expect_one_line_error(r);
  EXPECT_FALSE(fs::exists(tmp("o.npy")));
}

TEST_F(Cli, FileProblemsExitOneWithAMessageAndNoOutput) {
  const std::string w = fixture("key_padding", "weights.safetensors"), q = fixture("key_padding", "query.npy");
  std::ofstream(tmp("garbage.npy")) << "not an npy file";
  write_npy(tmp("bool.npy"), NdArray::zeros(DType::boolean, {3, 6, 32}));
  write_npy(tmp("narrow.npy"), NdArray::zeros(DType::f32, {3, 6, 16}));
  std::map<std::string, NdArray> partial{{"out_proj.weight", NdArray::zeros(DType::f32, {32, 32})}};
  write_safetensors(tmp("partial.safetensors"), partial);
  struct Case {
    std::string args, says;
  };
  std::vector<Case> cases{
      {"run mha --weights " + w + " --query " + tmp("missing.npy") + " --heads 4", "missing.npy"},
      {"run mha --weights " + tmp("missing.safetensors") + " --query " + q + " --heads 4", "missing.safetensors"},
      {"run mha --weights " + w + " --query " + tmp("garbage.npy") + " --heads 4", "garbage.npy"},
      {"run mha --weights " + w + " --query " + tmp("bool.npy") + " --heads 4", "bool"},
      {"run mha --weights " + w + " --query " + tmp("narrow.npy") + " --heads 4", "embed_dim is 32"},
      {"run mha --weights " + tmp("partial.safetensors") + " --query " + q + " --heads 4", "in_proj_weight"},
      {"run mha --weights " + w + " --query " + q + " --heads 5", "not divisible by num_heads 5"},
      {"run mha --weights " + w + " --query " + q + " --heads 4 --key-padding-mask " + q, "bool"},
  };
  if (!cuda::why_no_gpu().empty())  // with a GPU the cuda backend runs (tests/gpu checks it)
    cases.push_back(
        {"run mha --weights " + w + " --query " + q + " --heads 4 --backend cuda", "no CUDA driver/GPU found"});
  for (const auto& c : cases) {
    const Result r = run(c.args + " -o " + tmp("o.npy"));
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.says)) << c.args;
    expect_one_line_error(r);
    EXPECT_FALSE(fs::exists(tmp("o.npy"))) << c.args;
  }
}

TEST_F(Cli, CudaBackendWithoutAGpuIsOneLineAndExitOne) {
  if (cuda::why_no_gpu().empty()) GTEST_SKIP() << "a GPU is present: this checks the error without one";
  const std::string shape = " --batch 1 --heads 2 --seq 7 --head-dim 16 --backend cuda";
  for (const std::string& args : {"verify mha" + shape, "bench sdpa" + shape + " --repeat 1 --json",
                                  "bench encoder-layer" + shape + " --repeat 1"}) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.err;
    EXPECT_THAT(r.err, ::testing::StartsWith("qkv: error: no CUDA driver/GPU found: ")) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
}

TEST_F(Cli, NoPartialOutputWhenTheSecondFileCannotBeWritten) {
  const auto c = config("key_padding");
  const Result r = run("run mha " + mha_flags(c, "key_padding") + " -o " + tmp("o.npy") + " --weights-out " +
                       tmp("no/such/dir/w.npy"));
  EXPECT_EQ(r.code, 2);  // an output whose directory does not exist is refused before any work (docs/cli.md)
  EXPECT_THAT(r.err, HasSubstr("no/such/dir"));
  EXPECT_FALSE(fs::exists(tmp("o.npy")));
  EXPECT_FALSE(fs::exists(tmp("o.npy.qkv-partial")));
}

TEST_F(Cli, HeatmapHeadOutOfRangeIsAUsageError) {
  write_npy(tmp("w.npy"), NdArray::from_f32(std::vector<float>(2 * 9, 0.5f), {1, 2, 3, 3}));
  const Result r = run("heatmap --weights " + tmp("w.npy") + " --head 5 --out " + tmp("h.png"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--head 5 is out of range"));
  EXPECT_FALSE(fs::exists(tmp("h.png")));
}

}  // namespace
}  // namespace qkv
