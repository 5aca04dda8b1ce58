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
// What runs where (`plan` decides it, without a GPU, so it is unit-tested on any machine):
//   - fused_attention: the attention kernel. A [batch, key] keep-mask is passed as the kernel's
//     key-padding bytes; every other mask is folded, on the host, into one additive [L, S] bias
//     (0 / −inf for keep-masks, the value for float biases) that is uploaded for the launch.
//     attention_weights is the weights buffer its fused node wrote.
//   - linear whose projected axis is x's last (and stays last): the SGEMM kernel;
//   - layer_norm over x's last axis: the layer-norm kernel;
//   - relu, gelu, add of two f32 tensors with identical axes, scale: the elementwise kernel
//     (scale's factor: node.scalar, or 1/sqrt(bound dim));
//   - permute, slice, broadcast and concat of f32 tensors of rank <= 6: the strided-copy kernel
//     (concat along the leading axis: one copy per part into the destination's offset; along
//     another axis: each part into a scratch buffer laid out with that axis leading, then one
//     copy into place);
//   - split, merge, rename, view: no code (the input's buffer);
//   - everything else — softmax, keep_mask, causal, dropout, contract, bias, mul, fill and
//     broadcasting add outside a fused attention; linear or layer_norm over another axis; any
//     node on bool tensors other than views (the copy kernel moves floats); rank > 6; an attention
//     no tiling of the kernel fits (head widths in the thousands, > 65535 heads or batches) —
//     falls back to the host: its inputs are downloaded, qkv::evaluate_node (the reference
//     interpreter's implementation; the CPU fused kernel for an attention) computes it and the
//     result is uploaded. Correct, slow; the CLI's models (sdpa, mha, encoder-layer) have none.
//
// Kernels are emitted as PTX for the device's sm (compute capability clamped to the supported
// set: 8.0, 8.6, 8.7, 8.9, 9.0; newer GPUs get sm_90 PTX, which the driver JIT-compiles forward;
// below 8.0 run throws std::runtime_error "… needs compute capability >= 8.0 …"), loaded once per
// (kernel name, sm) and kept for the life of the process.
//
// Errors: cuda::NoGpu when there is no usable driver/GPU (what() starts "no CUDA driver/GPU
// found: "), cuda::CudaError for a failing driver call, ShapeError for feeds that do not fit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <qkv/codegen/lowering/attention_call.hpp>
#include <qkv/codegen/nvptx.hpp>
#include <qkv/ir/graph.hpp>
#include <qkv/runtime/interpreter.hpp>

namespace qkv::codegen::cuda {

/// The sm the kernels are emitted for on a GPU of compute capability major.minor: the largest
/// supported sm (80, 86, 87, 89, 90) not above it. Throws std::runtime_error below 8.0.
int pick_sm(int cc_major, int cc_minor);

/// One kernel parameter of a planned launch.
struct Arg {
  enum class Kind : std::uint8_t { buffer, null, i64, f32 };
  Kind kind = Kind::null;
  int buffer = -1;          // Kind::buffer: index into Plan::buffers
  std::int64_t offset = 0;  // Kind::buffer: bytes from the buffer's start
  std::int64_t i64 = 0;
  float f32 = 0.0f;

  static Arg buf(int b, std::int64_t byte_offset = 0) { return {Kind::buffer, b, byte_offset, 0, 0.0f}; }
  static Arg null() { return {}; }
  static Arg i(std::int64_t v) { return {Kind::i64, -1, 0, v, 0.0f}; }
  static Arg f(float v) { return {Kind::f32, -1, 0, 0, v}; }
};

/// One kernel launch: the request (emit_ptx makes its PTX), its grid (from the nvptx *_grid
/// helpers; never zero — launches with nothing to do are not planned) and its parameters in the
/// kernel's order. Block and dynamic shared memory come with the emitted PtxKernel.
struct Launch {
  nvptx::KernelRequest request;
  nvptx::Dim3 grid;
  std::vector<Arg> args;
};

/// What happens at one node.
struct Step {
  enum class Kind : std::uint8_t {
    upload,   // input / param: the feed is copied to the device
    view,     // no code: the node's value is its input's buffer
    weights,  // attention_weights: the buffer its fused node wrote
    gpu,      // `launches`, in order (possibly none: an empty tensor)
    host,     // fallback: download the inputs, qkv::evaluate_node, upload (see `why`)
  };
  Kind kind = Kind::gpu;
  std::vector<Launch> launches;
  std::string why;  // host: why the node is not run on the GPU
  /// gpu, fused attention with bias terms: the [L, S] bias built on the host from the node's mask
  /// inputs (call.bias_terms) and uploaded to buffer `bias_buffer` before the launch.
  int bias_buffer = -1;
  int weights_buffer = -1;                              // fused attention with write_weights: where the weights go
  std::shared_ptr<const FusedAttentionCall> call;  // fused attention only
};

/// Device memory of one run: a node's value (shared by its views) or a node's scratch.
struct BufferInfo {
  std::size_t bytes = 0;
  int first = 0;   // the step (node id) that allocates it
  int last = 0;    // the last step that reads it (graph.size(): a graph output, downloaded at the end)
  int owner = -1;  // the node whose value it is, or whose scratch
};

/// Everything `execute` does, decided without a GPU.
struct Plan {
  Bindings sizes;
  std::vector<std::vector<std::int64_t>> shape;  // per node
  std::vector<int> buffer;                       // per node: the buffer holding its value
  std::vector<BufferInfo> buffers;
  std::vector<Step> steps;  // per node, index = node id
  /// The buffers to free after step k (those whose `last` is k), per step.
  std::vector<std::vector<int>> free_after;

  [[nodiscard]] int host_steps() const;
  [[nodiscard]] int launch_count() const;
};

struct PlanOptions {
  /// Dynamic shared memory one block may use (the device's opt-in limit): attention tilings
  /// above it are not chosen. 0: the largest sm's (227 KiB).
  int max_shared_bytes = 0;
};

/// The attention kernel request for `spec` (GPU tiling: the kernel's defaults, else smaller query
/// or key blocks until the tiling validates and its shared memory fits), or why none fits.
std::optional<nvptx::AttentionKernel> choose_attention_kernel(const cpu::AttentionSpec& spec, int max_shared_bytes,
                                                              std::string* why = nullptr);

/// Plans a lowered graph under bound sizes. Throws ShapeError when a size is not bound.
Plan plan(const Graph& lowered, const Bindings& sizes, const PlanOptions& options = {});

/// A launch parameter's value: a device address (buffers and null), an i64 or an f32.
struct ParamValue {
  Arg::Kind kind = Arg::Kind::null;
  std::uint64_t address = 0;
  std::int64_t i64 = 0;
  float f32 = 0.0f;
};

/// Where a plan runs: GPU 0 (execute / run), or — for tests on machines without a GPU — an
/// emulation of the kernels on the host. Addresses are opaque to the executor; 0 is "no memory"
/// (and what alloc returns for 0 bytes).
class Machine {
 public:
  virtual ~Machine() = default;
  virtual std::uint64_t alloc(std::size_t bytes) = 0;
  virtual void free(std::uint64_t address) = 0;
  /// Whole-buffer copies: `address` is what alloc returned, n <= its bytes.
  virtual void upload(std::uint64_t address, const void* src, std::size_t n) = 0;
  virtual void download(void* dst, std::uint64_t address, std::size_t n) = 0;
  /// Launches l.request with l.grid; `params` are l.args resolved, in the kernel's order.
  virtual void launch(const Launch& l, const std::vector<ParamValue>& params) = 0;
  /// Dynamic shared memory per block the machine allows (PlanOptions::max_shared_bytes).
  [[nodiscard]] virtual int max_shared_bytes() const = 0;
};

/// Executes an already lowered graph on `machine`: bind_extents, plan, then every step; device
/// buffers are allocated at their first step and freed after their last.
RunResult execute_on(Machine& machine, const Graph& lowered, const Feeds& feeds);

/// Executes an already lowered graph on GPU 0.
RunResult execute(const Graph& lowered, const Feeds& feeds);

/// Lowers (once per graph, cached in memory, as cpu::run) and executes on GPU 0.
RunResult run(const Graph& g, const Feeds& feeds);

/// Times the fused attention kernel alone on GPU 0: device buffers for q, k, v and out (filled
/// with seeded values in [-1, 1)), the kernel compiled and loaded once, launches timed with CUDA
/// events (no transfers). For the GPU benchmark.
class AttentionBench {
 public:
  /// Throws cuda::NoGpu without a GPU, std::runtime_error when no tiling fits the spec.
  AttentionBench(const cpu::AttentionSpec& spec, std::int64_t batch, std::int64_t len_q, std::int64_t len_k);
  ~AttentionBench();
  AttentionBench(const AttentionBench&) = delete;
  AttentionBench& operator=(const AttentionBench&) = delete;

  /// Runs `launches` back-to-back launches between two events; returns milliseconds per launch.
  double launch_ms(int launches = 1);
  /// attention_flops of the problem (4·B·H·L·S·D, half when causal with L == S).
  [[nodiscard]] double flops() const;
  /// The kernel's name and tiling, e.g. "qkv_attention_… block_q 64 block_k 64 threads 128 smem 52 KiB".
  [[nodiscard]] const std::string& kernel() const;
  /// "NVIDIA H100 80GB HBM3 (sm_90)".
  [[nodiscard]] const std::string& device() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace qkv::codegen::cuda
