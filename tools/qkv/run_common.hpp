// Helpers shared by the subcommands (not part of any public API).
#pragma once

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/cpu/tuning.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/io/files.hpp>

#include "commands.hpp"

namespace qkv::cli {

/// The median of `v` (the mean of the middle two when their number is even); 0 when empty.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

/// Runs a graph on the chosen backend (`threads` <= 0: one per hardware thread).
/// `into`: outputs the backend may write into the caller's arrays (the CPU backend does).
RunResult run_graph(const Graph& g, const Feeds& feeds, Backend backend, int threads = 0, const Destinations& into = {},
                    codegen::cpu::Specialise specialise = codegen::cpu::Specialise::kernels);

/// `g` stored as `dtype` (with_float_dtype, PyTorch's model.to(dtype)), with every float feed
/// converted to the dtype of the input or parameter it feeds. Returns the names converted, each
/// with the dtype it was stored as.
struct Converted {
  std::string name;
  DType from;
};
std::vector<Converted> convert_feeds(const Graph& g, Feeds& feeds);
/// The same for a command's files: converts and prints one note on stderr naming what was
/// converted ("inputs are converted on load when their stored dtype differs"), `earlier` (what the
/// caller converted as it read it) included.
Graph model_as(const Graph& g, DType dtype, Feeds& feeds, const std::vector<Converted>& earlier = {});

/// The CPU kernels' tuning for this host (qkv/codegen/cpu/tuning.hpp), for `qkv host` and --stats.
codegen::cpu::KernelTuning host_tuning();

/// Checks there is memory to run `g` on `feeds`, then runs it; with `stats`, says on stderr what
/// was compiled for the run and how long it took.
RunResult run_model(const Graph& g, const Feeds& feeds, Backend backend, bool stats);

/// A model given by shape alone, built with the same builders as `qkv run` (shapes, bench,
/// verify, emit). Nothing is allocated for it: the seeded weights and inputs come from
/// seeded_feeds, after the caller has checked there is memory for them.
struct Instance {
  Graph graph;
  Bindings sizes;    // every extent of the graph
  double flops = 0;  // of the attention core: 4*B*H*L*S*D, half when causal
};
/// Throws UsageError for sizes that make no sense or overflow.
Instance instantiate(const ShapeModel& s);
/// The seeded weights and inputs of the instance (and the padding mask, with --padding).
Feeds seeded_feeds(const Instance& in, const ShapeModel& s);

/// An input file of a command and the flag that named it (an empty path: not given).
struct NamedPath {
  std::string path, flag;
};
/// Outputs may not overwrite any of the inputs (OutputGroup::protect).
void protect_inputs(OutputGroup& outputs, std::initializer_list<NamedPath> inputs);
/// Stages `array` as .npy output `i` of `outputs`.
void stage_npy(OutputGroup& outputs, std::size_t i, const NdArray& array);
/// Reads the .npy input of `flag`, after checking from its header that it fits in memory.
NdArray load_npy(const std::string& path, const std::string& flag);

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
  /// What the bias was made of: every mask add()ed, by flag with its own shape, and whether one
  /// was bool (qkv grad: the bias's gradient is a mask's only when one float mask of the bias's
  /// shape made it).
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> bias_sources;
  bool bias_from_bool = false;
  /// The name qkv grad gives the bias's gradient (a flag's name, e.g. "attn_mask"), or "" when it
  /// is no mask's; set by finish().
  [[nodiscard]] std::string bias_gradient_name() const;

  void key_padding(const NdArray& kpm, const std::string& flag);
  /// `per_batch_head_rows`: m is PyTorch MHA's [B*H, L, S]; otherwise NumPy broadcasting.
  void add(NdArray m, const std::string& flag, bool per_batch_head_rows);
  /// Moves the mask arrays into `into` and says which inputs the model needs.
  Masks finish(Feeds& into);

 private:
  std::string bias_name_;
};

}  // namespace qkv::cli
