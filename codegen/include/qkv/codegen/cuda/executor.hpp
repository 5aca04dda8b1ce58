// qkv/codegen/cuda/executor.hpp — run any qkv graph on the GPU (the NVPTX kernels of
// qkv/codegen/nvptx.hpp, launched through the dlopen'd driver of qkv/runtime/cuda.hpp).
//
//   RunResult r = qkv::codegen::cuda::run(graph, feeds);   // lower (cached by graph), plan, execute
//
// The same contract as qkv::codegen::cpu::run: the graph is lowered by the pass pipeline, its
// extents bound from the feeds, every input and parameter uploaded once per call (f32; bool
// tensors as one byte per element), each node run in graph order, the outputs downloaded. Device
// buffers are freed at their last use (views share their input's buffer and keep it alive).
//
// What runs where: lowering/select.hpp gives every node its kernel kind, and cuda/plan.cpp's
// node() implements each kind (the table in docs/architecture.md): fused attention, GEMM (bf16 x
// and W: the tensor-core GEMM, its bf16 y the value of the rounding convert after it), layer
// norm over rows, unary/equal-shape add and strided copies (rank <= 6 after merging) run as PTX
// kernels; the fused attention evaluates its whole mod expression on the GPU (masks, biases,
// causal, windows, score modifications: its loads read the node's tensor inputs through a table
// of device addresses and extents filled before the launch); concat along an inner axis goes
// through a scratch buffer. Every other kind — and bool tensors, and an attention no tiling fits — falls
// back to the host: inputs downloaded, qkv::evaluate_node, result uploaded. Correct, slow; the
// CLI's models (sdpa, mha, encoder-layer) have none.
//
// Kernels are emitted as PTX for the device's sm (compute capability clamped to the supported
// set: 8.0, 8.6, 8.7, 8.9, 9.0; newer GPUs get sm_90 PTX, which the driver JIT-compiles forward;
// below 8.0 run throws std::runtime_error "… needs compute capability >= 8.0 …"), loaded once per
// (kernel name, sm) and kept for the life of the process.
//
// Errors: cuda::NoGpu when there is no usable driver/GPU (what() starts "no CUDA driver/GPU
// found: "), cuda::CudaError for a failing driver call, ShapeError for feeds that do not fit.
#pragma once

#include <qkv/codegen/cuda/bench.hpp>
#include <qkv/codegen/cuda/machine.hpp>
#include <qkv/codegen/cuda/plan.hpp>
#include <qkv/ir/graph.hpp>
#include <qkv/runtime/interpreter.hpp>

namespace qkv::codegen::cuda {

/// Executes an already lowered graph on `machine`: bind_extents, plan, then every step; device
/// buffers are allocated at their first step and freed after their last.
RunResult execute_on(Machine& machine, const Graph& lowered, const Feeds& feeds);

/// Executes an already lowered graph on GPU 0.
RunResult execute(const Graph& lowered, const Feeds& feeds);

/// Lowers (once per graph, cached in memory, as cpu::run) and executes on GPU 0.
RunResult run(const Graph& g, const Feeds& feeds);

}  // namespace qkv::codegen::cuda
