// Helpers shared by the subcommands (not part of any public API).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <qkv/runtime/interpreter.hpp>

#include "commands.hpp"

namespace qkv::cli {

/// Runs a graph on the chosen backend (`threads` <= 0: one per hardware thread).
RunResult run_graph(const Graph& g, const Feeds& feeds, Backend backend, int threads = 0);

/// A model given by shape alone, built with the same builders as `qkv run`, with seeded
/// weights and inputs (shapes, bench, verify, emit).
struct Instance {
  Graph graph;
  Bindings sizes;
  Feeds feeds;
  double flops = 0;  // of the attention core: 4*B*H*L*S*D, half when causal
};
Instance instantiate(const ShapeModel& s);

/// Writes every (path, array) as .npy only after all outputs exist, each atomically (temporary
/// file + rename), so a failure leaves no partial output behind.
void write_all(const std::vector<std::pair<std::string, NdArray>>& files);

/// Turns PyTorch-convention masks into a model's mask inputs: the key-padding mask becomes the
/// keep-mask `key_keep` [B, S]; attention masks and biases (bool true = not allowed -> -inf,
/// floats added) are summed into `attn_bias`, [L, S] while they broadcast over batch and heads,
/// [B, H, L, S] once one of them does not.
struct MaskBuilder {
  MaskBuilder(std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t s)
      : batch(b), heads(h), len_q(l), len_k(s) {}
  std::int64_t batch, heads, len_q, len_k;
  Feeds feeds;
  std::optional<NdArray> bias;
  Masks spec;

  void key_padding(const NdArray& kpm, const std::string& flag);
  /// `per_batch_head_rows`: m is PyTorch MHA's [B*H, L, S]; otherwise NumPy broadcasting.
  void add(NdArray m, const std::string& flag, bool per_batch_head_rows);
  /// Moves the mask arrays into `into` and says which inputs the model needs.
  Masks finish(Feeds& into);
};

}  // namespace qkv::cli
