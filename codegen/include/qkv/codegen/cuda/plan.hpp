// qkv/codegen/cuda/plan.hpp — the GPU backend's plan of a lowered graph: for every node a step
// (upload, view, launches of PTX kernels with grids and arguments, or a host fallback and why),
// the device buffers and when they die. Made without a GPU (codegen/cuda/plan.cpp), so it is
// unit-tested anywhere; lesson 10 prints one. Which kernel kind each node is comes from
// lowering/select.hpp; the GPU's implementation of each kind is the table in
// docs/architecture.md ("Where does each node run").
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
    weights,  // attention_weights / attention_lse / attention_dk / attention_dv: the buffer its fused node wrote
    gpu,      // `launches`, in order (possibly none: an empty tensor)
    host,     // fallback: download the inputs, qkv::evaluate_node, upload (see `why`)
  };
  Kind kind = Kind::gpu;
  std::vector<Launch> launches;
  std::string why;  // host: why the node is not run on the GPU
  /// gpu, fused attention whose mod loads tensors: the kernel's tensor table (its `tensors` and
  /// `extents` parameters), u64 words: the device address of each of call->tensor_inputs, then
  /// call->tensor_extents. Filled by the executor before the launch (addresses are known only then).
  int tensor_table = -1;
  /// gpu, fused attention backward with gradients of the mod's tensors: per
  /// call->spec.tensor_grads entry, its partial sums' buffer, whose address the executor adds to
  /// the tensor table after the extents.
  std::vector<int> tensor_partials;
  int weights_buffer = -1;                         // fused attention with write_weights: where the weights go
  int lse_buffer = -1;                             // fused attention with write_lse: where the log-sum-exp goes
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
/// or key blocks until the tiling validates and its shared memory fits), or why none fits. bf16
/// storage: the tensor-core kernel (block_k 64, 32 or 16), or why it cannot run the spec.
std::optional<nvptx::AttentionKernel> choose_attention_kernel(const cpu::AttentionSpec& spec, int max_shared_bytes,
                                                              std::string* why = nullptr);

/// Plans a lowered graph under bound sizes. Throws ShapeError when a size is not bound.
Plan plan(const Graph& lowered, const Bindings& sizes, const PlanOptions& options = {});

}  // namespace qkv::codegen::cuda
