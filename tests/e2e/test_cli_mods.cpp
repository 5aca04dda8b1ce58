// `qkv run sdpa` with score and mask modifications (--window, --softcap, --alibi-slopes,
// --q-doc-ids / --kv-doc-ids, --prefix-len, --align) against PyTorch references built from
// explicit masks and biases (tests/numerics/make_mod_fixtures.py), on both CPU backends; and the
// flags' refusals.
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
    if (s.size() > 4 && s.ends_with(".npy")) s = (kModFixtures / name / s).string();
    out += " '" + s + "'";
  }
  return out;
}

TEST_F(Cli, RunSdpaModsMatchPyTorchOnBothBackends) {
  int cases = 0;
  for (const auto& dir : fs::directory_iterator(kModFixtures)) {
    const std::string name = dir.path().filename().string();
    std::ifstream in(dir.path() / "config.json");
    const auto c = nlohmann::json::parse(in);
    for (const std::string backend : {"cpu", "reference"}) {
      const Result r = run("run sdpa" + mod_flags(name, c.at("args")) + " --out " + tmp("o.npy") + " --weights-out " +
                           tmp("w.npy") + " --backend " + backend);
      ASSERT_EQ(r.code, 0) << name << " on " << backend << ": " << r.err;
      EXPECT_LE(error(tmp("o.npy"), (dir.path() / "expected_out_f64.npy").string()), c.at("tol_out").get<double>())
          << name << " on " << backend;
      EXPECT_LE(error(tmp("w.npy"), (dir.path() / "expected_weights_f64.npy").string()),
                c.at("tol_weights").get<double>())
          << name << " on " << backend;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 6);
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
