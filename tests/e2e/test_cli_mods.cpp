// `qkv run sdpa` (--window, --softcap, --alibi-slopes, --q-doc-ids / --kv-doc-ids, --prefix-len,
// --align, --lse-out) and `qkv run mha` (--window, --alibi-slopes) against PyTorch references
// built from explicit masks and biases (tests/numerics/make_mod_fixtures.py), on both CPU
// backends; and the flags' refusals.
#include "cli_test.hpp"

using ::testing::HasSubstr;

namespace qkv {
namespace {

using namespace qkv::test;

const fs::path kModFixtures = fs::path(QKV_FIXTURES_DIR).parent_path() / "mod_fixtures";

/// The case's flags with its file names resolved into the fixture directory.
std::string mod_flags(const std::string& name, const nlohmann::json& args) {
  std::string out;
  for (const auto& a : args) {
    std::string s = a.get<std::string>();
    if (s.ends_with(".npy") || s.ends_with(".safetensors")) s = (kModFixtures / name / s).string();
    out += " '" + s + "'";
  }
  return out;
}

/// f(name, dir, config) for each fixture of `command` ("sdpa" unless the config says); returns
/// how many there were.
template <class F>
int for_each_fixture(const std::string& command, F&& f) {
  int cases = 0;
  for (const auto& dir : fs::directory_iterator(kModFixtures)) {
    std::ifstream in(dir.path() / "config.json");
    const auto c = nlohmann::json::parse(in);
    if (c.value("command", "sdpa") != command) continue;
    f(dir.path().filename().string(), dir.path(), c);
    ++cases;
  }
  return cases;
}

TEST_F(Cli, RunSdpaModsMatchPyTorchOnBothBackends) {
  const int cases =
      for_each_fixture("sdpa", [&](const std::string& name, const fs::path& dir, const nlohmann::json& c) {
        for (const std::string backend : {"cpu", "reference"}) {
          const Result r =
              run("run sdpa" + mod_flags(name, c.at("args")) + " --out " + tmp("o.npy") + " --weights-out " +
                  tmp("w.npy") + " --lse-out " + tmp("lse.npy") + " --backend " + backend);
          ASSERT_EQ(r.code, 0) << name << " on " << backend << ": " << r.err;
          EXPECT_LE(error(tmp("o.npy"), (dir / "expected_out_f64.npy").string()), c.at("tol_out").get<double>())
              << name << " on " << backend;
          EXPECT_LE(error(tmp("w.npy"), (dir / "expected_weights_f64.npy").string()), c.at("tol_weights").get<double>())
              << name << " on " << backend;
          EXPECT_LE(error(tmp("lse.npy"), (dir / "expected_lse_f64.npy").string()), c.at("tol_lse").get<double>())
              << name << " on " << backend;
          // Without the weights the kernel takes its one-pass path: the same log-sum-exp.
          if (backend == std::string("cpu")) {
            ASSERT_EQ(run("run sdpa" + mod_flags(name, c.at("args")) + " --out " + tmp("o1.npy") + " --lse-out " +
                          tmp("lse1.npy"))
                          .code,
                      0);
            EXPECT_LE(error(tmp("lse1.npy"), (dir / "expected_lse_f64.npy").string()), c.at("tol_lse").get<double>())
                << name << " (one pass)";
          }
        }
      });
  EXPECT_EQ(cases, 6);
}

TEST_F(Cli, RunMhaWindowAndAlibiMatchPyTorch) {
  // nn.MultiheadAttention given the window and ALiBi as an explicit float attn_mask
  // [B*H, L, S]; qkv takes them as flags (self-attention, and cross-attention with L != S
  // aligned bottom-right).
  const int cases = for_each_fixture("mha", [&](const std::string& name, const fs::path& dir, const nlohmann::json& c) {
    for (const std::string backend : {"cpu", "reference"}) {
      const Result r =
          run("run mha" + mod_flags(name, c.at("args")) + " --out " + tmp("o.npy") + " --backend " + backend);
      ASSERT_EQ(r.code, 0) << name << " on " << backend << ": " << r.err;
      EXPECT_LE(error(tmp("o.npy"), (dir / "expected_out_f64.npy").string()), c.at("tol_out").get<double>())
          << name << " on " << backend;
    }
  });
  EXPECT_EQ(cases, 2);
  // The appended keys of add_zero_attn have no position.
  const fs::path self = kModFixtures / "mha_window_alibi_self";
  expect_usage_error(
      run("run mha --weights " + (self / "weights.safetensors").string() + " --query " + (self / "query.npy").string() +
          " --heads 4 --add-zero-attn --window 3,0 --out " + tmp("o.npy")),
      "have no position", "--window with --add-zero-attn");
  // Cross-attention with L != S: positions need an alignment.
  const fs::path cross = kModFixtures / "mha_window_alibi_cross_bottom_right";
  const std::string base = "run mha --weights " + (cross / "weights.safetensors").string() + " --query " +
                           (cross / "query.npy").string() + " --key " + (cross / "memory.npy").string() +
                           " --heads 3 --out " + tmp("o.npy");
  expect_usage_error(run(base + " --window 3,0"), "need an alignment", "L != S without --align");
  const Result bad = run(base + " --alibi-slopes " + (self / "slopes.npy").string() + " --align top-left");
  EXPECT_EQ(bad.code, 1) << bad.err;
  EXPECT_THAT(bad.err, HasSubstr("--alibi-slopes: shape (4,), expected [H] = (3) or [B, H]"));
}

TEST_F(Cli, RunSdpaModFlagsRefuseWhatTheyCannotMean) {
  const std::string d = (kModFixtures / "window_gqa_bottom_right").string();
  const std::string base =
      "run sdpa --query " + d + "/q.npy --key " + d + "/k.npy --value " + d + "/v.npy --out " + tmp("o.npy");
  expect_usage_error(run(base + " --window 9,3"), "need an alignment", "L != S without --align");
  expect_usage_error(run(base + " --align top-left --window 9"), "--window takes LEFT,RIGHT", "one number");
  expect_usage_error(run(base + " --align top-left --window 9,x"), "--window takes LEFT,RIGHT", "not a number");
  expect_usage_error(run(base + " --align top-left --window -2,3"), "must be >= -1", "below -1");
  expect_usage_error(run(base + " --softcap 0"), "--softcap must be a positive number", "zero cap");
  expect_usage_error(run(base + " --q-doc-ids " + d + "/q.npy"), "go together", "one side of the documents");
  const Result slopes = run(base + " --align top-left --alibi-slopes " + d + "/q.npy");
  EXPECT_EQ(slopes.code, 1) << slopes.err;
  EXPECT_THAT(slopes.err, HasSubstr("--alibi-slopes: shape"));
  EXPECT_FALSE(fs::exists(tmp("o.npy")));
}

TEST_F(Cli, ShapeCommandsTakeTheModsAndTheHeaderListsTheirTensors) {
  const std::string shape = " sdpa --heads 4 --kv-heads 2 --seq 45 --kv-seq 70 --head-dim 32";
  const Result v = run("verify" + shape + " --window 16,2 --alibi --documents 3 --softcap 20 --align bottom-right");
  EXPECT_EQ(v.code, 0) << v.err;
  const Result b = run("bench" + shape + " --window 16,2 --align top-left --repeat 1 --json");
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_THAT(b.out, HasSubstr("\"gflops\""));
  const Result e =
      run("emit sdpa --heads 4 --seq 64 --head-dim 32 --window 16,0 --documents 2 --alibi --out " + tmp("m.so"));
  ASSERT_EQ(e.code, 0) << e.err;
  const std::string h = slurp(tmp("m.h"));
  for (const char* arg : {"const float* alibi_slopes", "const float* q_doc_ids", "const float* kv_doc_ids"})
    EXPECT_THAT(h, HasSubstr(arg));
  expect_usage_error(run("verify mha --heads 2 --seq 8 --embed-dim 16 --window 2,2"), "are the sdpa model's",
                     "mods on mha");
}

}  // namespace
}  // namespace qkv
