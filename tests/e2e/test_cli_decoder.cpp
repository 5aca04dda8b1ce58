// `qkv run causal-lm` (and `run encoder-model`: BERT, at the end) on the tiny Hugging Face
// checkpoints of tests/numerics/llama_fixtures
// (llama with Llama 3 RoPE scaling and attention biases; qwen2 sharded, tied, windowed on its
// last layer; mistral with a window on every layer, MQA and head_dim != hidden / heads), against
// the PyTorch reference of make_llama_fixtures.py; and the checkpoint and token problems, each one
// line and exit 1.
#include "decoder_cli.hpp"

#include <bit>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

using ::testing::HasSubstr;
using ::testing::Not;

namespace qkv {
namespace {

using namespace qkv::test;
using namespace qkv::decoder_cli;

TEST_F(Cli, RunCausalLmMatchesThePyTorchReferenceOnEveryCheckpoint) {
  for (const std::string name : {"llama", "qwen2", "mistral", "gpt2", "gpt2_saved"}) {
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

/// A length-delimited protobuf field: the key (`number`, wire type 2), the varint length, the bytes.
std::string proto_bytes(std::uint32_t number, const std::string& payload) {
  std::string out;
  auto varint = [&](std::uint64_t v) {
    for (; v >= 0x80; v >>= 7) out += static_cast<char>(v | 0x80);
    out += static_cast<char>(v);
  };
  varint(number << 3 | 2);
  varint(payload.size());
  return out + payload;
}

TEST_F(Cli, GenerateContinuesEveryPromptAsTheReferenceDoes) {
  for (const std::string name : {"llama", "qwen2", "mistral", "gpt2", "gpt2_saved"}) {
    const auto c = case_of(name);
    const auto [dir, tokens, P, N] = reference_run(name, tmp("prompt.npy"));
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

// Prompts of different lengths in one batch (rows right-padded with -1 in --prompt-ids): each
// row's continuation and the logits it was chosen from are those of its prompt run alone (1e-5),
// on Llama (RoPE; the CPU backend and the interpreter), GPT-2 (learned positions; the CPU backend)
// and Mistral (a window of 6 keys, shorter than the prompts; the interpreter: compiling costs
// seconds a model); the ids written back right-padded with -1.
TEST_F(Cli, GenerateRunsPromptsOfDifferentLengthsInOneBatchAsEachAlone) {
  const std::vector<float> all = read_npy((kLlamaFixtures / "llama" / "tokens.npy").string()).to_f32();
  const std::vector<std::pair<std::int64_t, std::int64_t>> rows{{0, 12}, {3, 5}, {10, 9}};  // (start, length)
  const std::int64_t B = 3, P = 12, N = 7;
  NdArray batch = NdArray::zeros(DType::i64, {B, P});
  std::vector<NdArray> alone;
  for (std::int64_t b = 0; b < B; ++b) {
    const auto [start, len] = rows[static_cast<std::size_t>(b)];
    NdArray one = NdArray::zeros(DType::i64, {1, len});
    for (std::int64_t t = 0; t < P; ++t) {
      // ids below every fixture's vocabulary (80 the least)
      const auto id = t < len ? static_cast<std::int64_t>(all[static_cast<std::size_t>(start + t)]) % 80 : -1;
      batch.as<std::int64_t>()[static_cast<std::size_t>(b * P + t)] = id;
      if (t < len) one.as<std::int64_t>()[static_cast<std::size_t>(t)] = id;
    }
    alone.push_back(one);
  }
  write_npy(tmp("batch.npy"), batch);
  for (const auto& [name, backend] : std::vector<std::pair<std::string, std::string>>{
           {"llama", "cpu"}, {"llama", "reference"}, {"gpt2", "cpu"}, {"mistral", "reference"}}) {
    SCOPED_TRACE(name + " on " + backend);
    auto generate = [&](const std::string& prompt) {
      const Result r = run("generate --model " + (kLlamaFixtures / name).string() + " --prompt-ids " + prompt +
                           " --new-tokens " + std::to_string(N) + " --out " + tmp("ids.npy") + " --logits-out " +
                           tmp("logits.npy") + " --backend " + backend);
      EXPECT_EQ(r.code, 0) << r.err;
      return std::pair{read_npy(tmp("ids.npy")), read_npy(tmp("logits.npy"))};
    };
    const auto [ids, logits] = generate(tmp("batch.npy"));
    ASSERT_EQ(ids.shape, (std::vector<std::int64_t>{B, P + N}));
    const std::int64_t V = logits.shape.at(2);
    for (std::int64_t b = 0; b < B; ++b) {
      write_npy(tmp("one.npy"), alone[static_cast<std::size_t>(b)]);
      const auto [one_ids, one_logits] = generate(tmp("one.npy"));
      const std::int64_t len = rows[static_cast<std::size_t>(b)].second;
      for (std::int64_t t = 0; t < P + N; ++t)
        EXPECT_EQ(ids.as<std::int64_t>()[static_cast<std::size_t>(b * (P + N) + t)],
                  t < len + N ? one_ids.as<std::int64_t>()[static_cast<std::size_t>(t)] : -1)
            << "row " << b << ", column " << t;
      const auto got = logits.as<float>().subspan(static_cast<std::size_t>(b * N * V), static_cast<std::size_t>(N * V));
      const auto want = one_logits.as<float>();
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5 * std::max(1.0f, std::abs(want[i]))) << "row " << b << ", entry " << i;
    }
  }
  // Padding anywhere but a row's end, or a row of padding only: one line, exit 1.
  batch.as<std::int64_t>()[1] = -1;
  write_npy(tmp("bad.npy"), batch);
  expect_failure(run("generate --model " + (kLlamaFixtures / "llama").string() + " --prompt-ids " + tmp("bad.npy") +
                     " --new-tokens 2 --out " + tmp("bad_ids.npy")),
                 "follows padding (-1): pad a shorter row at its end only", "padding inside a row");
  for (std::int64_t t = 0; t < P; ++t) batch.as<std::int64_t>()[static_cast<std::size_t>(P + t)] = -1;
  batch.as<std::int64_t>()[1] = 5;
  write_npy(tmp("bad.npy"), batch);
  expect_failure(run("generate --model " + (kLlamaFixtures / "llama").string() + " --prompt-ids " + tmp("bad.npy") +
                     " --new-tokens 2 --out " + tmp("bad_ids.npy")),
                 "row 1 is all padding (-1)", "a row of padding only");
  EXPECT_FALSE(fs::exists(tmp("bad_ids.npy")));
}

// The code cache across processes: the second generate loads every module the first compiled;
// processes started together on an empty cache all succeed and leave whole entries only;
// --no-cache neither reads nor writes it.
TEST_F(Cli, GenerateLoadsItsCompiledCodeFromTheCacheInTheNextProcess) {
  const auto [dir, tokens, P, N] = reference_run("llama", tmp("prompt.npy"));
  auto args = [&](const std::string& out) {
    return std::vector<std::string>{"generate",     "--model",         dir.string(), "--prompt-ids", tmp("prompt.npy"),
                                    "--new-tokens", std::to_string(N), "--out",      tmp(out)};
  };
  const fs::path cache = cache_ / "qkv";
  auto entries = [&] {
    std::vector<std::string> names;
    if (fs::exists(cache))
      for (const auto& e : fs::directory_iterator(cache)) names.push_back(e.path().filename().string());
    return names;
  };
  // "(M module(s), K loaded from the code cache)" → {M, K}
  auto modules = [](const std::string& err) {
    long long m = -1, k = -1;
    const auto at = err.find("compiling ");
    if (at != std::string::npos) {
      const auto open = err.find('(', at);
      if (open != std::string::npos)
        std::sscanf(err.c_str() + open, "(%lld module(s), %lld loaded from the code cache)", &m, &k);
    }
    return std::pair{m, k};
  };

  // Started together on an empty cache.
  std::vector<Process> ps;
  for (int i = 0; i < 2; ++i) ps.push_back(start(args("ids" + std::to_string(i) + ".npy")));
  for (int i = 0; i < 2; ++i) {
    const Result r = wait(ps[static_cast<std::size_t>(i)]);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(read_npy(tmp("ids" + std::to_string(i) + ".npy")), tokens);
  }
  const auto stored = entries();
  ASSERT_FALSE(stored.empty());
  for (const auto& name : stored) EXPECT_TRUE(name.ends_with(".o") && !name.starts_with(".")) << name;

  const Result warm = run_argv(args("warm.npy"));
  ASSERT_EQ(warm.code, 0) << warm.err;
  const auto [m, k] = modules(warm.err);
  EXPECT_GT(m, 0) << warm.err;
  EXPECT_EQ(k, m) << "every module loaded: " << warm.err;
  EXPECT_EQ(read_npy(tmp("warm.npy")), tokens);
  EXPECT_EQ(entries().size(), stored.size());

  // A damaged entry is compiled again, never loaded.
  for (const auto& name : stored) fs::resize_file(cache / name, fs::file_size(cache / name) / 2);
  const Result healed = run_argv(args("healed.npy"));
  ASSERT_EQ(healed.code, 0) << healed.err;
  EXPECT_EQ(modules(healed.err).second, 0) << healed.err;
  EXPECT_EQ(read_npy(tmp("healed.npy")), tokens);

  fs::remove_all(cache);
  auto cold = args("cold.npy");
  cold.push_back("--no-cache");
  const Result r = run_argv(cold);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(modules(r.err).second, 0) << r.err;
  EXPECT_FALSE(fs::exists(cache));
  EXPECT_EQ(read_npy(tmp("cold.npy")), tokens);
}

TEST_F(Cli, BenchGenerateReportsItsRatesAndCompilesNothingAfterTheFirstStep) {
  const auto [dir, tokens, P, N] = reference_run("qwen2", tmp("prompt.npy"));
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

TEST_F(Cli, GenerateKeepsPackedWeightsOnlyWhenItsDecodeStepsRunOnTheGemm) {
  // A batch of up to gemv_max_rows rows decodes on the GEMV, which reads the weights in place: a
  // packed copy kept for the GEMM would only serve the prefill, so none is kept unless --repack.
  const auto [dir, tokens, P, N] = reference_run("qwen2", tmp("prompt.npy"));
  auto bench = [&](const std::string& prompt, const std::string& flags, const std::string& out) {
    const Result r = run("bench generate --model " + dir.string() + " --prompt-ids " + prompt + " --new-tokens " +
                         std::to_string(N) + " --threads 2 --json --out " + out + flags);
    EXPECT_EQ(r.code, 0) << r.err;
    return r.code == 0 ? nlohmann::json::parse(r.out).at("weights_repacked").get<bool>() : false;
  };
  EXPECT_FALSE(bench(tmp("prompt.npy"), "", tmp("default.npy")));
  EXPECT_TRUE(bench(tmp("prompt.npy"), " --repack", tmp("repacked.npy")));
  EXPECT_EQ(read_npy(tmp("default.npy")), tokens);
  EXPECT_EQ(read_npy(tmp("repacked.npy")), tokens);
  // Five rows (the prompt's first row five times) decode on the GEMM: packed once by default.
  const NdArray one = read_npy(tmp("prompt.npy"));
  NdArray five = NdArray::zeros(DType::i64, {5, P});
  for (std::int64_t b = 0; b < 5; ++b)
    for (std::int64_t t = 0; t < P; ++t)
      five.as<std::int64_t>()[static_cast<std::size_t>(b * P + t)] =
          one.as<std::int64_t>()[static_cast<std::size_t>(t)];
  write_npy(tmp("five.npy"), five);
  EXPECT_TRUE(bench(tmp("five.npy"), "", tmp("five_default.npy")));
  EXPECT_FALSE(bench(tmp("five.npy"), " --no-repack", tmp("five_per_call.npy")));
  EXPECT_EQ(read_npy(tmp("five_default.npy")), read_npy(tmp("five_per_call.npy")));
  expect_usage_error(run("generate --model " + dir.string() + " --prompt-ids " + tmp("prompt.npy") + " --out " +
                         tmp("x.npy") + " --repack --no-repack"),
                     "excludes", "both");
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
  // Issue 28 item 3: normalization tables (precompiled_charsmap) that libsentencepiece would walk
  // out of bounds (it segfaulted on the first) are refused before it sees them; a sound one works.
  const std::string spm = slurp(kLlamaFixtures.parent_path() / "tokenizer" / "tokenizer.model");
  auto with_charsmap = [&](const std::vector<std::uint32_t>& trie, const std::string& text) {
    std::string blob(4 + 4 * trie.size(), '\0');
    const auto bytes = static_cast<std::uint32_t>(4 * trie.size());
    std::memcpy(blob.data(), &bytes, 4);
    std::memcpy(blob.data() + 4, trie.data(), 4 * trie.size());
    // NormalizerSpec (field 3 of ModelProto) { precompiled_charsmap (field 2) }: merged into the
    // model's own spec by protobuf, overriding its empty table.
    write_text(model / "tokenizer.model", spm + proto_bytes(3, proto_bytes(2, blob + text)));
  };
  std::vector<std::uint32_t> trie(768, 0x80000000u);  // unused units: a label no byte matches
  trie[0] = 256u << 10;                               // the root's offset: state 256
  trie[256 ^ 'a'] = (865u << 10) | (1u << 8) | 'a';   // 'a', a match: to 353 ^ 865 = 512
  trie[512] = 0x80000000u;                            // its value: offset 0 of the text
  with_charsmap(trie, std::string("b\0", 2));         // 'a' -> 'b'
  const Result sound = run("generate --model " + model.string() + base);
  ASSERT_EQ(sound.code, 0) << sound.err;
  EXPECT_EQ(sound.out.rfind("the cbt", 0), 0u) << sound.out;  // the table normalized the prompt
  fs::remove(tmp("none.npy"));
  std::vector<std::uint32_t> far(256, 0);
  far[0] = 0xFFFFFC00u;  // the root's offset points far outside the table
  with_charsmap(far, std::string("x\0", 2));
  expect_failure(run("generate --model " + model.string() + base), "its normalization trie points outside itself",
                 "root offset outside the table");
  trie[512] = 0x80000000u | 7;  // a replacement past the end of the text
  with_charsmap(trie, std::string("b\0", 2));
  expect_failure(run("generate --model " + model.string() + base), "names a replacement outside itself",
                 "replacement outside the text");
  trie[512] = 0x80000000u;
  trie[512 ^ 'a'] = (97u << 10) | (1u << 8) | 'a';  // from 512, 'a' matches again and leads back to 512
  with_charsmap(trie, std::string("b\0", 2));       // ("aaa...": a match per byte, past the library's 32)
  expect_failure(run("generate --model " + model.string() + base), "its normalization trie has a cycle",
                 "a cycle of matches");
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
  // Issue 28 items 8 and 9: seeds outside [0, 2^64) and a length past the model's positions (once
  // an overflow of the cache's capacity) are usage errors.
  expect_usage_error(run(base + " --temperature 1 --seed -1 --out " + tmp("d.npy")), "--seed", "negative seed");
  expect_usage_error(run(base + " --temperature 1 --seed 18446744073709551616 --out " + tmp("d.npy")), "--seed",
                     "seed of 2^64");
  for (const char* n : {"9223372036854775807", "61"})
    expect_usage_error(run("generate --model " + dir.string() + " --prompt-ids " + tmp("prompt.npy") +
                           " --new-tokens " + n + " --out " + tmp("d.npy")),
                       "--new-tokens " + std::string(n) +
                           ": the prompt's 4 token(s) and the new ones exceed the model's max_position_embeddings "
                           "(64); give at most 60",
                       n);
  EXPECT_FALSE(fs::exists(tmp("d.npy")));
}

// Issue 28 item 6: a non-finite weight makes the logits non-finite; sampling (which would draw ids
// from NaN weights), greedy decoding and run causal-lm refuse them, naming the weight.
TEST_F(Cli, NonFiniteLogitsAreRefusedNamingTheWeight) {
  const fs::path m = copy_model("mistral", tmp("mistral"));
  write_prompt(read_npy((m / "tokens.npy").string()), 4, tmp("prompt.npy"));
  const SafetensorsFile f = SafetensorsFile::open(m / "model.safetensors");
  std::map<std::string, NdArray> w;
  for (const auto& n : f.names()) w[n] = f.load(n);
  const std::string poisoned = "model.layers.1.mlp.up_proj.weight";
  w.at(poisoned).as<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  write_safetensors(m / "model.safetensors", w);
  const std::string says = "the weight `" + poisoned + "` has nan at index 5";
  const std::string gen = "generate --model " + m.string() + " --prompt-ids " + tmp("prompt.npy") + " --new-tokens 3";
  for (const std::string how : {" --temperature 1 --seed 3", ""}) {
    const Result r = run(gen + how + " --out " + tmp("ids.npy"));
    expect_failure(r, "new token 1 of sequence 0: the logits are not finite (nan for token id ", "generate" + how);
    EXPECT_THAT(r.err, HasSubstr(says));
  }
  const Result c = run("run causal-lm --model " + m.string() + " --tokens " + tmp("prompt.npy") + " --logits-out " +
                       tmp("logits.npy"));
  expect_failure(c, "--tokens: the logits are not finite", "run causal-lm");
  EXPECT_THAT(c.err, HasSubstr(says));
  EXPECT_FALSE(fs::exists(tmp("ids.npy")));
  EXPECT_FALSE(fs::exists(tmp("logits.npy")));
}

// Issue 28 item 5: a folder with model.safetensors and an index with shards is read as
// transformers reads it — model.safetensors — and stderr says so.
TEST_F(Cli, ModelSafetensorsTakesPrecedenceOverTheShardsAsInTransformers) {
  const fs::path m = copy_model("qwen2", tmp("qwen2"));
  const std::string tokens = (m / "tokens.npy").string();
  auto logits = [&](const std::string& says) {
    const Result r =
        run("run causal-lm --model " + m.string() + " --tokens " + tokens + " --logits-out " + tmp("logits.npy"));
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr(says));
    return read_npy(tmp("logits.npy"));
  };
  const NdArray sharded = logits("qkv: weights: 2 shard(s) listed by " + (m / "model.safetensors.index.json").string());
  // One file with every weight of the shards, the final norm's scaled: other logits.
  std::map<std::string, NdArray> all;
  for (const auto& e : fs::directory_iterator(m))
    if (e.path().filename().string().find("-of-") != std::string::npos) {
      const SafetensorsFile f = SafetensorsFile::open(e.path());
      for (const auto& n : f.names()) all[n] = f.load(n);
    }
  for (float& x : all.at("model.norm.weight").as<float>()) x *= 2;
  write_safetensors(m / "model.safetensors", all);
  const NdArray both =
      logits("qkv: weights: " + (m / "model.safetensors").string() +
             " (model.safetensors.index.json and its shards are ignored, as transformers ignores them)");
  EXPECT_NE(both, sharded);
  fs::remove(m / "model.safetensors.index.json");
  EXPECT_EQ(logits("qkv: weights: " + (m / "model.safetensors").string() + "\n"), both);
}

// The weights are read where the file holds them (SafetensorsFile::load's windows, io/bytes.hpp)
// when they start on a cache line, as in a file qkv writes; else copied, as with --no-mmap. The
// llama checkpoint rewritten by qkv, then with its data section 4 bytes later (4 more spaces of
// header, as another writer may pad it), then read with --no-mmap: run causal-lm's logits and
// generate's ids and logits are the same bit for bit.
TEST_F(Cli, WeightsReadInPlaceOrCopiedGiveTheSameResults) {
  const fs::path m = copy_model("llama", tmp("llama"));
  const auto [dir, tokens, P, N] = reference_run("llama", tmp("prompt.npy"));
  auto outputs = [&](const std::string& flags) {
    const Result r = run("run causal-lm --model " + m.string() + " --tokens " + (m / "tokens.npy").string() +
                         " --logits-out " + tmp("logits.npy"));
    EXPECT_EQ(r.code, 0) << r.err;
    const Result g =
        run("generate --model " + m.string() + " --prompt-ids " + tmp("prompt.npy") + " --new-tokens " +
            std::to_string(N) + " --out " + tmp("ids.npy") + " --logits-out " + tmp("step_logits.npy") + flags);
    EXPECT_EQ(g.code, 0) << g.err;
    return std::vector<NdArray>{read_npy(tmp("logits.npy")), read_npy(tmp("ids.npy")),
                                read_npy(tmp("step_logits.npy"))};
  };
  const fs::path file = m / "model.safetensors";
  std::map<std::string, NdArray> all;
  {
    const SafetensorsFile f = SafetensorsFile::open(file, /*windows=*/false);
    for (const auto& n : f.names()) all[n] = f.load(n);
  }
  write_safetensors(file, all);
  const std::vector<NdArray> mapped = outputs("");
  EXPECT_EQ(mapped[1], tokens);
  EXPECT_EQ(outputs(" --no-mmap"), mapped);
  std::string img = slurp(file);
  std::uint64_t n = 0;
  std::memcpy(&n, img.data(), 8);
  img.insert(8 + n, "    ");
  n += 4;
  std::memcpy(img.data(), &n, 8);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << img;
  EXPECT_EQ(outputs(""), mapped);
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
  expect_fails(edit_config("llama", [](auto& c) { c["model_type"] = "falcon"; }),
               "model_type 'falcon' is not one qkv runs (llama, qwen2, mistral, gpt2, bert)", "model type", tokens);
  fs::remove_all(tmp("llama"));
  // GPT-2: what qkv does not implement is refused by name, never run differently; the checkpoint's
  // weights are checked against n_embd / n_inner as Llama's are against hidden_size.
  const fs::path gpt2_tokens = kLlamaFixtures / "gpt2" / "tokens.npy";
  for (const auto& [key, value, says] : std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"activation_function", "swish", "activation_function 'swish' is not one qkv runs for gpt2"},
           {"scale_attn_weights", false, "scale_attn_weights is false"},
           {"scale_attn_by_inverse_layer_idx", true, "`scale_attn_by_inverse_layer_idx` is true"},
           {"n_embd", 30, "n_embd (30) is not a multiple of n_head (4)"},
           {"n_inner", 64, "`h.0.mlp.c_fc.weight` is [32, 128], config.json makes it [32, 64]"},
           {"tie_word_embeddings", false, "the checkpoint has no `lm_head.weight`"}}) {
    expect_fails(edit_config("gpt2", [&](auto& c) { c[key] = value; }), says, key, gpt2_tokens);
    fs::remove_all(tmp("gpt2"));
  }

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

  // Issue 28 items 2 and 11: a value nested a million levels deep (it overflowed the stack while
  // the message was built), and user data in messages bounded and escaped: a 1 MB model_type, a
  // shard name with a NUL byte (the message ended at it) or a newline.
  fs::remove_all(tmp("llama"));
  {
    const fs::path m = copy_model("llama", tmp("deep"));
    std::string text = slurp(m / "config.json");
    const auto at = text.find("\"hidden_size\": ") + 15;
    const auto end = text.find_first_of(",}", at);
    text.replace(at, end - at, std::string(1000000, '[') + std::string(1000000, ']'));
    write_text(m / "config.json", text);
    expect_fails(m, "nests arrays or objects deeper than 64 levels", "deep hidden_size", tokens);
  }
  {
    const Result r = [&] {
      const fs::path m = edit_config("llama", [](auto& c) { c["model_type"] = std::string(1 << 20, 'x') + "\n"; });
      return run("run causal-lm --model " + m.string() + " --tokens " + tokens.string() + " --logits-out " +
                 tmp("logits.npy"));
    }();
    EXPECT_EQ(r.code, 1);
    EXPECT_THAT(r.err, HasSubstr("model_type 'xxxx"));
    EXPECT_THAT(r.err, HasSubstr("... (1048577 bytes) is not one qkv runs"));
    EXPECT_LT(r.err.size(), 400u) << r.err.substr(0, 400);
    fs::remove_all(tmp("llama"));
  }
  for (const std::string& shard : {std::string("model-00001\0-of-00002.safetensors", 33), std::string("a\nb")}) {
    const fs::path m = copy_model("qwen2", tmp("qwen2"));
    std::ifstream in(m / "model.safetensors.index.json");
    auto index = nlohmann::json::parse(in);
    in.close();
    index["weight_map"]["model.norm.weight"] = shard;
    write_text(m / "model.safetensors.index.json", index.dump());
    expect_fails(m,
                 shard[1] == '\n' ? "the shard 'a\\nb' of 'model.norm.weight' is not a file of the model folder"
                                  : "the shard 'model-00001\\x00-of-00002.safetensors' of 'model.norm.weight'",
                 "a shard name with a control character", tokens);
    fs::remove_all(m);
  }

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

TEST_F(Cli, CausalLmConvertsF32WeightsToBf16AsItReadsThemWithANote) {
  // Each weight converted as it is read (its f32 copy freed before the next: the f32 checkpoint
  // is never resident whole beside its bf16 copy), and still named in the one note.
  const fs::path m = copy_model("mistral", tmp("mistral_f32"));
  const Result r = run("run causal-lm --dtype bf16 --model " + m.string() + " --tokens " + (m / "tokens.npy").string() +
                       " --logits-out " + tmp("logits_bf16.npy"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("the model computes in bf16 (--dtype bf16); converted on load: "));
  EXPECT_THAT(r.err, HasSubstr(" stored as f32 (model."));
  EXPECT_EQ(read_npy(tmp("logits_bf16.npy")).dtype, DType::bf16);
  EXPECT_LT(error(tmp("logits_bf16.npy"), (m / "expected_logits_f64.npy").string()), 0.5);
}

// --- qkv run encoder-model: BERT checkpoints (tests/numerics/make_bert_fixtures.py) ----------------

const fs::path kBertFixtures = fs::path(QKV_FIXTURES_DIR).parent_path() / "bert_fixtures";

TEST_F(Cli, RunEncoderModelMatchesThePyTorchReferenceOnEveryBertCheckpoint) {
  // bert: BertModel's layout, two sequences (the second padded), two segments, the pooler;
  // bert_mlm: BertForMaskedLM's (`bert.` names, LayerNorm gamma/beta, a cls head, no pooler).
  for (const std::string name : {"bert", "bert_mlm"}) {
    const fs::path dir = kBertFixtures / name;
    std::ifstream in(dir / "case.json");
    const double tol = nlohmann::json::parse(in).at("tol").get<double>();
    const bool pooled = fs::exists(dir / "expected_pooled_f64.npy");
    std::string args = "run encoder-model --model " + dir.string() + " --tokens " + (dir / "tokens.npy").string() +
                       " --out " + tmp("hidden.npy");
    if (fs::exists(dir / "attention_mask.npy")) args += " --attention-mask " + (dir / "attention_mask.npy").string();
    if (fs::exists(dir / "token_type_ids.npy")) args += " --token-type-ids " + (dir / "token_type_ids.npy").string();
    if (pooled) args += " --pooled-out " + tmp("pooled.npy");
    for (const std::string backend : {"cpu", "reference"}) {
      const Result r = run(args + " --backend " + backend);
      ASSERT_EQ(r.code, 0) << name << " on " << backend << ": " << r.err;
      EXPECT_LE(error(tmp("hidden.npy"), (dir / "expected_hidden_f64.npy").string()), tol) << name << " " << backend;
      if (pooled) {
        EXPECT_LE(error(tmp("pooled.npy"), (dir / "expected_pooled_f64.npy").string()), tol) << name << " " << backend;
      }
    }
  }
  // The mask and the segments change the result (they are not silently dropped).
  const fs::path dir = kBertFixtures / "bert";
  const Result r = run("run encoder-model --model " + dir.string() + " --tokens " + (dir / "tokens.npy").string() +
                       " --out " + tmp("plain.npy"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_GT(error(tmp("plain.npy"), (dir / "expected_hidden_f64.npy").string()), 1e-2);
}

TEST_F(Cli, EncoderModelProblemsAreOneLineEach) {
  const fs::path bert = kBertFixtures / "bert";
  const std::string tokens = (bert / "tokens.npy").string();
  auto expect = [&](const std::string& args, int code, const std::string& says) {
    const Result r = run(args);
    EXPECT_EQ(r.code, code) << args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(says)) << args;
    expect_one_line_error(r);
    EXPECT_FALSE(fs::exists(tmp("out.npy"))) << args;
  };
  const std::string out = " --out " + tmp("out.npy");
  // The wrong command for the model, each way.
  expect("run encoder-model --model " + (kLlamaFixtures / "gpt2").string() + " --tokens " + tokens + out, 2,
         "a gpt2 model is a decoder; run it with `qkv run causal-lm` or `qkv generate`");
  expect("run causal-lm --model " + bert.string() + " --tokens " + tokens + " --logits-out " + tmp("out.npy"), 2,
         "a bert model is an encoder; run it with `qkv run encoder-model`");
  expect("run encoder-model --model " + (kBertFixtures / "bert_mlm").string() + " --tokens " +
             (kBertFixtures / "bert_mlm" / "tokens.npy").string() + out + " --pooled-out " + tmp("p.npy"),
         2, "has no pooler (pooler.dense.weight)");
  // Masks and segments: values, shapes, a sequence with no token.
  const NdArray ids = read_npy(tokens);
  NdArray mask = NdArray::zeros(DType::i64, ids.shape);
  for (auto& x : mask.as<std::int64_t>()) x = 1;
  mask.as<std::int64_t>()[3] = 2;
  write_npy(tmp("mask.npy"), mask);
  expect("run encoder-model --model " + bert.string() + " --tokens " + tokens + out + " --attention-mask " +
             tmp("mask.npy"),
         1, "--attention-mask: entry 3 is 2; only 0 and 1 are allowed");
  const auto L = static_cast<std::size_t>(ids.shape[1]);
  for (std::size_t i = 0; i < mask.as<std::int64_t>().size(); ++i) mask.as<std::int64_t>()[i] = i < L ? 1 : 0;
  write_npy(tmp("mask.npy"), mask);
  expect("run encoder-model --model " + bert.string() + " --tokens " + tokens + out + " --attention-mask " +
             tmp("mask.npy"),
         1, "--attention-mask: sequence 1 has no token (every entry is 0)");
  NdArray types = NdArray::zeros(DType::i64, ids.shape);
  types.as<std::int64_t>()[5] = 2;
  write_npy(tmp("types.npy"), types);
  expect("run encoder-model --model " + bert.string() + " --tokens " + tokens + out + " --token-type-ids " +
             tmp("types.npy"),
         1, "token id 2 at index 5 is outside the token types (type_vocab_size) of 2");
  write_npy(tmp("types.npy"), NdArray::zeros(DType::i64, {ids.shape[0], ids.shape[1] - 1}));
  expect("run encoder-model --model " + bert.string() + " --tokens " + tokens + out + " --token-type-ids " +
             tmp("types.npy"),
         1, "--token-type-ids: shape (2, 8) must be the tokens' (2, 9)");
  write_npy(tmp("long.npy"), NdArray::zeros(DType::i64, {1, 25}));
  expect("run encoder-model --model " + bert.string() + " --tokens " + tmp("long.npy") + out, 2,
         "--tokens: 25 tokens exceed max_position_embeddings (24) of the model");
}

}  // namespace
}  // namespace qkv
