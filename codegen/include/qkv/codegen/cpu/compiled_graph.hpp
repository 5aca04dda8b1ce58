// qkv/codegen/cpu/compiled_graph.hpp — a whole lowered graph compiled once, in process, for this
// host: the code the CPU executor runs (no LLVM in this header).
//
//   auto cg = qkv::codegen::cpu::CompiledGraph::compile(lowered, /*fixed=*/{{"HeadDim", 64}});
//   // cg->signature().sizes: the run-time sizes (here every other symbol), in argument order
//   cg->run(sizes.data(), args.data(), /*threads=*/0);
//
// Sizes the code is specialised on are `fixed`; every other symbol of the graph is a run-time
// argument (loop bounds, strides, arena offsets are computed from it), so one compilation serves
// every sequence length. The executor specialises only what the attention kernel needs as
// constants (head counts and widths: specialised_symbols), and caches one CompiledGraph per
// (graph, those sizes): compiled_for.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <qkv/codegen/aot.hpp>
#include <qkv/ir/graph.hpp>

namespace qkv::codegen::cpu {

class CompiledGraph {
 public:
  /// Compiles `lowered` (the pass pipeline's output; the executor and the AOT path pass it through
  /// fuse_elementwise first, the CPU module's own step) for the host. Throws ShapeError when a size
  /// the kernels are specialised on is not in `fixed`, std::runtime_error when LLVM fails.
  static std::shared_ptr<const CompiledGraph> compile(const Graph& lowered, const Bindings& fixed,
                                                      const std::string& function = "qkv_graph");
  ~CompiledGraph();
  CompiledGraph(const CompiledGraph&) = delete;
  CompiledGraph& operator=(const CompiledGraph&) = delete;

  /// The run-time sizes (signature().sizes) and the arrays (signature().args), in order.
  [[nodiscard]] const AotSignature& signature() const;

  /// Runs the graph: sizes[i] is signature().sizes[i]; args[i] points at argument i (dense,
  /// row-major, f32 or one byte per bool); threads <= 0: one per online CPU. Returns 0, 1 when
  /// the scratch arena cannot be allocated, 2 when the sizes are invalid. Thread-safe.
  int run(const std::int64_t* sizes, void* const* args, int threads) const;

  /// A handle of the graph bound to its parameters (args' parameter slots are read, no other):
  /// every linear layer whose weights are parameters has them packed into the GEMM's panels
  /// once, and the handle keeps the scratch arena between runs. nullptr when memory runs out.
  /// The parameters must outlive the handle, unchanged; release() frees it.
  [[nodiscard]] void* prepare(const std::int64_t* sizes, void* const* args) const;
  /// run() with a handle from prepare(): its packed panels instead of packing, its arena instead
  /// of a fresh one (grown when a call needs more). Returns 4 when the parameters' sizes differ
  /// from those it was prepared for. One call at a time per handle.
  int run(void* handle, const std::int64_t* sizes, void* const* args, int threads) const;
  void release(void* handle) const;

 private:
  struct Impl;
  explicit CompiledGraph(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The symbols of `lowered` the CPU code must be specialised on (head counts and widths of the
/// fused attention kernels); every other size can be a run-time argument.
std::vector<std::string> specialised_sizes(const Graph& lowered);

/// What the compiled code is specialised on: the attention kernels' sizes only (the default: one
/// compilation serves every batch and sequence length), or every size of the feeds (constants
/// throughout: faster loops, compiled once per distinct shape — for a loop that runs one shape
/// many times, as `qkv train` does).
enum class Specialise : std::uint8_t { kernels, every_size };

/// The compiled graph for `lowered` under `sizes`, from a process-wide cache keyed by the
/// graph's structure and the specialised sizes' values: one compilation per shape class (with
/// Specialise::every_size: per distinct `sizes`, all of them constants in the code).
std::shared_ptr<const CompiledGraph> compiled_for(const Graph& lowered, const Bindings& sizes,
                                                  Specialise specialise = Specialise::kernels);

}  // namespace qkv::codegen::cpu
