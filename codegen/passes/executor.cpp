#include <qkv/codegen/cpu/executor.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <qkv/codegen/aot.hpp>
#include <qkv/codegen/cpu/fused_call.hpp>
#include <qkv/codegen/cpu/gemm.hpp>
#include <qkv/codegen/cpu/rowwise.hpp>
#include <qkv/codegen/cpu/run_attention.hpp>
#include <qkv/codegen/passes/buffer_plan.hpp>
#include <qkv/codegen/passes/pipeline.hpp>

#include "../src/graph_util.hpp"

namespace qkv::codegen::cpu {

namespace {

struct FusedResult {
  NdArray out, weights;
};

FusedResult run_fused(const Graph& g, int id, const std::vector<const NdArray*>& in, const Bindings& b, int threads) {
  const FusedAttentionCall call = describe_fused_attention(g, id, b);
  AttentionArgs args;
  args.batch = call.batch;
  args.len_q = call.len_q;
  args.len_k = call.len_k;
  args.seed = call.seed;
  args.q = in[0]->as<float>().data();
  args.k = in[1]->as<float>().data();
  args.v = in[2]->as<float>().data();

  std::vector<std::uint8_t> keep;
  if (call.key_padding_input >= 0) {
    const auto bits = in[static_cast<std::size_t>(call.key_padding_input)]->as<bool>();
    keep.assign(static_cast<std::size_t>(args.batch * args.len_k), 1);
    for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = bits[i] ? 1 : 0;
  }
  std::vector<float> bias;
  if (!call.bias_terms.empty()) bias.assign(static_cast<std::size_t>(args.len_q * args.len_k), 0.0f);
  for (const auto& term : call.bias_terms) {
    const std::vector<float> vals = in[static_cast<std::size_t>(term.input)]->to_f32();
    for (std::int64_t i = 0; i < args.len_q; ++i)
      for (std::int64_t j = 0; j < args.len_k; ++j) {
        const float v = vals[static_cast<std::size_t>(i * term.stride_q + j * term.stride_k)];
        float& dst = bias[static_cast<std::size_t>(i * args.len_k + j)];
        if (term.keep_mask) {
          if (v == 0.0f) dst = -std::numeric_limits<float>::infinity();
        } else {
          dst += v;
        }
      }
  }
  args.key_keep = keep.empty() ? nullptr : keep.data();
  args.bias = bias.empty() ? nullptr : bias.data();

  FusedResult r;
  r.out = NdArray::zeros(DType::f32, call.out_shape);
  args.out = r.out.as<float>().data();
  if (call.spec.write_weights) {
    r.weights = NdArray::zeros(DType::f32, {args.batch, call.spec.hq, args.len_q, args.len_k});
    args.weights = r.weights.as<float>().data();
  }
  run_attention(call.spec, args, threads);
  return r;
}

/// A linear node whose projected axis is x's last (so the output's is last too) is a GEMM:
/// y[M, out] = x[M, in] · W[out, in]ᵀ + b, M = the product of x's other extents. Other layouts
/// return nullopt and go to the reference implementation.
std::optional<NdArray> run_linear_node(const Graph& g, int id, const std::vector<const NdArray*>& in, int threads) {
  const Node& n = g.node(id);
  if (!util::linear_on_last_axis(g, n)) return std::nullopt;
  const NdArray &x = *in[0], &w = *in[1];
  const NdArray* b = in.size() > 2 ? in[2] : nullptr;
  if (x.dtype != DType::f32 || w.dtype != DType::f32 || (b && b->dtype != DType::f32)) return std::nullopt;
  if (x.shape.empty() || w.shape.size() != 2 || x.shape.back() != w.shape[1]) return std::nullopt;
  if (b && (b->shape.size() != 1 || b->shape[0] != w.shape[0])) return std::nullopt;
  const std::int64_t k = w.shape[1], out = w.shape[0];
  std::vector<std::int64_t> shape = x.shape;
  shape.back() = out;
  NdArray y = NdArray::zeros(DType::f32, shape);
  const std::int64_t m = k > 0 ? x.numel() / k : y.numel() / std::max<std::int64_t>(out, 1);
  run_linear(x.as<float>().data(), w.as<float>().data(), b ? b->as<float>().data() : nullptr, y.as<float>().data(), m,
             out, k, threads);
  return y;
}

bool all_f32(const Node& n, const std::vector<const NdArray*>& in) {
  if (n.dtype == DType::boolean) return false;  // the reference writes every other dtype as f32 too
  return std::all_of(in.begin(), in.end(), [](const NdArray* a) { return a->dtype == DType::f32; });
}

/// layer_norm over x's last axis, gelu, relu, and add of two tensors with identical axes (names
/// and order) run on the JIT'd row-wise kernels (rowwise.hpp); other forms return nullopt and
/// go to the reference implementation.
std::optional<NdArray> run_rowwise_node(const Graph& g, int id, const std::vector<const NdArray*>& in, int threads) {
  const Node& n = g.node(id);
  if (!all_f32(n, in) || in.empty()) return std::nullopt;
  const NdArray& x = *in[0];
  switch (n.op) {
    case Op::layer_norm: {
      if (in.size() != 3 || x.shape.empty() || !util::layer_norm_on_last_axis(g, n)) return std::nullopt;
      const std::int64_t len = x.shape.back();
      for (std::size_t k = 1; k <= 2; ++k)
        if (in[k]->shape.size() != 1 || in[k]->shape[0] != len) return std::nullopt;
      NdArray y = NdArray::zeros(DType::f32, x.shape);
      const std::int64_t rows = len > 0 ? x.numel() / len : 0;
      run_layer_norm(x.as<float>().data(), in[1]->as<float>().data(), in[2]->as<float>().data(), y.as<float>().data(),
                     rows, len, n.scalar, threads);
      return y;
    }
    case Op::gelu:
    case Op::relu: {
      if (in.size() != 1) return std::nullopt;
      NdArray y = NdArray::zeros(DType::f32, x.shape);
      (n.op == Op::gelu ? run_gelu : run_relu)(x.as<float>().data(), y.as<float>().data(), x.numel(), threads);
      return y;
    }
    case Op::add: {
      if (in.size() != 2 || in[1]->shape != x.shape) return std::nullopt;
      if (!util::same_axes(g.node(n.inputs[0]).axes, g.node(n.inputs[1]).axes)) return std::nullopt;
      NdArray y = NdArray::zeros(DType::f32, x.shape);
      run_add(x.as<float>().data(), in[1]->as<float>().data(), y.as<float>().data(), x.numel(), threads);
      return y;
    }
    default:
      return std::nullopt;
  }
}

/// Any other node (broadcasting add/mul/bias/keep_mask, scale, softmax, causal, dropout,
/// contract, permute, slice, concat, broadcast, fill, linear/layer_norm over another axis):
/// compiled on its own through the AOT compiler (a one-node graph under the bound sizes: the
/// loop nests of aot.hpp), cached by that graph. Views (split, merge, rename, view) only
/// reinterpret their input and stay with the reference implementation (a copy).
NdArray run_compiled_node(const Graph& g, int id, const std::vector<const NdArray*>& in, const Bindings& b,
                          int threads) {
  const Node& n = g.node(id);
  Graph one;
  auto fixed = [&](std::vector<Axis> axes) {
    for (auto& a : axes) a.extent = Extent::fixed(*a.extent.resolve(b));
    return axes;
  };
  for (std::size_t k = 0; k < n.inputs.size(); ++k) {
    const Node& x = g.node(n.inputs[k]);
    Node leaf;
    leaf.op = Op::input;
    leaf.name = "in" + std::to_string(k);
    leaf.axes = fixed(x.axes);
    leaf.dtype = x.dtype == DType::boolean ? DType::boolean : DType::f32;
    one.add(std::move(leaf));
  }
  Node copy = n;
  for (std::size_t k = 0; k < copy.inputs.size(); ++k) copy.inputs[k] = static_cast<int>(k);
  copy.axes = fixed(copy.axes);
  if (copy.dim) {  // scale by 1/sqrt(a bound extent): the factor itself, so the cache key is concrete
    const auto d = copy.dim->resolve(b);
    if (!d) throw ShapeError("execute: the scale's extent " + copy.dim->str() + " is not bound");
    copy.scalar = 1.0 / std::sqrt(static_cast<double>(*d));
    copy.dim.reset();
  }
  if (copy.dtype != DType::boolean) copy.dtype = DType::f32;
  one.mark_output(one.add(std::move(copy)), "out");

  struct Entry {
    Graph source;
    std::shared_ptr<const codegen::AotModel> model;
    std::shared_ptr<std::mutex> busy;  // the thread count is a setting of the compiled function
  };
  static std::mutex mutex;
  static std::map<std::uint64_t, std::vector<Entry>> cache;
  Entry entry;
  {
    std::lock_guard lock(mutex);
    auto& bucket = cache[one.hash()];
    auto it = std::find_if(bucket.begin(), bucket.end(), [&](const Entry& e) { return e.source == one; });
    if (it == bucket.end()) {
      bucket.push_back({one, std::shared_ptr<const codegen::AotModel>(codegen::AotModel::compile(one, {})),
                        std::make_shared<std::mutex>()});
      it = std::prev(bucket.end());
    }
    entry = *it;
  }
  std::vector<std::int64_t> shape;
  for (const auto& a : entry.source.nodes().back().axes) shape.push_back(a.extent.value);
  NdArray out = NdArray::zeros(n.dtype == DType::boolean ? DType::boolean : DType::f32, shape);
  std::vector<void*> args;
  for (const NdArray* x : in) args.push_back(const_cast<void*>(static_cast<const void*>(x->bytes.data())));
  args.push_back(out.bytes.data());
  std::lock_guard lock(*entry.busy);
  entry.model->set_threads(threads > 0 ? threads : 0);
  if (entry.model->run(args.data()) != 0) throw std::bad_alloc();
  return out;
}

}  // namespace

RunResult execute(const Graph& g, const Feeds& feeds, int threads) {
  RunResult result;
  result.bindings = bind_extents(g, feeds);
  const std::vector<int> last = last_uses(g);
  std::vector<std::optional<NdArray>> values(g.size());
  std::map<int, NdArray> weights;  // fused node id -> its weights, for attention_weights
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    const Node& n = g.node(id);
    if (n.op == Op::input || n.op == Op::param) {
      const NdArray& a = feeds.find(n.name)->second;  // bind_extents checked it exists
      values[static_cast<std::size_t>(id)] =
          (n.dtype == DType::boolean || a.dtype == DType::f32) ? a : NdArray::from_f32(a.to_f32(), a.shape);
    } else {
      std::vector<const NdArray*> in;
      for (int x : n.inputs) in.push_back(&*values[static_cast<std::size_t>(x)]);
      if (n.op == Op::fused_attention) {
        FusedResult r = run_fused(g, id, in, result.bindings, threads);
        values[static_cast<std::size_t>(id)] = std::move(r.out);
        if (n.attention->write_weights) weights[id] = std::move(r.weights);
      } else if (n.op == Op::attention_weights) {
        values[static_cast<std::size_t>(id)] = std::move(weights.at(n.inputs[0]));
      } else if (std::optional<NdArray> y; n.op == Op::linear && (y = run_linear_node(g, id, in, threads))) {
        values[static_cast<std::size_t>(id)] = std::move(*y);
      } else if (std::optional<NdArray> r;
                 (n.op == Op::layer_norm || n.op == Op::gelu || n.op == Op::relu || n.op == Op::add) &&
                 (r = run_rowwise_node(g, id, in, threads))) {
        values[static_cast<std::size_t>(id)] = std::move(*r);
      } else if (util::is_view(n.op) && last[static_cast<std::size_t>(n.inputs[0])] == id) {
        // The input's last reader: take its buffer under the view's shape instead of copying.
        auto& from = values[static_cast<std::size_t>(n.inputs[0])];
        NdArray v = std::move(*from);
        from.reset();
        std::vector<std::int64_t> shape;
        for (const auto& a : n.axes) shape.push_back(*a.extent.resolve(result.bindings));
        if (util::numel(shape) != v.numel())
          throw std::logic_error("qkv internal error: execute: view %" + std::to_string(id) + " changes the size");
        v.shape = std::move(shape);
        values[static_cast<std::size_t>(id)] = std::move(v);
      } else if (util::is_view(n.op)) {
        values[static_cast<std::size_t>(id)] = evaluate_node(g, id, in, result.bindings);
      } else {
        values[static_cast<std::size_t>(id)] = run_compiled_node(g, id, in, result.bindings, threads);
      }
    }
    for (int x : n.inputs)  // free what this node was the last to read
      if (last[static_cast<std::size_t>(x)] == id) values[static_cast<std::size_t>(x)].reset();
  }
  for (const auto& o : g.outputs()) {
    const NdArray& v = *values[static_cast<std::size_t>(o.node)];
    result.outputs[o.name] =
        v.dtype == DType::f32 || v.dtype == DType::boolean ? v : NdArray::from_f32(v.to_f32(), v.shape);
  }
  return result;
}

RunResult run(const Graph& g, const Feeds& feeds, int threads) { return execute(*lower_cached(g), feeds, threads); }

int fused_attention_count(const Graph& g) {
  int n = 0;
  const Graph lowered = lower(g);
  for (const auto& node : lowered.nodes()) n += node.op == Op::fused_attention;
  return n;
}

}  // namespace qkv::codegen::cpu
