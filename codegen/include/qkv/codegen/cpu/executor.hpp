// qkv/codegen/cpu/executor.hpp — run any qkv graph on the CPU backend.
//
//   RunResult r = qkv::codegen::cpu::run(graph, feeds);   // lower (cached by graph hash), execute
//
// The graph goes through the pass pipeline (passes/pipeline.hpp); attention becomes one
// fused_attention node, executed by the JIT-compiled flash-style kernel (run_attention.hpp).
// Linear layers whose features are the contiguous (last) axis run on the JIT-compiled GEMM
// (gemm.hpp: y = x·Wᵀ + b); linear layers over another axis and the other ops (layer norm,
// elementwise, views) run on the reference implementations node by node — their LLVM lowering
// is the next step of the CPU backend — and values are freed at their last use (buffer_plan.hpp).
#pragma once

#include <qkv/ir/graph.hpp>
#include <qkv/runtime/interpreter.hpp>

namespace qkv::codegen::cpu {

/// Executes an already lowered graph.
RunResult execute(const Graph& lowered, const Feeds& feeds, int threads = 0);

/// Lowers (once per graph hash, cached in memory) and executes.
RunResult run(const Graph& g, const Feeds& feeds, int threads = 0);

/// How many fused_attention nodes the pipeline made of `g` (for tests and `qkv verify`).
int fused_attention_count(const Graph& g);

}  // namespace qkv::codegen::cpu
