// The GPU backend's plan: which kernel each node gets, its grid and parameters, which device
// buffers exist and when they die — made without a GPU (executor.cpp runs it). See
// qkv/codegen/cuda/executor.hpp.
#include <qkv/codegen/cuda/executor.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

#include <qkv/codegen/cpu/run_attention.hpp>
#include <qkv/codegen/lowering/lifetimes.hpp>
#include <qkv/codegen/lowering/select.hpp>
#include <qkv/codegen/lowering/storage.hpp>

#include "cuda/grid.hpp"
#include "lowering/graph_util.hpp"

namespace qkv::codegen::cuda {

namespace {

using nvptx::Dim3;

constexpr int kCopyThreads = 256;
constexpr int kElementwiseThreads = 256;
constexpr int kMaxCopyRank = 6;

using namespace util;  // graph_util.hpp: numel, strides_of, strides_by_name, axis_pos, …

/// A strided read of `sizes` elements, simplified: extent-1 axes dropped, axes that are
/// contiguous with the next merged (so most permutes and slices need fewer than 6 axes).
struct Copy {
  Shape sizes, strides;
};
Copy simplify(const Shape& sizes, const Shape& strides) {
  Copy c;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] == 1) continue;
    if (!c.sizes.empty() && c.strides.back() == strides[k] * sizes[k]) {
      c.sizes.back() *= sizes[k];
      c.strides.back() = strides[k];
    } else {
      c.sizes.push_back(sizes[k]);
      c.strides.push_back(strides[k]);
    }
  }
  if (c.sizes.empty()) c = {{1}, {1}};
  return c;
}

}  // namespace

int pick_sm(int cc_major, int cc_minor) {
  const int cc = 10 * cc_major + cc_minor;
  if (cc < 80)
    throw std::runtime_error("the GPU has compute capability " + std::to_string(cc_major) + "." +
                             std::to_string(cc_minor) + "; qkv's CUDA backend needs compute capability >= 8.0");
  int best = 80;
  for (int sm : {80, 86, 87, 89, 90})
    if (sm <= cc) best = sm;
  return best;
}

int Plan::host_steps() const {
  return static_cast<int>(
      std::count_if(steps.begin(), steps.end(), [](const Step& s) { return s.kind == Step::Kind::host; }));
}

int Plan::launch_count() const {
  int n = 0;
  for (const auto& s : steps) n += static_cast<int>(s.launches.size());
  return n;
}

std::optional<nvptx::AttentionKernel> choose_attention_kernel(const cpu::AttentionSpec& spec, int max_shared_bytes,
                                                              std::string* why) {
  if (max_shared_bytes <= 0) max_shared_bytes = 227 * 1024;
  nvptx::AttentionKernel k;
  k.spec = spec;
  k.spec.vector_floats = k.spec.query_vectors = k.spec.key_tile = k.spec.qk_keys = k.spec.pv_dims = 0;
  k.threads = 128;
  if (spec.storage == DType::bf16) {
    // The tensor-core kernel: 16 query rows per warp; key blocks of 64, 32, 16 until one fits.
    k.block_q = 16 * (k.threads / 32);
    std::string no;
    if (!nvptx::attention_supported(k, &no)) {
      if (why) *why = "bf16 attention outside the tensor-core kernel's limits (" + no + ")";
      return std::nullopt;
    }
    for (int bk : {64, 32, 16}) {
      k.block_k = bk;
      if (nvptx::attention_shared_bytes(k) <= max_shared_bytes) return k;
    }
    if (why)
      *why = "no tiling of the attention kernel fits (bf16: " + std::to_string(nvptx::attention_shared_bytes(k)) +
             " bytes of shared memory at block_k 16 exceed the device's " + std::to_string(max_shared_bytes) + ")";
    return std::nullopt;
  }
  // The kernel's defaults first (nvptx.hpp), then smaller query and key blocks: fewer
  // accumulators per thread and less shared memory.
  const int bq0 = spec.dv <= 128 ? 64 : 32, bk0 = spec.dk <= 64 && spec.dv <= 64 ? 64 : 32;
  std::string last;
  for (int bq : {bq0, 32, 16}) {
    if (bq > bq0) continue;
    for (int bk : {bk0, 32, 16, 8}) {
      if (bk > bk0) continue;
      k.block_q = bq;
      k.block_k = bk;
      try {
        const int smem = nvptx::attention_shared_bytes(k);
        if (smem <= max_shared_bytes) return k;
        last = "attention: " + std::to_string(smem) + " bytes of shared memory per block exceed the device's " +
               std::to_string(max_shared_bytes);
      } catch (const std::runtime_error& e) {
        last = e.what();
      }
    }
  }
  if (why) *why = "no tiling of the attention kernel fits (" + last + ")";
  return std::nullopt;
}

// --- the plan -------------------------------------------------------------------------------

namespace {

class Planner {
 public:
  Planner(const Graph& g, const Bindings& sizes, const PlanOptions& options) : g_(g), options_(options) {
    p_.sizes = sizes;
    const auto count = g.size();
    p_.shape.resize(count);
    p_.buffer.assign(count, -1);
    p_.steps.resize(count);
    for (std::size_t id = 0; id < count; ++id)
      for (const auto& ax : g.node(static_cast<int>(id)).axes) {
        const auto v = ax.extent.resolve(sizes);
        if (!v) throw ShapeError("cuda: `" + ax.name + "` (" + ax.extent.str() + ") is not bound; give its size");
        p_.shape[id].push_back(*v);
      }
  }

  Plan run() {
    readers_.assign(g_.size(), 0);
    for (const auto& n : g_.nodes())
      for (int x : n.inputs) ++readers_[static_cast<std::size_t>(x)];
    for (const auto& o : g_.outputs()) ++readers_[static_cast<std::size_t>(o.node)];
    for (int id = 0; id < static_cast<int>(g_.size()); ++id) node(id);
    for (const auto& o : g_.outputs()) use(o.node, static_cast<int>(g_.size()));
    p_.free_after.assign(g_.size(), {});
    for (std::size_t b = 0; b < p_.buffers.size(); ++b) {
      const int last = p_.buffers[b].last;
      if (last < static_cast<int>(g_.size()))
        p_.free_after[static_cast<std::size_t>(last)].push_back(static_cast<int>(b));
    }
    return std::move(p_);
  }

 private:
  const Shape& shape(int id) const { return p_.shape[static_cast<std::size_t>(id)]; }
  int buf(int id) const { return p_.buffer[static_cast<std::size_t>(id)]; }
  Step& step(int id) { return p_.steps[static_cast<std::size_t>(id)]; }

  int new_buffer(std::size_t bytes, int owner) {
    p_.buffers.push_back({bytes, owner, owner, owner});
    return static_cast<int>(p_.buffers.size() - 1);
  }
  int value_buffer(int id) {
    const Node& n = g_.node(id);
    const int b = new_buffer(static_cast<std::size_t>(numel(shape(id))) * storage_bytes(n.dtype), id);
    p_.buffer[static_cast<std::size_t>(id)] = b;
    return b;
  }
  /// Node `x`'s value is read at step `at`.
  void use(int x, int at) {
    BufferInfo& b = p_.buffers[static_cast<std::size_t>(buf(x))];
    b.last = std::max(b.last, at);
  }
  void use_inputs(int id) {
    for (int x : g_.node(id).inputs) use(x, id);
  }
  bool f32_only(int id) const {
    auto f32 = [&](int x) { return storage_dtype(g_.node(x).dtype) == DType::f32; };
    return f32(id) && std::all_of(g_.node(id).inputs.begin(), g_.node(id).inputs.end(), f32);
  }
  void host(int id, std::string why) {
    Step& s = step(id);
    s.kind = Step::Kind::host;
    s.launches.clear();
    s.why = std::move(why);
  }
  /// Adds a launch unless its grid is empty; false (and nothing added) when the grid is too large.
  bool launch(int id, nvptx::KernelRequest request, Dim3 grid, std::vector<Arg> args) {
    if (empty_grid(grid)) return true;
    if (!fits(grid)) return false;
    step(id).launches.push_back({std::move(request), grid, std::move(args)});
    return true;
  }

  /// dst[i] = src[offset + Σ coord·stride] over `sizes`, dst contiguous.
  bool copy(int id, Arg src, Arg dst, std::int64_t offset, const Shape& sizes, const Shape& strides) {
    const std::int64_t count = numel(sizes);
    if (count == 0) return true;
    const Copy c = simplify(sizes, strides);
    if (c.sizes.size() > kMaxCopyRank) return false;
    nvptx::StridedCopyKernel k;
    k.rank = static_cast<int>(c.sizes.size());
    k.threads = kCopyThreads;
    std::vector<Arg> args{src, dst, Arg::i(count), Arg::i(offset)};
    for (int a = 0; a < kMaxCopyRank; ++a)
      args.push_back(Arg::i(a < k.rank ? c.sizes[static_cast<std::size_t>(a)] : 1));
    for (int a = 0; a < kMaxCopyRank; ++a)
      args.push_back(Arg::i(a < k.rank ? c.strides[static_cast<std::size_t>(a)] : 0));
    return launch(id, k, nvptx::elementwise_grid(k.threads, count), std::move(args));
  }

  /// The GPU's implementation of each kernel kind (lowering/select.hpp); a kind without one, or a
  /// form its kernel does not take, runs on the host.
  void node(int id) {
    Step& s = step(id);
    const KernelKind kind = select_kernel(g_, id);
    switch (kind) {
      case KernelKind::leaf:
        s.kind = Step::Kind::upload;
        value_buffer(id);
        return;
      case KernelKind::view:
        s.kind = Step::Kind::view;
        p_.buffer[static_cast<std::size_t>(id)] = buf(g_.node(id).inputs[0]);
        return;
      case KernelKind::attention_weights:
      case KernelKind::attention_lse:
        s.kind = Step::Kind::weights;
        p_.buffer[static_cast<std::size_t>(id)] =
            (kind == KernelKind::attention_lse ? lse_ : weights_).at(g_.node(id).inputs[0]);
        return;
      case KernelKind::fused_attention:
        return attention(id);
      case KernelKind::attention_backward:
        return attention_backward(id);
      case KernelKind::attention_grads: {  // dK / dV / a mod tensor's: the buffers the backward wrote
        const Node& n = g_.node(id);
        int written = -1;
        if (n.op == Op::attention_dtensor) {
          if (auto it = dtensor_.find({n.inputs[0], static_cast<int>(n.offset)}); it != dtensor_.end())
            written = it->second;
        } else if (const auto& grads = n.op == Op::attention_dk ? dk_ : dv_; grads.count(n.inputs[0])) {
          written = grads.at(n.inputs[0]);
        }
        if (written < 0) internal_error("cuda plan: " + std::string(op_name(n.op)) + " without its planned backward");
        s.kind = Step::Kind::weights;
        p_.buffer[static_cast<std::size_t>(id)] = written;
        return;
      }
      case KernelKind::convert:
        if (bf16_linear_.count(g_.node(id).inputs[0])) {  // written by its bf16 linear (linear_bf16)
          s.kind = Step::Kind::view;
          p_.buffer[static_cast<std::size_t>(id)] = buf(g_.node(id).inputs[0]);
          return;
        }
        break;
      case KernelKind::gemm:
        if (linear_bf16(id)) return;
        break;
      case KernelKind::linear_strided:
      case KernelKind::layer_norm_rows:
      case KernelKind::layer_norm_strided:
      case KernelKind::unary:
      case KernelKind::add_same:
      case KernelKind::broadcast_binary:
      case KernelKind::strided_copy:
      case KernelKind::fill:
      case KernelKind::softmax:
      case KernelKind::logsumexp:
      case KernelKind::causal:
      case KernelKind::dropout:
      case KernelKind::contract:
      case KernelKind::score_mod:
      case KernelKind::rms_norm:
      case KernelKind::rope:
      case KernelKind::embedding:
      case KernelKind::embedding_grad:
      case KernelKind::argmax:
      case KernelKind::update_slice:
      case KernelKind::dequantize:
      case KernelKind::dequantize_in_linear:  // the GPU's linear reads f32 weights: written out
        break;                                // a value of its own: a kernel below, or the host
    }
    value_buffer(id);
    use_inputs(id);
    s.kind = Step::Kind::gpu;
    bool planned = false;
    std::string why;
    if (!f32_only(id)) {
      why = "bool, f16 and bf16 tensors are not run on the GPU yet (its kernels move f32)";
    } else {
      switch (kind) {
        case KernelKind::gemm:
          planned = linear(id, why);
          break;
        case KernelKind::layer_norm_rows:
          planned = layer_norm(id, why);
          break;
        case KernelKind::unary:
        case KernelKind::add_same:
          planned = elementwise(id, why);
          break;
        case KernelKind::strided_copy:
          planned = strided(id, why);
          break;
        case KernelKind::update_slice:
          planned = update_slice(id, why);
          break;
        case KernelKind::linear_strided:
          why = "linear over an axis that is not the last";
          break;
        case KernelKind::layer_norm_strided:
          why = "layer_norm over an axis that is not the last";
          break;
        case KernelKind::broadcast_binary:
          why = g_.node(id).op == Op::add
                    ? "add that broadcasts (the GPU adds tensors with identical axes)"
                    : std::string(op_name(g_.node(id).op)) + " outside a fused attention has no GPU kernel";
          break;
        case KernelKind::fill:
        case KernelKind::softmax:
        case KernelKind::logsumexp:
        case KernelKind::causal:
        case KernelKind::dropout:
        case KernelKind::contract:
        case KernelKind::score_mod:
        case KernelKind::rms_norm:
        case KernelKind::rope:
        case KernelKind::embedding:
        case KernelKind::embedding_grad:
        case KernelKind::argmax:
        case KernelKind::convert:
        case KernelKind::dequantize:
        case KernelKind::dequantize_in_linear:
          why = std::string(op_name(g_.node(id).op)) + " outside a fused attention has no GPU kernel";
          break;
        case KernelKind::leaf:
        case KernelKind::view:
        case KernelKind::fused_attention:
        case KernelKind::attention_weights:
        case KernelKind::attention_lse:
        case KernelKind::attention_backward:
        case KernelKind::attention_grads:
          internal_error("cuda plan: kind " + std::string(kernel_kind_name(kind)) + " reached the value kernels");
      }
    }
    if (!planned) host(id, why.empty() ? "no GPU kernel for this form" : why);
  }

  /// Node `id`'s fused-attention call under the run's sizes, kept on its step.
  std::shared_ptr<const FusedAttentionCall> attention_call(int id) {
    auto call = std::make_shared<const FusedAttentionCall>(describe_fused_attention(g_, id, p_.sizes));
    step(id).call = call;
    return call;
  }
  /// The dynamic shared memory a block may use: the device's opt-in limit, or the largest sm's.
  [[nodiscard]] int max_shared() const {
    return options_.max_shared_bytes > 0 ? options_.max_shared_bytes : 227 * 1024;
  }

  void attention(int id) {
    const Node& n = g_.node(id);
    Step& s = step(id);
    const auto call = attention_call(id);
    // The PTX kernel evaluates the whole mod expression (spec.mod, its loads reading the node's
    // tensor inputs through a table of device addresses and extents).
    const cpu::AttentionSpec& spec = call->spec;
    const int out = value_buffer(id);
    int weights = -1;
    if (spec.write_weights) {
      weights = new_buffer(static_cast<std::size_t>(call->batch * spec.hq * call->len_q * call->len_k) * 4, id);
      weights_[id] = weights;
      s.weights_buffer = weights;
    }
    int lse = -1;
    if (spec.write_lse) {
      lse = new_buffer(static_cast<std::size_t>(call->batch * spec.hq * call->len_q) * 4, id);
      lse_[id] = lse;
      s.lse_buffer = lse;
    }
    use_inputs(id);
    if (spec.storage != DType::f32 && spec.storage != DType::bf16)
      return host(
          id, std::string(dtype_name(spec.storage)) + " attention has no GPU kernel (the CPU's fused kernel runs it)");
    std::string why;
    const auto kernel = choose_attention_kernel(spec, max_shared(), &why);
    if (!kernel) return host(id, why);
    Dim3 grid = nvptx::attention_grid(*kernel, call->batch, call->len_q);
    if (!fits(grid)) return host(id, "the attention grid exceeds CUDA's limits (batch or heads > 65535)");
    const auto [tensors, extents] = tensor_table(s, *call, id);
    s.kind = Step::Kind::gpu;
    if (decode(id, *call, out, lse, tensors, extents)) return;
    launch(id, *kernel, grid,
           {Arg::buf(buf(n.inputs[0])), Arg::buf(buf(n.inputs[1])), Arg::buf(buf(n.inputs[2])), Arg::buf(out),
            weights >= 0 ? Arg::buf(weights) : Arg::null(), Arg::null(), Arg::null(), tensors, extents,
            Arg::i(call->batch), Arg::i(call->len_q), Arg::i(call->len_k),
            Arg::i(static_cast<std::int64_t>(call->seed)), lse >= 0 ? Arg::buf(lse) : Arg::null()});
  }

  /// A fused attention's tensor table (Step::tensor_table: the mod's tensors' addresses, then
  /// their extents) and the kernels' `tensors` and `extents` arguments into it; null arguments
  /// when the mod loads no tensor.
  std::pair<Arg, Arg> tensor_table(Step& s, const FusedAttentionCall& call, int id) {
    if (call.tensor_inputs.empty()) return {Arg::null(), Arg::null()};
    const std::size_t count = call.tensor_inputs.size();
    s.tensor_table = new_buffer((count + call.tensor_extents.size() + call.spec.tensor_grads.size()) * 8, id);
    return {Arg::buf(s.tensor_table), Arg::buf(s.tensor_table, static_cast<std::int64_t>(count * 8))};
  }

  /// fused_attention_backward: the PTX backward's dq kernel (D into a scratch buffer, dQ) and then
  /// its dkdv kernel (dK and dV into buffers its attention_dk / attention_dv companions take) —
  /// fp32 FMA kernels, or with bf16 storage the tensor-core ones — and, for the gradients of the
  /// tensors a mod reads, its dtensor kernel (each tensor's slots of partial sums, a buffer per
  /// tensor whose first numel floats become the gradient its attention_dtensor companion takes).
  /// What those kernels do not take (f32 heads wider than 256, bf16 heads that are not multiples
  /// of 16 up to 128) is refused here with the reason: the gradients are one computation, which
  /// has no host step on this backend — never a wrong result.
  void attention_backward(int id) {
    const Node& n = g_.node(id);
    Step& s = step(id);
    const auto call = attention_call(id);
    const cpu::AttentionSpec& spec = call->spec;
    nvptx::AttentionBackwardKernel dq;
    dq.spec = spec;
    nvptx::AttentionBackwardKernel dkdv = dq;
    dkdv.part = nvptx::AttentionBackwardKernel::Part::dkdv;
    std::string why;
    auto refuse = [&](const std::string& reason) {
      throw std::invalid_argument("cuda plan: " + std::string(op_name(n.op)) +
                                  " (a fused attention's gradient): " + reason + "; the CPU backends run it");
    };
    if (!nvptx::attention_backward_supported(dq, &why) || !nvptx::attention_backward_supported(dkdv, &why)) refuse(why);
    if (std::max(nvptx::attention_backward_shared_bytes(dq), nvptx::attention_backward_shared_bytes(dkdv)) >
        max_shared())
      refuse("its tiles need more shared memory than the GPU has");
    const Dim3 grid_dq = nvptx::attention_backward_grid(dq, call->batch, call->len_q, call->len_k);
    const Dim3 grid_dkdv = nvptx::attention_backward_grid(dkdv, call->batch, call->len_q, call->len_k);
    if (!fits(grid_dq) || !fits(grid_dkdv)) refuse("its grid exceeds CUDA's limits (batch or heads > 65535)");

    const int out = value_buffer(id);  // dQ
    const auto kv_rows = static_cast<std::size_t>(call->batch * spec.hkv * call->len_k);
    const std::size_t elem = storage_bytes(spec.storage);  // dK, dV as q, k, v are stored
    const int dk = new_buffer(kv_rows * static_cast<std::size_t>(spec.dk) * elem, id);
    const int dv = new_buffer(kv_rows * static_cast<std::size_t>(spec.dv) * elem, id);
    dk_[id] = dk;
    dv_[id] = dv;
    const int delta = new_buffer(static_cast<std::size_t>(call->batch * spec.hq * call->len_q) * 4, id);
    use_inputs(id);
    const auto [tensors, extents] = tensor_table(s, *call, id);
    // A slot of partial sums per dkdv block for each tensor gradient (its extents: the table's,
    // in spec.tensors' order and ranks).
    std::vector<std::int64_t> numel(spec.tensors.size(), 1);
    for (std::size_t t = 0, at = 0; t < spec.tensors.size(); ++t)
      for (int r = 0; r < spec.tensors[t].rank; ++r) numel[t] *= call->tensor_extents.at(at++);
    for (const auto& t : spec.tensor_grads) {
      const int partial = new_buffer(static_cast<std::size_t>(numel[static_cast<std::size_t>(t.tensor)] * grid_dkdv.x *
                                                              grid_dkdv.y * grid_dkdv.z) *
                                         4,
                                     id);
      s.tensor_partials.push_back(partial);
      dtensor_[{id, t.tensor}] = partial;
    }
    s.kind = Step::Kind::gpu;
    std::vector<Arg> args;
    for (int i = 0; i < 6; ++i) args.push_back(Arg::buf(buf(n.inputs[static_cast<std::size_t>(i)])));  // q … lse
    for (int b : {delta, out, dk, dv}) args.push_back(Arg::buf(b));
    for (Arg a : {Arg::null(), Arg::null(), tensors, extents, Arg::i(call->batch), Arg::i(call->len_q),
                  Arg::i(call->len_k), Arg::i(static_cast<std::int64_t>(call->seed))})
      args.push_back(a);
    launch(id, dq, grid_dq, args);  // first: D for the dkdv kernel
    launch(id, dkdv, grid_dkdv, args);
    if (!spec.tensor_grads.empty()) {
      nvptx::AttentionBackwardKernel sums = dkdv;
      sums.part = nvptx::AttentionBackwardKernel::Part::dtensor;
      launch(id, sums, nvptx::attention_backward_grid(sums, call->batch, call->len_q, call->len_k), std::move(args));
    }
  }

  /// A few query rows (L <= kDecodeQueries): the split-KV decode kernel, then the merge of its
  /// chunks (a scratch buffer of their records) when the keys are split. False: not a decode call.
  bool decode(int id, const FusedAttentionCall& call, int out, int lse, Arg tensors, Arg extents) {
    const cpu::AttentionSpec& spec = call.spec;
    if (call.len_q > nvptx::kDecodeQueries || !nvptx::decode_attention_supported(spec, nullptr)) return false;
    const nvptx::DecodeAttentionKernel dk{spec};
    const nvptx::DecodeMergeKernel mk{spec};
    const Dim3 grid = nvptx::decode_grid(dk, call.batch, call.len_q, call.len_k);
    if (!fits(grid)) return false;
    const nvptx::DecodeSplit split = nvptx::decode_split(dk, call.batch, call.len_q, call.len_k);
    const Node& n = g_.node(id);
    int partials = -1;
    if (split.chunks > 1)
      partials = new_buffer(
          static_cast<std::size_t>(call.batch * spec.hq * call.len_q * split.chunks * cpu::decode_record_floats(spec)) *
              4,
          id);
    const Arg lse_arg = lse >= 0 ? Arg::buf(lse) : Arg::null();
    launch(id, dk, grid,
           {Arg::buf(buf(n.inputs[0])), Arg::buf(buf(n.inputs[1])), Arg::buf(buf(n.inputs[2])), Arg::buf(out),
            Arg::null(), Arg::null(), tensors, extents, Arg::i(call.batch), Arg::i(call.len_q), Arg::i(call.len_k),
            lse_arg, Arg::i(split.chunk_len), partials >= 0 ? Arg::buf(partials) : Arg::null()});
    if (partials >= 0)
      launch(
          id, mk, nvptx::decode_merge_grid(mk, call.batch, call.len_q),
          {Arg::buf(out), lse_arg, Arg::buf(partials), Arg::i(call.batch), Arg::i(call.len_q), Arg::i(split.chunks)});
    return true;
  }

  bool linear(int id, std::string& why) {
    const Node& n = g_.node(id);
    if (!util::linear_on_last_axis(g_, n)) {
      why = "linear over an axis that is not the last";
      return false;
    }
    const Shape &xs = shape(n.inputs[0]), &ws = shape(n.inputs[1]);
    if (ws.size() != 2 || xs.back() != ws[1] || (n.inputs.size() > 2 && shape(n.inputs[2]) != Shape{ws[0]})) {
      why = "linear with weights that are not [out, in] (and a bias [out])";
      return false;
    }
    if (g_.node(n.inputs[1]).op == Op::dequantize) {
      why = "linear on quantized weights (its input rounded to 8 bits a group)";
      return false;
    }
    const std::int64_t k = ws[1], nn = ws[0];
    const std::int64_t m = k > 0 ? numel(xs) / k : numel(shape(id)) / std::max<std::int64_t>(nn, 1);
    const nvptx::LinearKernel kernel;
    const bool ok = launch(id, kernel, nvptx::linear_grid(kernel, m, nn),
                           {Arg::buf(buf(n.inputs[0])), Arg::buf(buf(n.inputs[1])),
                            n.inputs.size() > 2 ? Arg::buf(buf(n.inputs[2])) : Arg::null(), Arg::buf(buf(id)),
                            Arg::i(m), Arg::i(nn), Arg::i(k)});
    if (!ok) why = "the linear's grid exceeds CUDA's limits";
    return ok;
  }

  /// A linear layer of bf16 x and W: legalize-dtypes left it reading them as stored and writing
  /// f32 (the GEMM's contract on the CPU), its bias widened by a convert and its value rounded by
  /// the convert after it (its only reader). The tensor-core kernel (LinearKernel, storage bf16)
  /// computes the pair at once — fp32 sums, the bias added in fp32, y rounded to bf16 — so it
  /// reads the bias as stored (the convert's input) and writes the rounding convert's value, which
  /// becomes a view of this node's buffer (bf16, never read as f32). False (nothing planned): not
  /// that form, or a grid past CUDA's limits; the node then takes the general path (the host).
  bool linear_bf16(int id) {
    const Node& n = g_.node(id);
    auto bf16 = [&](int x) { return g_.node(x).dtype == DType::bf16; };
    if (n.inputs.size() < 2 || !bf16(n.inputs[0]) || !bf16(n.inputs[1]) || n.dtype != DType::f32) return false;
    int rounding = -1;
    for (int u = id + 1; u < static_cast<int>(g_.size()) && rounding < 0; ++u) {
      const Node& c = g_.node(u);
      if (c.op == Op::convert && c.dtype == DType::bf16 && c.inputs.size() == 1 && c.inputs[0] == id) rounding = u;
    }
    if (rounding < 0 || readers_[static_cast<std::size_t>(id)] != 1) return false;
    int bias = -1;
    if (n.inputs.size() > 2) {
      const Node& b = g_.node(n.inputs[2]);
      if (b.op != Op::convert || b.inputs.size() != 1 || !bf16(b.inputs[0])) return false;
      bias = b.inputs[0];
    }
    if (!util::linear_on_last_axis(g_, n)) return false;
    const Shape &xs = shape(n.inputs[0]), &ws = shape(n.inputs[1]);
    if (ws.size() != 2 || xs.back() != ws[1] || (bias >= 0 && shape(bias) != Shape{ws[0]})) return false;
    const std::int64_t k = ws[1], nn = ws[0];
    const std::int64_t m = k > 0 ? numel(xs) / k : numel(shape(id)) / std::max<std::int64_t>(nn, 1);
    nvptx::LinearKernel kernel;
    kernel.storage = DType::bf16;
    const Dim3 grid = nvptx::linear_grid(kernel, m, nn);
    if (!empty_grid(grid) && !fits(grid)) return false;
    Step& s = step(id);
    s.kind = Step::Kind::gpu;
    p_.buffer[static_cast<std::size_t>(id)] =
        new_buffer(static_cast<std::size_t>(numel(shape(id))) * storage_bytes(DType::bf16), id);
    use_inputs(id);  // the f32 bias too: every input lives to its reader (it is not read)
    if (bias >= 0) use(bias, id);
    launch(id, kernel, grid,
           {Arg::buf(buf(n.inputs[0])), Arg::buf(buf(n.inputs[1])), bias >= 0 ? Arg::buf(buf(bias)) : Arg::null(),
            Arg::buf(buf(id)), Arg::i(m), Arg::i(nn), Arg::i(k)});
    bf16_linear_.insert(id);
    return true;
  }

  bool layer_norm(int id, std::string& why) {
    const Node& n = g_.node(id);
    if (n.inputs.size() != 3 || !util::layer_norm_on_last_axis(g_, n)) {
      why = "layer_norm over an axis that is not the last";
      return false;
    }
    const Shape& xs = shape(n.inputs[0]);
    const std::int64_t len = xs.back(), rows = len > 0 ? numel(xs) / len : 0;
    if (shape(n.inputs[1]) != Shape{len} || shape(n.inputs[2]) != Shape{len}) {
      why = "layer_norm with gamma/beta that are not [n]";
      return false;
    }
    const nvptx::LayerNormKernel kernel;
    const bool ok = launch(id, kernel, nvptx::layer_norm_grid(kernel, rows),
                           {Arg::buf(buf(n.inputs[0])), Arg::buf(buf(n.inputs[1])), Arg::buf(buf(n.inputs[2])),
                            Arg::buf(buf(id)), Arg::i(rows), Arg::i(len), Arg::f(static_cast<float>(n.scalar))});
    if (!ok) why = "the layer norm's grid exceeds CUDA's limits";
    return ok;
  }

  bool elementwise(int id, std::string& why) {
    const Node& n = g_.node(id);
    nvptx::ElementwiseKernel k;
    k.threads = kElementwiseThreads;
    Arg b = Arg::null();
    switch (n.op) {
      case Op::relu:
        k.op = nvptx::ElementwiseOp::relu;
        break;
      case Op::gelu:
        k.op = nvptx::ElementwiseOp::gelu;
        break;
      case Op::silu:
        why = "silu has no GPU kernel yet";
        return false;
      case Op::add: {
        if (n.inputs.size() != 2 || !same_axes(g_.node(n.inputs[0]).axes, g_.node(n.inputs[1]).axes) ||
            shape(n.inputs[0]) != shape(n.inputs[1])) {
          why = "add that broadcasts (the GPU adds tensors with identical axes)";
          return false;
        }
        k.op = nvptx::ElementwiseOp::add;
        b = Arg::buf(buf(n.inputs[1]));
        break;
      }
      case Op::scale: {
        k.op = nvptx::ElementwiseOp::scale;
        double factor = n.scalar;
        if (n.dim) {
          const auto d = n.dim->resolve(p_.sizes);
          if (!d) throw ShapeError("cuda: the scale's extent " + n.dim->str() + " is not bound");
          factor = 1.0 / std::sqrt(static_cast<double>(*d));
        }
        k.factor = static_cast<float>(factor);
        break;
      }
      default:  // an op this kernel does not compute runs on the host, never as another op
        why = std::string(op_name(n.op)) + " has no GPU elementwise kernel";
        return false;
    }
    if (n.inputs.empty() || shape(n.inputs[0]) != shape(id)) {
      why = "an elementwise op whose input and output shapes differ";
      return false;
    }
    const std::int64_t count = numel(shape(id));
    return launch(id, k, nvptx::elementwise_grid(k.threads, count),
                  {Arg::buf(buf(n.inputs[0])), b, Arg::buf(buf(id)), Arg::i(count)});
  }

  bool strided(int id, std::string& why) {
    const Node& n = g_.node(id);
    const Shape& out = shape(id);
    why = "a strided copy of more than 6 axes that do not merge";
    switch (n.op) {
      case Op::permute:
      case Op::broadcast: {
        const Node& x = g_.node(n.inputs[0]);
        return copy(id, Arg::buf(buf(n.inputs[0])), Arg::buf(buf(id)), 0, out,
                    strides_by_name(n.axes, x.axes, shape(n.inputs[0])));
      }
      case Op::slice: {
        const std::size_t p = axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]);
        const Shape in_strides = strides_of(shape(n.inputs[0]));
        if (in_strides.size() != out.size()) return false;
        std::int64_t start = n.offset * out[p];
        if (n.dim) {
          const auto s = n.dim->resolve(p_.sizes);
          if (!s) throw ShapeError("cuda: the slice's start " + n.dim->str() + " is not bound");
          start = *s;
        }
        return copy(id, Arg::buf(buf(n.inputs[0])), Arg::buf(buf(id)), start * in_strides[p], out, in_strides);
      }
      default:
        return concat(id);
    }
  }

  /// A KV cache's append: x copied whole, then each outer index's rows (a contiguous run of the
  /// rows and of the output) by one copy each.
  bool update_slice(int id, std::string& why) {
    const Node& n = g_.node(id);
    const Shape& out = shape(id);
    const Shape& rows = shape(n.inputs[1]);
    const std::size_t p = axis_pos(n.axes, n.attr_axes[0]);
    const auto start = n.dim->resolve(p_.sizes);
    why = "an update of more than 6 axes that do not merge";
    if (!start || !copy(id, Arg::buf(buf(n.inputs[0])), Arg::buf(buf(id)), 0, out, strides_of(out))) return false;
    std::int64_t outer = 1, inner = 1;
    for (std::size_t a = 0; a < p; ++a) outer *= out[a];
    for (std::size_t a = p + 1; a < out.size(); ++a) inner *= out[a];
    const std::int64_t run = rows[p] * inner;
    for (std::int64_t o = 0; o < outer; ++o)
      if (!copy(id, Arg::buf(buf(n.inputs[1]), o * run * 4), Arg::buf(buf(id), (o * out[p] + *start) * inner * 4), 0,
                {run}, {1}))
        return false;
    return true;
  }

  /// Along the leading axis (or one with only extent-1 axes before it) each part is a contiguous
  /// range of the output: one copy per part. Otherwise each part goes to a scratch buffer laid out
  /// with the concat axis leading (a contiguous range there), then one copy puts the scratch in
  /// the output's layout.
  bool concat(int id) {
    const Node& n = g_.node(id);
    const Shape& out = shape(id);
    const std::size_t p = axis_pos(n.axes, n.attr_axes[0]);
    std::int64_t outer = 1;
    for (std::size_t a = 0; a < p; ++a) outer *= out[a];
    const std::int64_t total = numel(out);
    const std::int64_t inner = out[p] > 0 ? total / out[p] : 0;  // elements per index of the axis
    int target = buf(id);
    if (outer != 1) target = new_buffer(static_cast<std::size_t>(total) * 4, id);
    std::int64_t at = 0;
    for (int part : n.inputs) {
      const Shape& s = shape(part);
      const Shape st = strides_of(s);
      Shape sizes{s[p]}, strides{st[p]};
      for (std::size_t a = 0; a < s.size(); ++a)
        if (a != p) {
          sizes.push_back(s[a]);
          strides.push_back(st[a]);
        }
      if (!copy(id, Arg::buf(buf(part)), Arg::buf(target, at * inner * 4), 0, sizes, strides)) return false;
      at += s[p];
    }
    if (outer == 1) return true;
    // scratch [out_p, others…] → out
    Shape strides(out.size(), 0);
    std::int64_t run = 1;
    for (std::size_t a = out.size(); a-- > 0;)
      if (a != p) {
        strides[a] = run;
        run *= out[a];
      }
    strides[p] = inner;
    return copy(id, Arg::buf(target), Arg::buf(buf(id)), 0, out, strides);
  }

  const Graph& g_;
  PlanOptions options_;
  Plan p_;
  std::map<int, int> weights_;                  // fused node → its weights buffer
  std::map<int, int> lse_;                      // fused node → its log-sum-exp buffer
  std::map<int, int> dk_, dv_;                  // fused backward node → its dK / dV buffers
  std::map<std::pair<int, int>, int> dtensor_;  // (fused backward node, mod tensor) → its gradient's partial sums
  std::vector<int> readers_;                    // per node: the inputs naming it, and the outputs
  std::set<int> bf16_linear_;                   // gemm nodes on the bf16 tensor-core kernel (linear_bf16)
};

}  // namespace

Plan plan(const Graph& lowered, const Bindings& sizes, const PlanOptions& options) {
  return Planner(lowered, sizes, options).run();
}

}  // namespace qkv::codegen::cuda
