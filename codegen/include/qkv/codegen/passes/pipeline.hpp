// qkv/codegen/passes/pipeline.hpp — the pass pipeline, one straight line:
//
//   verify → canonicalize → fuse-attention → layout → cleanup (canonicalize again) → legalize-dtypes
//
// (buffer planning runs when sizes are bound: see buffer_plan.hpp). `dump_after` prints the
// graph's shape table after the named pass (or "all"); `time_passes` prints each pass's time;
// `verify_each` checks the IR's invariants after every pass (on by default in Debug builds).
#pragma once

#include <iosfwd>
#include <memory>
#include <string>

#include <qkv/ir/graph.hpp>

namespace qkv::codegen {

struct PipelineOptions {
  std::string dump_after{};  // "", a pass name, or "all"
  bool time_passes = false;
#ifdef NDEBUG
  bool verify_each = false;
#else
  bool verify_each = true;
#endif
  std::ostream* log = nullptr;  // where dumps and times go (nullptr: std::cerr)
};

/// The pass names, in order.
inline constexpr const char* kPassNames[] = {"verify", "canonicalize", "fuse-attention",
                                             "layout", "cleanup",      "legalize-dtypes"};

/// Runs the pipeline; the result is what the CPU and GPU executors run.
Graph lower(const Graph& g, const PipelineOptions& options = {});

/// lower(g) with default options, once per graph per process (cached by the graph's hash, the
/// graph itself compared; thread-safe). Both backends' run() go through it.
std::shared_ptr<const Graph> lower_cached(const Graph& g);

/// A forward graph made ready to differentiate: canonicalize and fuse-attention, so that the
/// gradient (append_gradients) of each attention they fuse is FlashAttention-2's fused backward
/// (one fused_attention_backward node, no [query, key] probabilities kept for it) instead of the
/// unfused ops'. `loss` is a node of g; the result holds g's leaves, its outputs (under their
/// names) and what they and `loss` read, and the loss's id in it.
struct ForwardForGradients {
  Graph g;
  int loss = -1;
};
ForwardForGradients fuse_for_gradients(const Graph& g, int loss);

}  // namespace qkv::codegen
