// `qkv run causal-lm` on the tiny Hugging Face checkpoints of tests/numerics/llama_fixtures
// (llama with Llama 3 RoPE scaling and attention biases; qwen2 sharded, tied, windowed on its
// last layer; mistral with a window on every layer, MQA and head_dim != hidden / heads), against
// the PyTorch reference of make_llama_fixtures.py; and the checkpoint and token problems, each one
// line and exit 1.
#include "cli_test.hpp"

#include <bit>
#include <functional>
#include <map>

using ::testing::HasSubstr;
using ::testing::Not;

namespace qkv {
namespace {

using namespace qkv::test;

const fs::path kLlamaFixtures = fs::path(QKV_FIXTURES_DIR).parent_path() / "llama_fixtures";

nlohmann::json case_of(const std::string& name) {
  std::ifstream in(kLlamaFixtures / name / "case.json");
  return nlohmann::json::parse(in);
}

/// A writable copy of a fixture's model folder, at `to`.
fs::path copy_model(const std::string& name, const fs::path& to) {
  fs::copy(kLlamaFixtures / name, to, fs::copy_options::recursive);
  return to;
}

/// Exit 1 with one line saying `says`.
void expect_failure(const Result& r, const std::string& says, const std::string& what) {
  EXPECT_EQ(r.code, 1) << what << "\n" << r.err;
  EXPECT_THAT(r.err, HasSubstr(says)) << what;
  EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what << "\n" << r.err;
}

TEST_F(Cli, RunCausalLmMatchesThePyTorchReferenceOnEveryCheckpoint) {
  for (const std::string name : {"llama", "qwen2", "mistral"}) {
    const auto c = case_of(name);
    const fs::path dir = kLlamaFixtures / name;
    const NdArray tokens = read_npy((dir / "tokens.npy").string());
    const auto ids = tokens.as<std::int64_t>();
    const auto prompt = c.at("prompt_len").get<std::size_t>();
    for (const std::string backend : {"cpu", "reference"}) {
      const Result r = run("run causal-lm --model " + dir.string() + " --tokens " + (dir / "tokens.npy").string() +
                           " --logits-out " + tmp("logits.npy") + " --backend " + backend);
      ASSERT_EQ(r.code, 0) << name << " on " << backend << ": " << r.err;
      EXPECT_LE(error(tmp("logits.npy"), (dir / "expected_logits_f64.npy").string()), c.at("tol_logits").get<double>())
          << name << " on " << backend;
      // The greedy continuation the reference generated is the argmax of qkv's logits.
      const NdArray logits = read_npy(tmp("logits.npy"));
      const auto v = logits.as<float>();
      const auto vocab = static_cast<std::size_t>(logits.shape[2]);
      for (std::size_t t = prompt; t < ids.size(); ++t) {
        const float* row = v.data() + (t - 1) * vocab;
        EXPECT_EQ(std::max_element(row, row + vocab) - row, ids[t]) << name << " on " << backend << ", token " << t;
      }
    }
  }
}

/// The first `n` columns of ids [B, L] (int64) written to `path`.
void write_prompt(const NdArray& tokens, std::int64_t n, const std::string& path) {
  const std::int64_t B = tokens.shape[0], L = tokens.shape[1];
  NdArray p = NdArray::zeros(DType::i64, {B, n});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < n; ++t)
      p.as<std::int64_t>()[static_cast<std::size_t>(b * n + t)] =
          tokens.as<std::int64_t>()[static_cast<std::size_t>(b * L + t)];
  write_npy(path, p);
}

TEST_F(Cli, GenerateContinuesEveryPromptAsTheReferenceDoes) {
  for (const std::string name : {"llama", "qwen2", "mistral"}) {
    const auto c = case_of(name);
    const fs::path dir = kLlamaFixtures / name;
    const NdArray tokens = read_npy((dir / "tokens.npy").string());
    const auto P = c.at("prompt_len").get<std::int64_t>(), N = c.at("new_tokens").get<std::int64_t>();
    write_prompt(tokens, P, tmp("prompt.npy"));
    const NdArray expected = read_npy((dir / "expected_logits_f64.npy").string());
    for (const std::string backend : {"cpu", "reference"}) {
      const Result r = run("generate --model " + dir.string() + " --prompt-ids " + tmp("prompt.npy") +
                           " --new-tokens " + std::to_string(N) + " --out " + tmp("ids.npy") + " --logits-out " +
                           tmp("logits.npy") + " --backend " + backend);
      ASSERT_EQ(r.code, 0) << name << " on " << backend << ": " << r.err;
      EXPECT_THAT(r.err, HasSubstr("tokens/s"));
      if (backend == std::string("cpu")) {
        EXPECT_THAT(r.err, HasSubstr("; 0 module(s) compiled after the prefill"));
      }
      EXPECT_EQ(read_npy(tmp("ids.npy")), tokens) << name << " on " << backend;
      // The logits each token was chosen from: rows P - 1 .. P + N - 2 of the full forward.
      const NdArray got = read_npy(tmp("logits.npy"));
      ASSERT_EQ(got.shape, (std::vector<std::int64_t>{1, N, expected.shape[2]}));
      const auto g = got.as<float>();
      const auto e = expected.as<double>();
      const auto V = static_cast<std::size_t>(expected.shape[2]);
      double err = 0;
      for (std::size_t t = 0; t < static_cast<std::size_t>(N); ++t)
        for (std::size_t v = 0; v < V; ++v)
          err = std::max(err, std::abs(g[t * V + v] - e[(static_cast<std::size_t>(P) - 1 + t) * V + v]));
      EXPECT_LE(err, c.at("tol_logits").get<double>()) << name << " on " << backend;
    }
  }
}

TEST_F(Cli, BenchGenerateReportsItsRatesAndCompilesNothingAfterTheFirstStep) {
  const fs::path dir = kLlamaFixtures / "qwen2";
  const auto c = case_of("qwen2");
  const NdArray tokens = read_npy((dir / "tokens.npy").string());
  const auto P = c.at("prompt_len").get<std::int64_t>(), N = c.at("new_tokens").get<std::int64_t>();
  write_prompt(tokens, P, tmp("prompt.npy"));
  const Result r = run("bench generate --model " + dir.string() + " --prompt-ids " + tmp("prompt.npy") +
                       " --new-tokens " + std::to_string(N) + " --threads 2 --json --out " + tmp("ids.npy"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("model_type"), "qwen2");
  EXPECT_EQ(j.at("prompt_tokens"), P);
  EXPECT_EQ(j.at("decode_steps"), N - 1);
  for (const char* key : {"prefill_tokens_per_s", "decode_tokens_per_s", "decode_attention_gbps"})
    EXPECT_GT(j.at(key).get<double>(), 0) << key;
  EXPECT_EQ(j.at("modules_compiled_after_prefill"), 0);
  EXPECT_EQ(j.at("modules_compiled_after_first_step"), 0);
  // What it timed is the generation itself: the reference's greedy continuation.
  EXPECT_EQ(read_npy(tmp("ids.npy")), tokens);
  // The same flags as generate: their checks, and no other command's.
  expect_usage_error(run("bench generate --model " + dir.string() + " --new-tokens 4"), "--prompt-ids is required",
                     "no prompt");
  expect_usage_error(
      run("bench generate --model " + dir.string() + " --prompt-ids " + tmp("prompt.npy") + " --heads 2"), "--heads",
      "a shape flag of the other bench models");
}

TEST_F(Cli, GeneratePromptTextGoesThroughTheModelsSentencePieceTokenizer) {
  // tests/numerics/tokenizer/tokenizer.model: 64 BPE pieces (make_tokenizer.sh), inside the
  // mistral fixture's vocabulary of 80.
  const fs::path model = copy_model("mistral", tmp("mistral"));
  fs::copy_file(kLlamaFixtures.parent_path() / "tokenizer" / "tokenizer.model", model / "tokenizer.model");
  const Result r =
      run("generate --model " + model.string() + " --prompt 'the cat sat on' --new-tokens 6 --out " + tmp("ids.npy"));
  if (r.code != 0 && r.err.find("built without SentencePiece") != std::string::npos)
    GTEST_SKIP() << "qkv was built without SentencePiece";
  ASSERT_EQ(r.code, 0) << r.err;
  // stdout: the prompt and its continuation as text.
  EXPECT_EQ(r.out.rfind("the cat sat on", 0), 0u) << r.out;
  // The ids: BOS, the prompt's pieces, 6 new ones; the same as generate on those prompt ids.
  const NdArray ids = read_npy(tmp("ids.npy"));
  ASSERT_EQ(ids.shape.size(), 2u);
  const std::int64_t total = ids.shape[1], prompt = total - 6;
  ASSERT_GT(prompt, 1);
  EXPECT_EQ(ids.as<std::int64_t>()[0], 1) << "BOS first";
  write_prompt(ids, prompt, tmp("prompt.npy"));
  ASSERT_EQ(run("generate --model " + model.string() + " --prompt-ids " + tmp("prompt.npy") + " --new-tokens 6 --out " +
                tmp("ids2.npy"))
                .code,
            0);
  EXPECT_EQ(read_npy(tmp("ids2.npy")), ids);

  // No tokenizer.model, an unreadable one, both prompts: one line each, no output file.
  const std::string base = " --prompt 'the cat' --new-tokens 2 --out " + tmp("none.npy");
  expect_failure(run("generate --model " + (kLlamaFixtures / "mistral").string() + base),
                 "no SentencePiece tokenizer.model in the model folder", "no tokenizer");
  {
    std::ofstream bad(model / "tokenizer.model", std::ios::binary | std::ios::trunc);
    bad << "not a protobuf at all";
  }
  expect_failure(run("generate --model " + model.string() + base), "not a SentencePiece model", "garbage tokenizer");
  expect_usage_error(run("generate --model " + model.string() + base + " --prompt-ids " + tmp("prompt.npy")),
                     "excludes", "both prompts");
  EXPECT_FALSE(fs::exists(tmp("none.npy")));
}

TEST_F(Cli, GenerateSamplesReproduciblyFromItsSeed) {
  const fs::path dir = kLlamaFixtures / "mistral";
  write_prompt(read_npy((dir / "tokens.npy").string()), 4, tmp("prompt.npy"));
  const std::string base =
      "generate --model " + dir.string() + " --prompt-ids " + tmp("prompt.npy") + " --new-tokens 8";
  ASSERT_EQ(run(base + " --temperature 50 --top-k 5 --seed 7 --out " + tmp("a.npy")).code, 0);
  ASSERT_EQ(run(base + " --temperature 50 --top-k 5 --seed 7 --out " + tmp("b.npy")).code, 0);
  ASSERT_EQ(run(base + " --temperature 50 --top-k 5 --seed 8 --out " + tmp("c.npy")).code, 0);
  EXPECT_EQ(read_npy(tmp("a.npy")), read_npy(tmp("b.npy")));
  EXPECT_NE(read_npy(tmp("a.npy")), read_npy(tmp("c.npy")));  // 8 draws among 5: a different seed differs
  const NdArray sampled = read_npy(tmp("a.npy"));
  for (std::int64_t id : sampled.as<std::int64_t>()) EXPECT_TRUE(id >= 0 && id < 80) << id;
  expect_usage_error(run(base + " --top-k 5 --out " + tmp("d.npy")), "--top-k samples: give a --temperature > 0",
                     "top-k without temperature");
  expect_usage_error(run(base + " --new-tokens 0 --out " + tmp("d.npy")), "--new-tokens", "no tokens");
  EXPECT_FALSE(fs::exists(tmp("d.npy")));
}

TEST_F(Cli, CausalLmCheckpointProblemsAreOneLineNamingTheKey) {
  const fs::path tokens = kLlamaFixtures / "llama" / "tokens.npy";
  auto expect_fails = [&](const fs::path& model, const std::string& says, const std::string& what,
                          const fs::path& ids) {
    const Result r = run("run causal-lm --model " + model.string() + " --tokens " + ids.string() + " --logits-out " +
                         tmp("logits.npy"));
    EXPECT_EQ(r.code, 1) << what << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(says)) << what;
    expect_one_line_error(r);
    EXPECT_FALSE(fs::exists(tmp("logits.npy"))) << what;
  };
  auto edit_config = [&](const std::string& name, const std::function<void(nlohmann::json&)>& f) {
    const fs::path m = copy_model(name, tmp(name));
    std::ifstream in(m / "config.json");
    auto c = nlohmann::json::parse(in);
    in.close();
    f(c);
    write_text(m / "config.json", c.dump());
    return m;
  };
  expect_fails(edit_config("llama", [](auto& c) { c["model_type"] = "gpt2"; }),
               "model_type 'gpt2' is not one qkv runs (llama, qwen2, mistral)", "model type", tokens);
  fs::remove_all(tmp("llama"));
  expect_fails(edit_config("llama", [](auto& c) { c.erase("hidden_size"); }), "has no `hidden_size`", "no key", tokens);
  fs::remove_all(tmp("llama"));
  expect_fails(edit_config("llama", [](auto& c) { c["num_key_value_heads"] = 4; }),
               "`model.layers.0.self_attn.k_proj.weight` is [32, 64], config.json makes it [64, 64]", "kv heads",
               tokens);
  fs::remove_all(tmp("llama"));
  expect_fails(edit_config("llama", [](auto& c) { c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; }),
               "rope_scaling type 'yarn' is not supported", "rope scaling", tokens);
  fs::remove_all(tmp("llama"));
  expect_fails(edit_config("llama", [](auto& c) { c["attention_bias"] = false; }),
               "has `model.layers.0.self_attn.k_proj.bias`, which a llama model with this config.json does not use",
               "unexpected bias", tokens);

  // A weight missing from its shard, and a shard missing.
  {
    const fs::path m = copy_model("qwen2", tmp("qwen2"));
    std::ifstream in(m / "model.safetensors.index.json");
    const std::string shard = nlohmann::json::parse(in).at("weight_map").at("model.norm.weight").get<std::string>();
    const SafetensorsFile f = SafetensorsFile::open(m / shard);
    std::map<std::string, NdArray> kept;
    for (const auto& n : f.names())
      if (n != "model.norm.weight") kept[n] = f.load(n);
    write_safetensors(m / shard, kept);
    expect_fails(m, "has no `model.norm.weight`, which the index puts there", "missing weight", tokens);
    fs::remove(m / shard);
    expect_fails(m, shard, "missing shard", tokens);
  }
  // Token ids: out of the vocabulary, or floats.
  NdArray bad = read_npy(tokens.string());
  bad.as<std::int64_t>()[3] = 128;
  write_npy(tmp("bad.npy"), bad);
  expect_fails(kLlamaFixtures / "llama", "token id 128 at index 3 is outside the vocabulary of 128", "bad id",
               tmp("bad.npy"));
  write_npy(tmp("float.npy"), NdArray::from_f32({1.0f, 2.0f}, {2}));
  expect_fails(kLlamaFixtures / "llama", "token ids must be an integer array", "float ids", tmp("float.npy"));
}

TEST_F(Cli, CausalLmReadsBf16WeightsWithANote) {
  const fs::path m = copy_model("mistral", tmp("mistral"));
  const SafetensorsFile f = SafetensorsFile::open(m / "model.safetensors");
  std::map<std::string, NdArray> bf16;
  for (const auto& n : f.names()) {
    const NdArray a = f.load(n);
    NdArray b = NdArray::zeros(DType::bf16, a.shape);
    const auto src = a.as<float>();
    auto dst = b.as<std::uint16_t>();
    for (std::size_t i = 0; i < src.size(); ++i)
      dst[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(src[i]) >> 16);
    bf16[n] = b;
  }
  write_safetensors(m / "model.safetensors", bf16);
  const Result r = run("run causal-lm --model " + m.string() + " --tokens " + (m / "tokens.npy").string() +
                       " --logits-out " + tmp("logits.npy"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("the model computes in f32 (--dtype f32); converted on load: "));
  EXPECT_THAT(r.err, HasSubstr(" stored as bf16 (model."));
  // Truncated weights move the logits, but not past a few percent of their range.
  EXPECT_LT(error(tmp("logits.npy"), (m / "expected_logits_f64.npy").string()), 0.5);

  // --dtype bf16 takes them as they are (no note) and computes in bf16: logits are bf16 too.
  for (const char* backend : {"cpu", "reference"}) {
    const Result h = run("run causal-lm --dtype bf16 --backend " + std::string(backend) + " --model " + m.string() +
                         " --tokens " + (m / "tokens.npy").string() + " --logits-out " + tmp("logits_bf16.npy"));
    ASSERT_EQ(h.code, 0) << h.err;
    EXPECT_THAT(h.err, Not(HasSubstr("converted on load"))) << backend;
    EXPECT_EQ(read_npy(tmp("logits_bf16.npy")).dtype, DType::bf16) << backend;
    EXPECT_LT(error(tmp("logits_bf16.npy"), (m / "expected_logits_f64.npy").string()), 0.5) << backend;
  }
}

}  // namespace
}  // namespace qkv
