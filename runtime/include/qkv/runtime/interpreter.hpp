// qkv/runtime/interpreter.hpp — the reference interpreter: runs a Graph on concrete arrays.
//
//   qkv::Graph g;  /* built with the DSL */
//   qkv::Feeds feeds{{"x", x}, {"q_proj.weight", wq}, ...};
//   qkv::RunResult r = qkv::interpret(g, feeds);
//   const qkv::NdArray& out = r.outputs.at("out");
//
// Plain, readable C++: one function per op, no SIMD, no fusion. Values are stored as fp32 —
// those of f16 / bf16 nodes rounded to their dtype where they are made (feeds included), so each
// holds exactly what the compiled code stores; contractions, linear layers, softmax sums and
// layer-norm statistics accumulate in fp64. It is
// the yardstick every code generator is compared against, so its rules are pinned down in
// docs/semantics.md ("Pinned semantics (reference interpreter)").
//
// Errors:
//   * ShapeError — the feeds do not fit the graph (missing feed, wrong rank, a static size
//     that differs, a dynamic size bound two ways, a bool/float mix-up) or a deferred shape
//     check of the graph fails under the bound sizes (Graph::check).
//   * std::logic_error("qkv internal error: ...") — the graph is inconsistent in a way the DSL
//     should have prevented (unknown op, wrong number of inputs, an axis that is not there).
#pragma once

#include <cstddef>
#include <map>  // and std::less<>
#include <string>
#include <vector>

#include <qkv/ir/graph.hpp>
#include <qkv/runtime/io/array.hpp>

namespace qkv {

/// The arrays fed to a graph, by the name of its input/param nodes. Feeds no node asks for are
/// ignored (a state dict may hold more tensors than one block needs).
using Feeds = std::map<std::string, NdArray, std::less<>>;

/// Arrays a run writes some outputs into, by output name, each of the output's shape and stored
/// dtype: the caller's buffers (a KV cache updated in place). A backend that writes there leaves
/// those outputs out of RunResult::outputs; one that does not returns them there as usual.
using Destinations = std::map<std::string, NdArray*, std::less<>>;

struct RunResult {
  /// The graph's marked outputs (Graph::outputs()) by name: f32 arrays (bool for a boolean node,
  /// f16 / bf16 for a node of that dtype).
  std::map<std::string, NdArray, std::less<>> outputs;
  /// Every symbol's size: those bound by the feeds and those the run inferred.
  Bindings bindings;
};

/// Binds the dynamic extents of `g` to the sizes of `feeds` and checks the feeds against the
/// input/param nodes, then evaluates the graph's deferred checks (Graph::check). Throws
/// ShapeError on the first mismatch, with a message naming the tensor, the axis and the sizes.
[[nodiscard]] Bindings bind_extents(const Graph& g, const Feeds& feeds);

/// Runs every node and returns every node's value, indexed by node id (f32 arrays; bool arrays
/// for nodes of dtype boolean). If `bindings_out` is given it receives the bound sizes.
[[nodiscard]] std::vector<NdArray> interpret_all(const Graph& g, const Feeds& feeds, Bindings* bindings_out = nullptr);

/// Runs every node; returns the graph's marked outputs and the bindings.
[[nodiscard]] RunResult interpret(const Graph& g, const Feeds& feeds);

/// The mean of `a` over dimension `axis` (accumulated in fp64), as an f32 array with that
/// dimension removed — e.g. attention weights [Batch, Heads, Seq, Key] averaged over heads, as
/// torch.nn.MultiheadAttention reports them. Throws std::invalid_argument if axis >= rank.
[[nodiscard]] NdArray mean_over_axis(const NdArray& a, std::size_t axis);

/// The value of one non-leaf node of `g` from its inputs' values (in node.inputs order), with the
/// reference semantics — for executors that run some nodes elsewhere (codegen's CPU executor).
[[nodiscard]] NdArray evaluate_node(const Graph& g, int id, const std::vector<const NdArray*>& inputs,
                                    const Bindings& bindings);

}  // namespace qkv
