// qkv run causal-lm: Hugging Face decoder checkpoints (llama, qwen2, mistral) on token ids.
#include <cstdio>

#include <qkv/runtime/hf_checkpoint.hpp>
#include <qkv/runtime/io/npy.hpp>

#include "commands.hpp"
#include "memory.hpp"
#include "out_of_memory.hpp"
#include "run_common.hpp"

namespace qkv::cli {

namespace {

/// The token ids of `flag`: an integer array [B, L] or [L] (one sequence), each in [0, vocab).
NdArray load_token_ids(const std::string& path, const std::string& flag, std::int64_t vocab) {
  NdArray ids = load_npy(path, flag);
  if (ids.dtype != DType::i32 && ids.dtype != DType::i64)
    throw IoError(flag + ": token ids must be an integer array (int32 or int64), not " +
                  std::string(dtype_name(ids.dtype)));
  if (ids.shape.size() == 1) ids.shape.insert(ids.shape.begin(), 1);
  if (ids.shape.size() != 2 || ids.shape[1] == 0)
    throw IoError(flag + ": token ids must be [batch, length] or [length] with length > 0, not " +
                  shape_to_string(ids.shape));
  const std::vector<float> v = ids.to_f32();
  for (std::size_t k = 0; k < v.size(); ++k)
    if (!(v[k] >= 0 && v[k] < static_cast<float>(vocab)))
      throw IoError(flag + ": token id " + std::to_string(static_cast<long long>(v[k])) + " at index " +
                    std::to_string(k) + " is outside the vocabulary of " + std::to_string(vocab));
  return ids;
}

/// Positions 0 .. L-1 of every sequence, [B, L] i64.
NdArray positions_for(std::int64_t batch, std::int64_t len, std::int64_t start = 0) {
  NdArray p = NdArray::zeros(DType::i64, {batch, len});
  auto v = p.as<std::int64_t>();
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < len; ++i) v[static_cast<std::size_t>(b * len + i)] = start + i;
  return p;
}

/// The checkpoint's weights as feeds (f32), with a note when they were stored otherwise.
Feeds weight_feeds(const HfCheckpoint& ck) {
  require_memory(ck.f32_bytes(), "reading the weights of the model");
  const auto types = ck.dtypes();
  for (DType t : types)
    if (t != DType::f32) {
      std::fprintf(stderr, "qkv: note: the weights are stored as %s; they are converted to f32 (computing in f32)\n",
                   std::string(dtype_name(t)).c_str());
      break;
    }
  Feeds feeds;
  for (const auto& name : ck.names()) feeds[name] = ck.load_f32(name);
  return feeds;
}

}  // namespace

int run_causal_lm(const RunCausalLm& o) {
  OutputGroup outputs;
  protect_inputs(outputs, {{o.tokens, "--tokens"}});
  for (const char* f : {"config.json", "model.safetensors", "model.safetensors.index.json"})
    outputs.protect(std::filesystem::path(o.model) / f, "--model");
  const std::size_t logits_file = outputs.add_file(o.logits_out, "--logits-out");

  const Activity reading("reading the model");
  const HfCheckpoint ck = HfCheckpoint::open(o.model);
  const HfConfig& c = ck.config();
  NdArray tokens = load_token_ids(o.tokens, "--tokens", c.vocab_size);
  const std::int64_t B = tokens.shape[0], L = tokens.shape[1];
  if (L > c.max_position_embeddings)
    std::fprintf(stderr, "qkv: note: %lld tokens exceed max_position_embeddings (%lld) of the model\n",
                 static_cast<long long>(L), static_cast<long long>(c.max_position_embeddings));
  Feeds feeds = weight_feeds(ck);
  feeds["tokens"] = std::move(tokens);
  feeds["positions"] = positions_for(B, L);
  const RunResult r = run_model(build_causal_lm(c), feeds, o.backend, o.stats);

  const Activity writing("writing the outputs");
  stage_npy(outputs, logits_file, r.outputs.at("logits"));
  outputs.commit();
  return 0;
}

}  // namespace qkv::cli
