// decoder_cli.hpp — what the CLI tests on the Hugging Face decoder fixtures share: where the
// fixtures are, their case files, a writable copy, a prompt's columns, a one-line failure.
#pragma once

#include "cli_test.hpp"

#include <algorithm>
#include <fstream>
#include <string>

namespace qkv::decoder_cli {

using namespace qkv::test;
using ::testing::HasSubstr;

inline const fs::path kLlamaFixtures = fs::path(QKV_FIXTURES_DIR).parent_path() / "llama_fixtures";

inline nlohmann::json case_of(const std::string& name) {
  std::ifstream in(kLlamaFixtures / name / "case.json");
  return nlohmann::json::parse(in);
}

/// A writable copy of a fixture's model folder, at `to`.
inline fs::path copy_model(const std::string& name, const fs::path& to) {
  fs::copy(kLlamaFixtures / name, to, fs::copy_options::recursive);
  return to;
}

/// Exit 1 with one line saying `says`.
inline void expect_failure(const Result& r, const std::string& says, const std::string& what) {
  EXPECT_EQ(r.code, 1) << what << "\n" << r.err;
  EXPECT_THAT(r.err, HasSubstr(says)) << what;
  EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what << "\n" << r.err;
}

/// The first `n` columns of ids [B, L] (int64) written to `path`.
inline void write_prompt(const NdArray& tokens, std::int64_t n, const std::string& path) {
  const std::int64_t B = tokens.shape[0], L = tokens.shape[1];
  NdArray p = NdArray::zeros(DType::i64, {B, n});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < n; ++t)
      p.as<std::int64_t>()[static_cast<std::size_t>(b * n + t)] =
          tokens.as<std::int64_t>()[static_cast<std::size_t>(b * L + t)];
  write_npy(path, p);
}

/// A fixture model's reference run: its folder, the reference ids [B, P + N] (the prompts, then
/// their greedy continuations), P and N. The prompts alone are written to `prompt_path`.
struct ReferenceRun {
  fs::path dir;
  NdArray tokens;
  std::int64_t prompt = 0, new_tokens = 0;
};
inline ReferenceRun reference_run(const std::string& name, const std::string& prompt_path) {
  const nlohmann::json c = case_of(name);
  ReferenceRun r{
      kLlamaFixtures / name, {}, c.at("prompt_len").get<std::int64_t>(), c.at("new_tokens").get<std::int64_t>()};
  r.tokens = read_npy((r.dir / "tokens.npy").string());
  write_prompt(r.tokens, r.prompt, prompt_path);
  return r;
}

}  // namespace qkv::decoder_cli
