// qkv/runtime/decoder_session.hpp — a decoder with its KV cache, across calls:
//
//   qkv::DecoderSession s(step_graph, std::move(weights), {.layers = 2, .kv_heads = 2, .head_dim = 64,
//                                                          .capacity = 4096}, runner);
//   NdArray logits = s.prefill(prompt);        // [B, L] ids -> [B, L, vocab]
//   logits = s.decode(next);                   // [B, 1] -> [B, 1, vocab], at position s.position()
//   s.reset();
//
// The step graph is CausalLm::cached's (build_causal_lm_step in the CLI): inputs tokens and
// positions [B, L], past_k.{i} / past_v.{i} [B, KvHeads, Past, HeadDim]; outputs logits and
// present_k.{i} / present_v.{i} (the past with the step appended), which become the next past.
// The positions are the session's: a step's tokens sit at position() .. position() + L − 1. The
// runner runs a graph on a backend (the reference interpreter by default; the CPU backend
// compiles the step once: the cache length is a run-time size). The weights are bound once, at
// construction, and never copied again by the session.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <qkv/runtime/interpreter.hpp>

namespace qkv {

class DecoderSession {
 public:
  using Runner = std::function<RunResult(const Graph&, const Feeds&)>;
  struct Shape {
    std::int64_t layers = 0, kv_heads = 0, head_dim = 0;
    std::int64_t batch = 1;
    std::int64_t capacity = 0;  // the most positions the cache holds
  };

  DecoderSession(Graph step, Feeds weights, const Shape& shape, Runner run = {});

  /// Empties the cache, then runs `tokens` [B, L] at positions 0 .. L − 1: logits [B, L, vocab].
  NdArray prefill(const NdArray& tokens);
  /// Runs `tokens` [B, n] after what the cache holds: logits [B, n, vocab]. An InputError when
  /// they would take the cache past its capacity (the cache is then unchanged).
  NdArray decode(const NdArray& tokens);
  /// Empties the cache (position() becomes 0).
  void reset();
  /// The positions the cache holds.
  [[nodiscard]] std::int64_t position() const { return position_; }
  [[nodiscard]] std::int64_t capacity() const { return shape_.capacity; }
  /// Steps run since construction (a prefill is one).
  [[nodiscard]] std::int64_t steps() const { return steps_; }

 private:
  NdArray step(const NdArray& tokens);

  Graph graph_;
  Shape shape_;
  Runner run_;
  Feeds feeds_;  // the weights, tokens, positions and the cache
  std::int64_t position_ = 0, steps_ = 0;
};

}  // namespace qkv
