// Test graphs shared by the numerics and GPU tests (library qkv_test_cases): the PyTorch fixtures
// (tests/numerics/fixtures: the state dict imported by qkv's importer, PyTorch's masks converted,
// the graph built with the qkv::nn block that mirrors the module), a sweep of attention shapes,
// and the CLI's models (tools/qkv/models.cpp) with the sizes `qkv bench` / `qkv verify` bind.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <qkv/ir/graph.hpp>
#include <qkv/runtime/interpreter.hpp>

namespace qkv::test {

/// A graph, its feeds and the sizes of its symbols.
struct Case {
  std::string name;
  Graph graph;
  Feeds feeds;
  Bindings sizes;
};

/// Every fixture under tests/numerics/fixtures, or under $QKV_FIXTURES_DIR when set (outputs
/// "out", and "weights" for the attention modules), and its folder.
std::vector<std::string> fixture_names();
Case fixture_case(const std::string& name);
std::string fixture_dir(const std::string& name);

/// One attention of the sweep: q [B, H, L, dk], k [B, Hkv, S, dk], v [B, Hkv, S, dv] (GQA when
/// Hkv < H), masks as asked, optional dropout and weights.
struct SweepShape {
  std::int64_t batch = 1, heads = 1, kv_heads = 1, len_q = 1, len_k = 1, dk = 64, dv = 64;
  enum class Causal { none, top_left, bottom_right } causal = Causal::none;
  bool padding = false;  // key_keep [B, S]: batch b keeps its first (S·(3 − b mod 4))/3 keys (b = 3: none)
  bool bias = false;     // attn_bias [L, S]
  double dropout = 0.0;
  bool weights = false;
};
std::vector<SweepShape> sweep_shapes();
std::string sweep_name(const SweepShape& s);
Case sweep_case(const SweepShape& s);

/// One GQA attention layer (LlamaAttention::cached, 4/2 heads, D = 8) against KV caches of any
/// capacity: inputs x [Batch, Seq, 32], positions, past_length, cache_k / cache_v; outputs out,
/// present_k, present_v (the caches after the step).
Graph cached_attention_layer();

/// The CLI's sdpa / mha / encoder-layer graphs (with and without masks), seeded feeds.
std::vector<Case> cli_model_cases();

/// max over elements of |got − want| / max(1, |want|), and the element's index (shapes must match;
/// NaN anywhere counts as infinity).
struct Error {
  double worst = 0;
  std::size_t at = 0;
};
Error relative_error(const NdArray& got, const NdArray& want);

}  // namespace qkv::test
