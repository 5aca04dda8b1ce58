// qkv/codegen/cpu/executor.hpp — run any qkv graph on the CPU backend.
//
//   RunResult r = qkv::codegen::cpu::run(graph, feeds);   // lower (cached by graph hash), execute
//
// The graph goes through the pass pipeline (passes/pipeline.hpp), then runs node by node, with
// values freed at their last use (buffer_plan.hpp). What runs where:
//   - fused_attention (the attention the pipeline fused): the JIT-compiled flash-style kernel
//     (run_attention.hpp);
//   - linear whose features are the contiguous (last) axis: the JIT-compiled GEMM (gemm.hpp:
//     y = x·Wᵀ + b);
//   - layer_norm over the input's last axis, gelu, relu, and add of two tensors with identical
//     axes (names and order; the residual add): the JIT-compiled row-wise kernels (rowwise.hpp);
//   - views (split, merge, rename, view): the reference implementation (a copy of the input);
//   - everything else (broadcasting add, mul, bias, keep-mask, scale, softmax, causal, dropout,
//     contract, permute, slice, concat, broadcast, fill, linear or layer_norm over another axis):
//     the node alone compiled ahead of time under the bound sizes (a one-node graph through
//     aot.hpp, cached by that graph: loop nests for the concrete strides, on the calling thread).
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
