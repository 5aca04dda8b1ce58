// qkv/codegen/cpu/executor.hpp — run any qkv graph on the CPU backend.
//
//   RunResult r = qkv::codegen::cpu::run(graph, feeds);   // lower (cached by graph hash), execute
//
// The graph goes through the pass pipeline (passes/pipeline.hpp); the lowered graph is compiled
// into ONE module for its shape class (compiled_graph.hpp: sizes the attention kernels are
// specialised on are constants, every other size a run-time argument) and cached, so a new batch
// or sequence length runs without compiling. What runs each node: the kernel kind of
// lowering/select.hpp, implemented by cpu/module/module_builder.cpp (the table in
// docs/architecture.md): fused attention, GEMM, row-wise layer norm / gelu / relu / residual add
// on the kernels, views on nothing, every other kind on generated loop nests with the reference
// interpreter's semantics. Inputs of another dtype are converted to f32 on the way in; outputs
// are f32 (bool for boolean nodes), written in place by the compiled code.
#pragma once

#include <memory>

#include <qkv/codegen/cpu/compiled_graph.hpp>
#include <qkv/ir/graph.hpp>
#include <qkv/runtime/interpreter.hpp>

namespace qkv::codegen::cpu {

/// Executes an already lowered graph. Outputs named in `into` are written into those arrays (a
/// destination may be the buffer of an input: an update_slice's output fed its own cache is
/// written in place, only the new rows) and left out of the result; ShapeError when one has
/// another shape or dtype than the output.
RunResult execute(const Graph& lowered, const Feeds& feeds, int threads = 0, const Destinations& into = {},
                  Specialise specialise = Specialise::kernels);

/// Lowers (once per graph hash, cached in memory) and executes.
RunResult run(const Graph& g, const Feeds& feeds, int threads = 0, const Destinations& into = {},
              Specialise specialise = Specialise::kernels);

/// Runs graphs as run() does, keeping per compiled graph a prepared handle of its parameters
/// (CompiledGraph::prepare: every linear layer's weights packed into the GEMM's panels once, the
/// scratch arena kept between calls) — for a caller that runs the same weights again and again,
/// as DecoderSession's steps do. The parameter arrays must stay alive and unchanged while it is
/// used; other parameter arrays (by address, dtype or shape) are prepared anew. Copies share one
/// state; not for concurrent calls. `repack` false: nothing is kept — each call packs the weights
/// it multiplies in its own scratch memory, as run() does (about the weights' size less
/// resident memory, and no packing before the first call; a prefill-sized call then packs again
/// every time, while a decode step's GEMV reads the weights in place either way).
class BoundRunner {
 public:
  explicit BoundRunner(int threads = 0, bool repack = true);
  RunResult operator()(const Graph& g, const Feeds& feeds, const Destinations& into = {}) const;
  /// Handles prepared so far (for tests and stats).
  [[nodiscard]] int prepared() const;

  struct State;  // (executor.cpp)

 private:
  std::shared_ptr<State> state_;
  int threads_ = 0;
  bool repack_ = true;
};

/// The most rows (the batch's tokens) a linear layer with f32 / bf16 / f16 weights runs on the
/// GEMV kernel, which reads its weights in place; more rows run on the GEMM, which reads them
/// packed (kept by a BoundRunner that repacks, else packed per call).
int gemv_max_rows();

/// How many fused_attention nodes the pipeline made of `g` (for tests and `qkv verify`).
int fused_attention_count(const Graph& g);

}  // namespace qkv::codegen::cpu
