// Quantized weights on the CLI: `--quantize q8 / q4` on the Hugging Face decoder fixtures against
// their f32 logits and across backends, `qkv quantize` checkpoints, and `emit --quantize`'s usage
// errors (docs/cli.md, "Quantized weights").
#include "decoder_cli.hpp"

#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <vector>

using ::testing::HasSubstr;

namespace qkv {
namespace {

using namespace qkv::test;
using namespace qkv::decoder_cli;

// emit --quantize: what cannot take quantized weights says so (tests/e2e/aot/run.cmake runs the
// libraries that can from C).
TEST_F(Cli, EmitQuantizeRefusesWhatCannotTakeQuantizedWeights) {
  expect_usage_error(run("emit sdpa --batch 1 --heads 2 --seq 8 --head-dim 16 --quantize q8 -o " + tmp("s.so")),
                     "--quantize: the model has no linear layer weight that qkv quantizes", "no linear layer");
  expect_usage_error(
      run("emit mha --batch 1 --heads 2 --seq 8 --embed-dim 32 --quantize q4 --target nvptx -o " + tmp("m.ptx")),
      "--quantize goes with a CPU target", "a GPU target");
  EXPECT_FALSE(fs::exists(tmp("s.so")));
  EXPECT_FALSE(fs::exists(tmp("m.ptx")));
}

// --quantize q8 / q4: the linear layers' weights as 8-bit or 4-bit integers with an f16 scale per
// 32. The CPU backend's logits equal the interpreter's on the same quantized model (1e-5), and stay
// near the f32 model's: mean KL(f32 ‖ quantized) over the positions below 1e-3 nats for q8 (measured:
// 5e-5 on this 2-layer, width-64 checkpoint of random weights, the top token the same at every
// position) and 0.05 for q4 (measured: 0.014, more than q8's; the top token the same at 81 % of the
// positions, bound 70 %: random weights leave close logits); generate continues the prompt alike on
// both backends.
TEST_F(Cli, QuantizedWeightsKeepTheLogitsNearTheF32ModelsOnEveryBackend) {
  const fs::path dir = kLlamaFixtures / "llama";
  const std::string tokens = (dir / "tokens.npy").string();
  auto logits = [&](const std::string& backend, const std::string& quantize) {
    const Result r = run("run causal-lm --model " + dir.string() + " --tokens " + tokens + " --logits-out " +
                         tmp("logits.npy") + " --backend " + backend + " --quantize " + quantize);
    EXPECT_EQ(r.code, 0) << r.err;
    if (quantize != "none") {
      EXPECT_THAT(r.err, HasSubstr("linear weights quantized to " + quantize));
    }
    return read_npy(tmp("logits.npy")).to_f32();
  };
  const std::vector<float> f32 = logits("cpu", "none");
  const std::size_t V = 128;  // the fixture's vocabulary
  ASSERT_EQ(f32.size() % V, 0u);
  const std::size_t rows = f32.size() / V;
  double q8_kl = 0;
  for (const std::string format : {"q8", "q4"}) {
    SCOPED_TRACE(format);
    const std::vector<float> quantized = logits("cpu", format), ref = logits("reference", format);
    ASSERT_EQ(quantized.size(), f32.size());
    ASSERT_EQ(ref.size(), f32.size());
    for (std::size_t i = 0; i < quantized.size(); ++i)
      ASSERT_NEAR(quantized[i], ref[i], 1e-5 * std::max(1.0f, std::abs(ref[i]))) << i;
    double kl_sum = 0;
    std::size_t same_top = 0;
    for (std::size_t t = 0; t < rows; ++t) {
      auto log_softmax = [&](const std::vector<float>& x) {
        double m = -1e300, z = 0;
        for (std::size_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(x[t * V + v]));
        for (std::size_t v = 0; v < V; ++v) z += std::exp(x[t * V + v] - m);
        std::vector<double> out(V);
        for (std::size_t v = 0; v < V; ++v) out[v] = x[t * V + v] - m - std::log(z);
        return out;
      };
      const std::vector<double> p = log_softmax(f32), q = log_softmax(quantized);
      for (std::size_t v = 0; v < V; ++v) kl_sum += std::exp(p[v]) * (p[v] - q[v]);
      const auto top = [&](const std::vector<double>& x) { return std::max_element(x.begin(), x.end()) - x.begin(); };
      same_top += top(p) == top(q);
    }
    const double kl = kl_sum / static_cast<double>(rows);
    std::cout << format << ": mean KL(f32 || " << format << ") " << kl << " nats, the same top token at " << same_top
              << " of " << rows << " positions\n";  // the figures docs/cli.md quotes
    EXPECT_GT(kl, 0.0);                             // the weights did change
    if (format == "q8") {
      EXPECT_LE(kl, 1e-3);
      EXPECT_EQ(same_top, rows);
      q8_kl = kl;
    } else {
      EXPECT_LE(kl, 0.05);
      EXPECT_GT(kl, q8_kl);  // 4 bits drift further than 8
      EXPECT_GE(static_cast<double>(same_top), 0.7 * static_cast<double>(rows));
    }
    const NdArray all = read_npy(tokens);
    write_prompt(all, 10, tmp("prompt.npy"));
    std::vector<NdArray> ids;
    for (const std::string backend : {"cpu", "reference"}) {
      const Result r = run("generate --quantize " + format + " --model " + dir.string() + " --prompt-ids " +
                           tmp("prompt.npy") + " --new-tokens 6 --out " + tmp("ids.npy") + " --backend " + backend);
      ASSERT_EQ(r.code, 0) << r.err;
      ids.push_back(read_npy(tmp("ids.npy")));
    }
    EXPECT_EQ(ids[0], ids[1]);
  }
}

// qkv quantize (--type q8 / q4): a folder whose linear weights are stored so, which runs exactly as
// --quantize q8 / q4 on the original (the same q and scales, read instead of computed); a quantized
// folder quantized again is the same file, to the other format refused; the checkpoint problems of
// a quantized weight, each one line and exit 1.
TEST_F(Cli, QuantizeWritesACheckpointThatRunsAsQuantizingOnLoadDoes) {
  auto bytes_of = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (const std::string format : {"q8", "q4"})
    for (const std::string name : {"llama", "qwen2"}) {  // qwen2: sharded, with a tied head
      SCOPED_TRACE(name + " " + format);
      const fs::path dir = kLlamaFixtures / name, out = tmp(name + "_" + format);
      Result r = run("quantize --model " + dir.string() + " --out " + out.string() + " --type " + format);
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_THAT(r.err, HasSubstr("linear weights quantized to " + format));
      const SafetensorsFile file = SafetensorsFile::open(out / "model.safetensors");
      const auto names = file.names();
      const std::string down = "model.layers.0.mlp.down_proj.weight";
      EXPECT_NE(std::find(names.begin(), names.end(), down + "." + format), names.end());
      EXPECT_EQ(std::find(names.begin(), names.end(), down), names.end());
      EXPECT_EQ(file.get(down + "." + format + "_scale").dtype, DType::f16);
      EXPECT_EQ(file.get(down + "." + format).shape.at(1) * (format == "q4" ? 2 : 1),
                file.get(down + "." + format + "_scale").shape.at(1) * 32);
      for (const std::string backend : {"cpu", "reference"}) {
        const std::string tokens = (dir / "tokens.npy").string();
        r = run("run causal-lm --model " + out.string() + " --tokens " + tokens + " --logits-out " + tmp("a.npy") +
                " --backend " + backend);
        ASSERT_EQ(r.code, 0) << r.err;
        EXPECT_THAT(r.err, HasSubstr("read as stored in " + format));
        r = run("run causal-lm --quantize " + format + " --model " + dir.string() + " --tokens " + tokens +
                " --logits-out " + tmp("b.npy") + " --backend " + backend);
        ASSERT_EQ(r.code, 0) << r.err;
        EXPECT_EQ(read_npy(tmp("a.npy")), read_npy(tmp("b.npy"))) << backend;
      }
      r = run("quantize --model " + out.string() + " --out " + tmp("again") + " --type " + format);
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_THAT(r.err, HasSubstr("stored " + format));
      EXPECT_THAT(r.err, HasSubstr("already"));
      EXPECT_EQ(bytes_of(fs::path(tmp("again")) / "model.safetensors"), bytes_of(out / "model.safetensors"));
      fs::remove_all(tmp("again"));
      const std::string other = format == "q8" ? "q4" : "q8";
      expect_failure(run("quantize --model " + out.string() + " --out " + tmp("again") + " --type " + other),
                     "is stored " + format + " already; quantize the float checkpoint to " + other,
                     "a quantized checkpoint to the other format");
      EXPECT_FALSE(fs::exists(tmp("again")));
    }
  const fs::path q8 = tmp("llama_q8");
  expect_usage_error(run("quantize --model " + q8.string() + " --out " + q8.string()), "is also the input --model",
                     "the input folder");
  // A scale missing, then of the wrong shape.
  const SafetensorsFile file = SafetensorsFile::open(q8 / "model.safetensors");
  std::map<std::string, NdArray> tensors;
  for (const auto& n : file.names()) tensors[n] = file.load(n);
  const std::string scale = "model.layers.1.self_attn.o_proj.weight.q8_scale";
  const NdArray kept = tensors.at(scale);
  tensors.erase(scale);
  write_safetensors(q8 / "model.safetensors", tensors);
  expect_failure(run("generate --model " + q8.string() + " --prompt-ids " +
                     (kLlamaFixtures / "llama" / "tokens.npy").string() + " --new-tokens 1 --out " + tmp("ids.npy")),
                 "has `model.layers.1.self_attn.o_proj.weight.q8` but no `" + scale + "`", "a missing scale");
  tensors[scale] = NdArray::zeros(DType::f16, {kept.shape[0], kept.shape[1] + 1});
  write_safetensors(q8 / "model.safetensors", tensors);
  expect_failure(run("generate --model " + q8.string() + " --prompt-ids " +
                     (kLlamaFixtures / "llama" / "tokens.npy").string() + " --new-tokens 1 --out " + tmp("ids.npy")),
                 "`" + scale + "` is f16 [", "a scale of the wrong shape");
  EXPECT_FALSE(fs::exists(tmp("ids.npy")));
}

}  // namespace
}  // namespace qkv
