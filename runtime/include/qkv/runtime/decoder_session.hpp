// qkv/runtime/decoder_session.hpp — a decoder with its KV cache, across calls:
//
//   qkv::DecoderSession s(step_graph, std::move(weights), {.layers = 2, .kv_heads = 2, .head_dim = 64,
//                                                          .capacity = 4096}, runner);
//   NdArray logits = s.prefill(prompt);        // [B, L] ids -> [B, L, vocab] ([B, 1, vocab]: below)
//   logits = s.decode(next);                   // [B, 1] -> [B, 1, vocab], at position s.position()
//   s.reset();
//
// The step graph is CausalLm::cached's (qkv::nn::declare_cached_step): inputs tokens and
// positions [B, L], the size past_length (the positions the caches hold), cache_k.{i} /
// cache_v.{i} [B, KvHeads, capacity, HeadDim]; outputs logits (every position's, or with
// StepLogits::last_position only the last one's) and present_k.{i} / present_v.{i}, the caches
// after the step. The session owns one buffer of the full capacity per cache, made
// once: it feeds them as the caches and asks for the present caches to be written back into
// them (Destinations), so a backend that can (the CPU's) writes only the step's rows, in place,
// and its attention reads the cache's rows where they are. A runner that cannot returns the
// present caches, which replace the buffers (the reference interpreter). The positions are the
// session's: a step's tokens sit at position() .. position() + L − 1. The runner runs the graph
// on a backend (the interpreter by default; the CPU backend compiles the step once: Past, Seq
// and Key are run-time sizes). The weights are bound once, at construction, and never copied
// by the session.
//
// Sequences of different lengths share a batch left-padded (a step graph declared with
// StepRows::left_padded, whose input first_key [B] the session feeds): prefill(tokens, first)
// with row b's first first[b] tokens padding; row b's tokens then sit at positions 0, 1, ... from
// first[b] on (what RoPE and learned positions see), and no query sees its padding.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <qkv/runtime/interpreter.hpp>

namespace qkv {

class DecoderSession {
 public:
  using Runner = std::function<RunResult(const Graph&, const Feeds&, const Destinations&)>;
  struct Shape {
    std::int64_t layers = 0, kv_heads = 0, head_dim = 0;
    std::int64_t batch = 1;
    std::int64_t capacity = 0;  // the most positions the cache holds
  };

  DecoderSession(Graph step, Feeds weights, const Shape& shape, Runner run = {});

  /// Empties the cache, then runs `tokens` [B, L] at positions 0 .. L − 1: logits [B, L, vocab].
  /// `first`: for a left-padded batch, row b's first real token (B of them, each < L; the step
  /// graph must take first_key); empty: 0 for every row.
  NdArray prefill(const NdArray& tokens, const std::vector<std::int64_t>& first = {});
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
  Feeds feeds_;           // the weights, tokens, positions, past_length and the caches
  Destinations present_;  // present_k.{i} / present_v.{i} -> the caches' buffers in feeds_
  std::int64_t position_ = 0, steps_ = 0;
  bool padded_ = false;              // the graph takes first_key (StepRows::left_padded)
  std::vector<std::int64_t> first_;  // the batch's padding per row (zeros when not padded)
};

}  // namespace qkv
