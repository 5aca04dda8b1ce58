// `qkv train` end to end on a tiny Llama (2 layers, width 32, the 256 byte ids) and a generated
// text: the loss goes down and the checkpoint runs in `qkv generate`; a run stopped and resumed
// equals an uninterrupted one bit for bit (the weights, the optimizer's moments, the history); the
// CPU backend's results do not depend on the thread count; Ctrl-C saves and stops; hostile input
// is one line and a non-zero exit, and a failed checkpoint leaves the previous one as it was.
// The reference backend (the interpreter) runs where compiled code is not the point: it needs no
// compile, so these runs take milliseconds per step.
#include "cli_test.hpp"

#include <sys/inotify.h>
#include <sys/stat.h>

using ::testing::HasSubstr;

namespace qkv {
namespace {

using namespace qkv::test;

const nlohmann::json kConfig = {{"model_type", "llama"},    {"hidden_size", 32},
                                {"intermediate_size", 64},  {"num_hidden_layers", 2},
                                {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                                {"vocab_size", 256},        {"max_position_embeddings", 64},
                                {"rms_norm_eps", 1e-5},     {"tie_word_embeddings", false}};

/// A small text with a lot of structure: a few sentences in a pseudo-random order (~3 KB).
std::string corpus() {
  const char* sentences[] = {"the query asks. ", "the key answers. ", "the value is carried. ",
                             "softmax normalises the scores. ", "a mask hides the future. "};
  std::string text;
  std::uint32_t x = 12345;
  while (text.size() < 3000) {
    x = x * 1664525u + 1013904223u;
    text += sentences[(x >> 16) % 5];
  }
  return text;
}

class Train : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    fs::create_directories(dir_ / "tiny");
    write_text(dir_ / "tiny" / "config.json", kConfig.dump(1));
    write_text(dir_ / "corpus.txt", corpus());
  }
  /// `qkv train` on the tiny config and the corpus, with `flags`.
  Result train(const std::string& flags) const {
    return run("train --config " + tmp("tiny/config.json") + " --data " + tmp("corpus.txt") + " " + flags);
  }
  static nlohmann::json json_of(const std::string& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  }
};

TEST_F(Train, TheLossGoesDownAndTheCheckpointRunsInGenerate) {
  const Result r =
      train("--backend reference --steps 40 --batch 4 --seq 32 --lr 1e-2 --warmup 4 --eval-every 10 --out " +
            tmp("run") + " --log-json " + tmp("log.json") + " --plot " + tmp("loss.png"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("tok/s"));
  EXPECT_THAT(r.err, HasSubstr("val "));
  const auto log = json_of(tmp("log.json"));
  const auto& train = log.at("history").at("train");
  ASSERT_EQ(train.size(), 40u);
  // The first loss is about ln 256 = 5.55 (random weights of std 0.02); the text is repetitive.
  const double first = train[0][1].get<double>();
  double last = 0;
  for (std::size_t i = 35; i < 40; ++i) last += train[i][1].get<double>() / 5;
  EXPECT_NEAR(first, std::log(256.0), 0.1);
  EXPECT_LT(last, 0.6 * first) << "the loss did not go down";
  const auto& val = log.at("history").at("val");
  ASSERT_EQ(val.size(), 4u);  // steps 10, 20, 30, 40
  EXPECT_LT(val[3][1].get<double>(), val[0][1].get<double>());
  // The warmup: step 1's lr is lr / 4; the cosine ends at min_lr = lr / 10.
  EXPECT_NEAR(train[0][2].get<double>(), 2.5e-3, 1e-9);
  EXPECT_NEAR(train[39][2].get<double>(), 1e-3, 1e-9);
  EXPECT_EQ(slurp(tmp("loss.png")).substr(0, 8), "\x89PNG\r\n\x1a\n");
  EXPECT_EQ(json_of(tmp("run/trainer_state.json")).at("step"), 40);
  EXPECT_EQ(json_of(tmp("run/config.json")), kConfig);

  // The checkpoint is a Hugging Face model folder: qkv generate runs it, and it has learnt the
  // text ("the " is followed by one of the sentences' next words).
  NdArray ids = NdArray::zeros(DType::i64, {1, 4});
  for (std::size_t i = 0; i < 4; ++i) ids.as<std::int64_t>()[i] = std::string("the ")[i];
  write_npy(tmp("prompt.npy"), ids);
  const Result g = run("generate --model " + tmp("run") + " --prompt-ids " + tmp("prompt.npy") +
                       " --new-tokens 4 --backend reference --out " + tmp("ids.npy"));
  ASSERT_EQ(g.code, 0) << g.err;
  const NdArray out = read_npy(tmp("ids.npy"));
  ASSERT_EQ(out.shape, (std::vector<std::int64_t>{1, 8}));
}

TEST_F(Train, AResumedRunEqualsAnUninterruptedOneBitForBit) {
  const std::string common = "--backend reference --steps 8 --batch 2 --seq 16 --warmup 2 --eval-every 3 ";
  ASSERT_EQ(train(common + "--out " + tmp("a")).code, 0);
  const Result stopped = train(common + "--stop-at 3 --out " + tmp("b"));
  ASSERT_EQ(stopped.code, 0) << stopped.err;
  EXPECT_THAT(stopped.err, HasSubstr("stopped after step 3 of 8"));
  EXPECT_EQ(json_of(tmp("b/trainer_state.json")).at("step"), 3);
  // A setting that would change the numbers is refused; the data must be the same text.
  expect_usage_error(run("train --resume " + tmp("b") + " --data " + tmp("corpus.txt") + " --lr 0.5 --out " + tmp("b")),
                     "--lr differs from the run being resumed", "--lr on resume");
  write_text(dir_ / "other.txt", corpus() + "!");
  const Result other = run("train --resume " + tmp("b") + " --data " + tmp("other.txt") + " --out " + tmp("b"));
  EXPECT_EQ(other.code, 1);
  EXPECT_THAT(other.err, HasSubstr("not the text the run being resumed trained on"));
  const Result resumed =
      run("train --resume " + tmp("b") + " --data " + tmp("corpus.txt") + " --backend reference --out " + tmp("b"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "trainer_state.json", "config.json"})
    EXPECT_TRUE(slurp(tmp(std::string("a/") + f)) == slurp(tmp(std::string("b/") + f))) << f << " differs";
}

// --tokenizer: the pieces of a SentencePiece model (the 64-piece fixture of the generate --prompt
// tests) are the tokens; the checkpoint carries the model, so generate --prompt continues text; a
// resumed run keeps its own tokenizer, bit for bit as an uninterrupted one.
TEST_F(Train, ASentencePieceTokenizerTrainsAndTravelsWithTheCheckpoint) {
  const std::string spm = (fs::path(QKV_FIXTURES_DIR).parent_path() / "tokenizer" / "tokenizer.model").string();
  nlohmann::json config = kConfig;
  config["vocab_size"] = 64;
  fs::create_directories(dir_ / "spm");
  write_text(dir_ / "spm" / "config.json", config.dump(1));
  std::string text;
  for (int i = 0; i < 30; ++i)
    text += "the cat sat on the mat and the dog sat on the log\nattention is all you need said the paper\n";
  write_text(dir_ / "spm.txt", text);
  const std::string base = "train --config " + tmp("spm/config.json") + " --data " + tmp("spm.txt") +
                           " --backend reference --steps 24 --batch 4 --seq 24 --lr 1e-2 --warmup 3 --eval-every 8 ";
  const Result r = run(base + "--tokenizer " + spm + " --out " + tmp("a") + " --log-json " + tmp("log.json"));
  if (r.code != 0 && r.err.find("built without SentencePiece") != std::string::npos)
    GTEST_SKIP() << "qkv was built without SentencePiece";
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr(" tokens ("));  // counted in pieces, not bytes
  const auto log = json_of(tmp("log.json"));
  const auto& hist = log.at("history").at("train");
  const double first = hist[0][1].get<double>(), last = hist[23][1].get<double>();
  EXPECT_NEAR(first, std::log(64.0), 0.1);
  EXPECT_LT(last, 0.6 * first) << "the loss did not go down";
  EXPECT_TRUE(slurp(tmp("a/tokenizer.model")) == slurp(spm));
  EXPECT_EQ(json_of(tmp("a/trainer_state.json")).at("tokenizer"), "sentencepiece");
  const Result g = run("generate --model " + tmp("a") + " --prompt 'the cat' --new-tokens 6 --out " + tmp("ids.npy"));
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_THAT(g.out, ::testing::StartsWith("the cat"));

  // Stopped and resumed without --tokenizer: the run's own is used, and the end is the same.
  ASSERT_EQ(run(base + "--tokenizer " + spm + " --stop-at 10 --out " + tmp("b")).code, 0);
  const Result resumed =
      run("train --resume " + tmp("b") + " --data " + tmp("spm.txt") + " --backend reference --out " + tmp("b"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "trainer_state.json", "tokenizer.model"})
    EXPECT_TRUE(slurp(tmp(std::string("a/") + f)) == slurp(tmp(std::string("b/") + f))) << f << " differs";

  // A byte-level run does not switch tokenizers on resume; a tokenizer larger than the vocabulary
  // is one line.
  ASSERT_EQ(train("--backend reference --steps 4 --stop-at 2 --batch 2 --seq 16 --out " + tmp("c")).code, 0);
  expect_usage_error(
      run("train --resume " + tmp("c") + " --data " + tmp("corpus.txt") + " --tokenizer " + spm + " --out " + tmp("c")),
      "--tokenizer: the run being resumed trained on the text's bytes", "--tokenizer on resume");
  config["vocab_size"] = 32;
  write_text(dir_ / "spm" / "config.json", config.dump(1));
  const Result small = run(base + "--tokenizer " + spm + " --out " + tmp("d"));
  EXPECT_EQ(small.code, 1);
  EXPECT_THAT(small.err, HasSubstr("the tokenizer has 64 pieces, more than the model's vocabulary of 32"));
  EXPECT_EQ(std::count(small.err.begin(), small.err.end(), '\n'), 1) << small.err;
  EXPECT_FALSE(fs::exists(tmp("d")));
}

// --accumulate N --batch B trains on the rows of --batch N·B, the gradient of the mean loss summed
// over the micro-batches: the same losses, gradient norms and validation losses up to rounding.
TEST_F(Train, GradientAccumulationEqualsTheLargerBatch) {
  const std::string common = "--backend reference --steps 5 --seq 16 --lr 1e-2 --warmup 2 --eval-every 2 ";
  ASSERT_EQ(train(common + "--batch 4 --out " + tmp("a") + " --log-json " + tmp("a.json")).code, 0);
  const Result r = train(common + "--batch 2 --accumulate 2 --out " + tmp("b") + " --log-json " + tmp("b.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("batch 2 x 16 tokens x 2 micro-batches"));
  const auto a = json_of(tmp("a.json")).at("history"), b = json_of(tmp("b.json")).at("history");
  ASSERT_EQ(a.at("train").size(), 5u);
  ASSERT_EQ(b.at("train").size(), 5u);
  for (std::size_t i = 0; i < 5; ++i)
    for (std::size_t k : {1u, 3u}) {  // loss, gradient norm
      const double x = a.at("train")[i][k].get<double>(), y = b.at("train")[i][k].get<double>();
      EXPECT_NEAR(x, y, 1e-5 * std::abs(x)) << "step " << i + 1 << (k == 1 ? " loss" : " |g|");
    }
  ASSERT_EQ(a.at("val").size(), b.at("val").size());
  for (std::size_t i = 0; i < a.at("val").size(); ++i)
    EXPECT_NEAR(a.at("val")[i][1].get<double>(), b.at("val")[i][1].get<double>(), 1e-5) << "validation " << i;
  // A resumed run keeps its accumulation.
  expect_usage_error(run("train --resume " + tmp("b") + " --data " + tmp("corpus.txt") + " --steps 6 --accumulate 4 " +
                         "--out " + tmp("b")),
                     "--accumulate differs from the run being resumed", "--accumulate on resume");
}

TEST_F(Train, Bf16ComputeFollowsTheF32RunOverF32Weights) {
  // --dtype bf16: the model computed in bf16 (each weight read through one rounding), the loss,
  // the optimizer and the checkpoint in f32. Its losses follow the f32 run's within bf16's
  // precision, and the run goes down as far.
  const std::string common = "--backend reference --steps 20 --batch 4 --seq 32 --lr 1e-2 --warmup 2 --val-fraction 0 ";
  ASSERT_EQ(train(common + "--out " + tmp("f32") + " --log-json " + tmp("f32.json")).code, 0);
  const Result r = train(common + "--dtype bf16 --out " + tmp("bf16") + " --log-json " + tmp("bf16.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("computed in bf16 over f32 weights"));
  const auto a = json_of(tmp("f32.json")).at("history").at("train"),
             b = json_of(tmp("bf16.json")).at("history").at("train");
  ASSERT_EQ(b.size(), 20u);
  for (std::size_t i = 0; i < 20; ++i) {
    const double x = a[i][1].get<double>(), y = b[i][1].get<double>();
    EXPECT_NEAR(y, x, 0.03 * x) << "step " << i + 1;
    if (i < 3) {
      EXPECT_NE(x, y) << "step " << i + 1 << ": the bf16 run computed in f32";
    }
  }
  EXPECT_LT(b[19][1].get<double>(), 0.7 * b[0][1].get<double>()) << "the loss did not go down";
  EXPECT_EQ(json_of(tmp("bf16/trainer_state.json")).at("options").at("dtype"), "bf16");
  // The checkpoint holds the f32 master weights, and generate runs it.
  const SafetensorsFile w = SafetensorsFile::open(tmp("bf16/model.safetensors"));
  for (const auto& n : w.names()) EXPECT_EQ(w.load(n).dtype, DType::f32) << n;
  expect_usage_error(run("train --resume " + tmp("bf16") + " --data " + tmp("corpus.txt") +
                         " --steps 21 --dtype f32 --out " + tmp("bf16")),
                     "--dtype differs from the run being resumed", "--dtype on resume");
}

TEST_F(Train, Bf16ComputeAgreesOnEveryCpuAndWithTheInterpreter) {
  // The compiled bf16 step for this host (vdpbf16ps where it has AVX512-BF16) and for AVX2
  // (x86-64-v3: the bf16 GEMM widens its operands, packing the weights' gradients' A from
  // columns) against the interpreter's: losses and gradient norms within bf16's rounding. One
  // layer: each compiled run takes seconds.
  nlohmann::json one_layer = kConfig;
  one_layer["num_hidden_layers"] = 1;
  write_text(dir_ / "tiny" / "config.json", one_layer.dump());
  const std::string common = "--steps 3 --batch 2 --seq 16 --val-fraction 0 --dtype bf16 ";
  ASSERT_EQ(train(common + "--backend reference --out " + tmp("ref")).code, 0);
  const auto ref = json_of(tmp("ref/trainer_state.json")).at("history").at("train");
  for (const char* cpu : {"native", "x86-64-v3"}) {
    const Result r = train(common + "--cpu " + cpu + " --out " + tmp(cpu));
    ASSERT_EQ(r.code, 0) << cpu << ": " << r.err;
    const auto got = json_of(tmp(std::string(cpu) + "/trainer_state.json")).at("history").at("train");
    ASSERT_EQ(got.size(), 3u) << cpu;
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t k : {1u, 3u}) {  // loss, gradient norm
        const double want = ref[i][k].get<double>(), have = got[i][k].get<double>();
        EXPECT_NEAR(have, want, 1e-2 * std::abs(want)) << cpu << " step " << i + 1 << (k == 1 ? " loss" : " |g|");
      }
  }
}

TEST_F(Train, TheCpuBackendsResultsDoNotDependOnTheThreadCount) {
  // One layer: each run compiles the step (seconds).
  nlohmann::json one_layer = kConfig;
  one_layer["num_hidden_layers"] = 1;
  write_text(dir_ / "tiny" / "config.json", one_layer.dump());
  const std::string common = "--steps 2 --batch 2 --seq 16 --val-fraction 0 ";
  const Result one = train(common + "--threads 1 --out " + tmp("one"));
  ASSERT_EQ(one.code, 0) << one.err;
  ASSERT_EQ(train(common + "--threads 2 --out " + tmp("two")).code, 0);
  EXPECT_TRUE(slurp(tmp("one/model.safetensors")) == slurp(tmp("two/model.safetensors")));
  EXPECT_TRUE(slurp(tmp("one/optimizer.safetensors")) == slurp(tmp("two/optimizer.safetensors")));
  // And the compiled step agrees with the interpreter's.
  ASSERT_EQ(train(common + "--backend reference --out " + tmp("ref")).code, 0);
  const auto a = json_of(tmp("one/trainer_state.json")).at("history").at("train"),
             b = json_of(tmp("ref/trainer_state.json")).at("history").at("train");
  for (std::size_t i = 0; i < 2; ++i)
    EXPECT_NEAR(a[i][1].get<double>(), b[i][1].get<double>(), 1e-4) << "step " << i + 1;
}

TEST_F(Train, CtrlCSavesACheckpointAndStops) {
  const Process p = start({"train", "--config", tmp("tiny/config.json"), "--data", tmp("corpus.txt"), "--backend",
                           "reference", "--steps", "1000000", "--batch", "1", "--seq", "8", "--out", tmp("run")});
  // Wait for the first progress line (told by the kernel when qkv writes its stderr, inotify, or
  // when it ends, its pidfd: no polling on a clock), then interrupt.
  const int written = ::inotify_init1(IN_CLOEXEC);
  ASSERT_GE(written, 0);
  ASSERT_GE(::inotify_add_watch(written, dir_.c_str(), IN_CREATE | IN_MODIFY), 0);  // its stderr file is in dir_
  const int ended = static_cast<int>(::syscall(SYS_pidfd_open, p.pid, 0));
  ASSERT_GE(ended, 0);
  bool stepped = slurp(p.err).find("step ") != std::string::npos, exited = false;
  while (!stepped && !exited) {
    pollfd fds[2] = {{written, POLLIN, 0}, {ended, POLLIN, 0}};
    if (::poll(fds, 2, 120'000) <= 0) break;  // a deadline against a hang, not a pace
    exited = (fds[1].revents & POLLIN) != 0;
    if (fds[0].revents & POLLIN) {
      alignas(inotify_event) char events[4096];
      (void)!::read(written, events, sizeof events);
      stepped = slurp(p.err).find("step ") != std::string::npos;
    }
  }
  ::close(written);
  ::close(ended);
  ASSERT_TRUE(stepped) << "qkv train ended before its first step";
  ::kill(p.pid, SIGINT);
  const Result r = wait(p);
  EXPECT_EQ(r.code, 130) << r.err;
  EXPECT_THAT(r.err, HasSubstr("stopping after this step"));
  const auto state = json_of(tmp("run/trainer_state.json"));
  EXPECT_GE(state.at("step").get<int>(), 1);
  EXPECT_LT(state.at("step").get<int>(), 1000000);
}

TEST_F(Train, HostileInputIsOneLineAndTheLastCheckpointSurvivesAFullDisk) {
  const std::string model = "--config " + tmp("tiny/config.json") + " --steps 2 --batch 1 ";
  auto expect_failure = [&](const std::string& args, int code, const std::string& says) {
    const Result r = run("train " + args + (args.find("--seq") == std::string::npos ? " --seq 8" : "") +
                         (args.find("--backend") == std::string::npos ? " --backend reference" : ""));
    EXPECT_EQ(r.code, code) << args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(says)) << args;
    expect_one_line_error(r);
  };
  ASSERT_EQ(::mkfifo(tmp("fifo").c_str(), 0644), 0);
  expect_failure(model + "--data " + tmp("fifo") + " --out " + tmp("o"), 1, "fifo");
  expect_failure(model + "--data " + tmp("tiny") + " --out " + tmp("o"), 1, "tiny");
  write_text(dir_ / "empty.txt", "");
  expect_failure(model + "--data " + tmp("empty.txt") + " --out " + tmp("o"), 1, "the file is empty");
  write_text(dir_ / "binary.txt", std::string("abc\0def", 7));
  expect_failure(model + "--data " + tmp("binary.txt") + " --out " + tmp("o"), 1, "a NUL byte at offset 3");
  write_text(dir_ / "short.txt", "0123456");
  expect_failure(model + "--data " + tmp("short.txt") + " --out " + tmp("o"), 1, "fewer than --seq + 1 = 9");
  expect_failure(model + "--data " + tmp("corpus.txt") + " --out " + tmp("corpus.txt"), 2, "is a file, not a folder");
  expect_failure(model + "--data " + tmp("corpus.txt") + " --out /proc", 1,
                 "cannot create a temporary file in '/proc'");
  expect_failure("--model " + tmp("tiny") + " --data " + tmp("corpus.txt") + " --out " + tmp("tiny"), 2,
                 "is the --model folder");
  expect_failure(model + "--data " + tmp("corpus.txt") + " --seq 65 --out " + tmp("o"), 2,
                 "exceeds max_position_embeddings (64)");
  expect_failure(model + "--data " + tmp("corpus.txt") + " --backend cuda --out " + tmp("o"), 2, "runs on the CPU");
  nlohmann::json small = kConfig;
  small["vocab_size"] = 65;
  fs::create_directories(dir_ / "small");
  write_text(dir_ / "small" / "config.json", small.dump());
  expect_failure("--config " + tmp("small/config.json") + " --data " + tmp("corpus.txt") + " --out " + tmp("o"), 2,
                 "needs 256 ids");
  expect_failure("--resume " + tmp("nothing") + " --data " + tmp("corpus.txt") + " --out " + tmp("o"), 1,
                 "trainer_state.json");
  // A trainer_state.json that is not one qkv wrote: nested a million deep, a batch of 0.
  fs::create_directories(dir_ / "bad");
  write_text(dir_ / "bad" / "trainer_state.json", std::string(1000000, '['));
  expect_failure("--resume " + tmp("bad") + " --data " + tmp("corpus.txt") + " --out " + tmp("o"), 1,
                 "nests arrays or objects deeper than 64 levels");
  ASSERT_EQ(
      run("train " + model + "--seq 8 --backend reference --data " + tmp("corpus.txt") + " --out " + tmp("ok")).code,
      0);
  auto state = json_of(tmp("ok/trainer_state.json"));
  state["options"]["batch"] = 0;
  write_text(dir_ / "ok" / "trainer_state.json", state.dump());
  expect_failure("--resume " + tmp("ok") + " --data " + tmp("corpus.txt") + " --out " + tmp("o"), 1,
                 "`batch` is out of range: 0");
  EXPECT_FALSE(fs::exists(tmp("o")));

  // A checkpoint that cannot be written (a file-size limit: a disk that fills up) fails in one
  // line, and the previous checkpoint stays as it was.
  ASSERT_EQ(
      run("train " + model + "--seq 8 --backend reference --data " + tmp("corpus.txt") + " --out " + tmp("run")).code,
      0);
  const std::string before = slurp(tmp("run/model.safetensors")) + slurp(tmp("run/trainer_state.json"));
  const auto names = listing(tmp("run"));
  const Result full = run_argv({"train", "--resume", tmp("run"), "--data", tmp("corpus.txt"), "--steps", "4",
                                "--backend", "reference", "--out", tmp("run")},
                               {.file_size = 2048});
  EXPECT_EQ(full.code, 1) << full.err;
  // Progress lines, then the error as the last line.
  EXPECT_THAT(full.err,
              HasSubstr("qkv: error: --out " + tmp("run") + "/model.safetensors: cannot write: File too large\n"));
  EXPECT_TRUE(full.err.ends_with("File too large\n")) << full.err;
  EXPECT_EQ(slurp(tmp("run/model.safetensors")) + slurp(tmp("run/trainer_state.json")), before);
  EXPECT_EQ(listing(tmp("run")), names);
}

}  // namespace
}  // namespace qkv
