// Helpers shared by the subcommands (not part of any public API).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <qkv/runtime/interpreter.hpp>

#include "commands.hpp"

namespace qkv::cli {

/// Runs a graph on the chosen backend.
RunResult run_graph(const Graph& g, const Feeds& feeds, Backend backend);

/// Writes every (path, array) as .npy only after all outputs exist, each atomically (temporary
/// file + rename), so a failure leaves no partial output behind.
void write_all(const std::vector<std::pair<std::string, NdArray>>& files);

/// Folds PyTorch masks into an additive bias [B, H, L, S] (0 or -inf; floats added).
NdArray bias_tensor(std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t s);
void apply_key_padding(NdArray& bias, const NdArray& kpm, const std::string& flag);

}  // namespace qkv::cli
