// qkv emit train-step on bad input (issue 32, item 4): every refusal is one line and a non-zero
// exit, and leaves nothing behind; and what a good run writes (a directory --out: the library
// and its header, whose training-step section lists the weights and the state). The trained
// numbers are checked by the C program of e2e.aot_train_step (tests/e2e/aot/train_step_main.c).
#include "cli_test.hpp"

namespace {

using namespace qkv::test;
using ::testing::HasSubstr;
using ::testing::Not;

const fs::path kTrain = fs::path(QKV_FIXTURES_DIR).parent_path() / "train_fixtures";
const fs::path kBert = fs::path(QKV_FIXTURES_DIR).parent_path() / "bert_fixtures";

class TrainStep : public Cli {
 protected:
  [[nodiscard]] Result emit(const std::vector<std::string>& extra) const {
    std::vector<std::string> a{"emit", "train-step"};
    a.insert(a.end(), extra.begin(), extra.end());
    return run_argv(a);
  }
  static std::string config() { return (kTrain / "adamw" / "config.json").string(); }
};

TEST_F(TrainStep, BadInputIsOneLineAndLeavesNothing) {
  fs::create_directories(tmp("out"));
  fs::create_directories(tmp("out/qkv_train.h"));  // in the way of the header
  write_text(tmp("bad.json"), "{not json");
  const auto before = listing();
  const std::string ok_out = tmp("x.so");
  expect_usage_error(emit({"--seq", "7", "--out", ok_out}), "--config", "no config");
  expect_usage_error(emit({"--config", config(), "--out", ok_out}), "--seq", "no --seq");
  expect_usage_error(emit({"--config", config(), "--seq", "0", "--out", ok_out}), "--seq", "--seq 0");
  expect_usage_error(emit({"--config", config(), "--seq", "40", "--out", ok_out}), "max_position_embeddings",
                     "--seq past the positions");
  expect_usage_error(emit({"--config", config(), "--seq", "7", "--optimizer", "adam", "--out", ok_out}), "--optimizer",
                     "an unknown optimizer");
  expect_usage_error(emit({"--config", config(), "--seq", "7", "--momentum", "0.9", "--out", ok_out}), "--momentum",
                     "--momentum with adamw");
  expect_usage_error(
      emit({"--config", config(), "--seq", "7", "--optimizer", "sgd", "--beta1", "0.9", "--out", ok_out}), "--beta1",
      "--beta1 with sgd");
  expect_usage_error(emit({"--config", config(), "--seq", "7", "--beta2", "1", "--out", ok_out}), "--beta2",
                     "--beta2 1");
  expect_usage_error(emit({"--config", config(), "--seq", "7", "--eps", "nan", "--out", ok_out}), "--eps", "--eps nan");
  expect_usage_error(emit({"--config", config(), "--seq", "7", "--function", "int", "--out", ok_out}), "keyword",
                     "--function int");
  expect_usage_error(emit({"--config", config(), "--seq", "7", "--format", "ptx", "--out", ok_out}), "--format",
                     "--format ptx");
  expect_usage_error(emit({"--config", (kBert / "bert" / "config.json").string(), "--seq", "7", "--out", ok_out}),
                     "encoder", "a bert config");
  expect_usage_error(emit({"--config", config(), "--seq", "7", "--out", tmp("out")}), "is a directory",
                     "the header's path a directory");
  expect_usage_error(emit({"--config", config(), "--seq", "7", "--out", tmp("no/such/x.so")}), "no/such",
                     "an --out whose folder does not exist");
  // A config that is missing or not JSON: a failure of the input (exit 1), one line naming it.
  for (const std::string& bad : {tmp("missing.json"), tmp("bad.json")}) {
    const Result r = emit({"--config", bad, "--seq", "7", "--out", tmp("y.so")});
    EXPECT_EQ(r.code, 1) << bad << "\n" << r.err;
    EXPECT_THAT(r.err, ::testing::StartsWith("qkv: error: ")) << bad;
    EXPECT_THAT(r.err, HasSubstr(fs::path(bad).filename().string())) << bad;
    expect_one_line_error(r);
  }
  EXPECT_EQ(listing(), before);
  EXPECT_EQ(listing(tmp("out")), std::vector<std::string>{"qkv_train.h"});
}

// A directory --out (made when it ends in '/'): <function>.so and <function>.h in it; SGD without
// momentum keeps no state, which the header says.
TEST_F(TrainStep, WritesTheLibraryAndAHeaderThatListsTheWeights) {
  const Result r = emit({"--model", (kTrain / "sgd").string(), "--batch", "2", "--seq", "7", "--optimizer", "sgd",
                         "--function", "sgd_step", "--out", tmp("lib") + "/"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("lib/sgd_step.so"));
  EXPECT_EQ(listing(tmp("lib")), (std::vector<std::string>{"sgd_step.h", "sgd_step.so"}));
  const std::string h = slurp(tmp("lib/sgd_step.h"));
  for (const char* s :
       {"int sgd_step(", "static inline int sgd_step_step(const float* const* weights", "#define SGD_STEP_BATCH 2",
        "#define SGD_STEP_SEQ 7", "#define SGD_STEP_NUM_STATE 0", "\"model.embed_tokens.weight\",",
        "\"lm_head.weight\",", "keeps no state", "SEPARATE buffers", "SGD (momentum 0"})
    EXPECT_THAT(h, HasSubstr(s));
  EXPECT_THAT(h, Not(HasSubstr("sgd_step_state_names")));
  // The section is inside the include guard and the extern "C" block.
  EXPECT_LT(h.find("sgd_step_step("), h.rfind("#ifdef __cplusplus"));
}

// --dtype bf16: the same step's ABI (f32 weights and state), the model computed in bf16 — its
// linear layers and the backward's contractions on the bf16 GEMM kernels.
TEST_F(TrainStep, Bf16ComputeKeepsTheF32WeightsAndRunsTheBf16Gemm) {
  for (const char* format : {"obj", "ll"}) {
    const Result r = emit({"--model", (kTrain / "sgd").string(), "--batch", "2", "--seq", "7", "--dtype", "bf16",
                           "--format", format, "--out", tmp("bf16") + "/"});
    ASSERT_EQ(r.code, 0) << r.err;
  }
  const std::string h = slurp(tmp("bf16/qkv_train.h"));  // written with the object
  EXPECT_THAT(h, HasSubstr("the model computed in bf16 over the f32 weights"));
  EXPECT_THAT(h, HasSubstr("static inline int qkv_train_step(const float* const* weights"));
  const std::string ll = slurp(tmp("bf16/qkv_train.ll"));
  EXPECT_THAT(ll, HasSubstr("@qkv_gemm_bf16"));
  EXPECT_THAT(ll, HasSubstr("@qkv_gemm_bf16_at"));  // the weights' gradients
}

}  // namespace
