#include <qkv/codegen/cpu/executor.hpp>

#include <map>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

#include <qkv/codegen/cpu/compiled_graph.hpp>
#include <qkv/codegen/lowering/storage.hpp>
#include <qkv/codegen/passes/pipeline.hpp>

#include "cpu/kernels/gemm_kernel.hpp"

namespace qkv::codegen::cpu {

namespace {
/// Status 3 of a compiled graph: an embedding met an id outside its table. The first such id
/// of an embedding whose ids are a graph input, found in the feeds, for the message.
[[noreturn]] void throw_bad_embedding_id(const Graph& g, const Feeds& feeds, const Bindings& b) {
  for (const auto& n : g.nodes()) {
    if (n.op != Op::embedding) continue;
    const Node& ids = g.node(n.inputs[1]);
    const auto rows = g.node(n.inputs[0]).axes.at(0).extent.resolve(b);
    const auto it = feeds.find(ids.name);
    if (ids.op != Op::input || !rows || it == feeds.end()) continue;
    const std::vector<float> v = it->second.to_f32();
    for (std::size_t k = 0; k < v.size(); ++k)
      if (!(v[k] >= 0.0f && v[k] < static_cast<float>(*rows)))
        throw InputError(embedding_id_message(n.name, v[k], static_cast<std::int64_t>(k), "`" + ids.name + "`", *rows));
  }
  throw InputError("embedding: an id is outside its table");
}
}  // namespace

/// One prepared handle per compiled graph, for the parameter arrays it was prepared with.
struct BoundRunner::State {
  struct Entry {
    std::shared_ptr<const CompiledGraph> compiled;
    std::vector<const void*> params;  // the feeds' bytes, dtypes and shapes it was made for
    std::vector<std::pair<DType, std::vector<std::int64_t>>> shapes;
    void* handle = nullptr;
  };
  std::map<const CompiledGraph*, Entry> entries;
  int made = 0;
  ~State() {
    for (auto& [k, e] : entries) e.compiled->release(e.handle);
  }
};

namespace {
RunResult execute_bound(const Graph& g, const Feeds& feeds, int threads, const Destinations& into,
                        BoundRunner::State* bound, Specialise specialise = Specialise::kernels);
}  // namespace

RunResult execute(const Graph& g, const Feeds& feeds, int threads, const Destinations& into, Specialise specialise) {
  return execute_bound(g, feeds, threads, into, nullptr, specialise);
}

BoundRunner::BoundRunner(int threads, bool repack)
    : state_(std::make_shared<State>()), threads_(threads), repack_(repack) {}

RunResult BoundRunner::operator()(const Graph& g, const Feeds& feeds, const Destinations& into) const {
  return execute_bound(*lower_cached(g), feeds, threads_, into, repack_ ? state_.get() : nullptr);
}

int BoundRunner::prepared() const { return state_->made; }

namespace {
RunResult execute_bound(const Graph& g, const Feeds& feeds, int threads, const Destinations& into,
                        BoundRunner::State* bound, Specialise specialise) {
  RunResult result;
  result.bindings = bind_extents(g, feeds);
  const auto compiled = compiled_for(g, result.bindings, specialise);
  const AotSignature& sig = compiled->signature();

  std::vector<std::int64_t> sizes;
  for (const auto& s : sig.sizes) sizes.push_back(result.bindings.at(s.symbol));
  std::vector<void*> args;
  std::vector<NdArray> converted;  // feeds stored otherwise than the backend stores them
  converted.reserve(sig.args.size());
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    const Node& n = g.node(id);
    if (!is_array_leaf(n)) continue;
    const NdArray& a = feeds.find(n.name)->second;  // bind_extents checked it exists
    const NdArray* use = &a;
    const DType stored = cpu_storage_dtype(g, id);
    if (a.dtype != stored) {
      if (stored == DType::boolean)
        throw std::invalid_argument("execute: `" + n.name + "` must be a bool tensor, not " +
                                    std::string(dtype_name(a.dtype)));
      use = &converted.emplace_back(a.converted(stored));  // integer inputs as integers
    }
    args.push_back(const_cast<std::byte*>(reinterpret_cast<const std::byte*>(use->bytes.data())));
  }
  std::vector<NdArray> outs;
  outs.reserve(g.outputs().size());
  for (const auto& o : g.outputs()) {
    const Node& n = g.node(o.node);
    std::vector<std::int64_t> shape;
    for (const auto& a : n.axes) shape.push_back(*a.extent.resolve(result.bindings));
    if (const auto d = into.find(o.name); d != into.end()) {
      if (d->second->shape != shape || d->second->dtype != storage_dtype(n.dtype))
        throw ShapeError("execute: the destination of output '" + o.name + "' is " +
                         std::string(dtype_name(d->second->dtype)) + " " + shape_to_string(d->second->shape) +
                         ", not " + std::string(dtype_name(storage_dtype(n.dtype))) + " " + shape_to_string(shape));
      outs.emplace_back();
      args.push_back(d->second->bytes.data());
      continue;
    }
    outs.push_back(NdArray::zeros(storage_dtype(n.dtype), shape));
    args.push_back(outs.back().bytes.data());
  }
  int rc = 0;
  if (bound) {  // the handle for these parameter arrays, made once
    std::vector<const void*> params;
    std::vector<std::pair<DType, std::vector<std::int64_t>>> shapes;
    for (const auto& n : g.nodes())
      if (n.op == Op::param) {
        const NdArray& a = feeds.find(n.name)->second;
        params.push_back(a.bytes.data());
        shapes.emplace_back(a.dtype, a.shape);
      }
    auto& e = bound->entries[compiled.get()];
    if (!e.handle || e.params != params || e.shapes != shapes) {
      compiled->release(e.handle);
      e = {compiled, params, shapes, compiled->prepare(sizes.data(), args.data())};
      if (!e.handle) throw std::bad_alloc();
      ++bound->made;
    }
    rc = compiled->run(e.handle, sizes.data(), args.data(), threads);
  } else {
    rc = compiled->run(sizes.data(), args.data(), threads);
  }
  if (rc == 4) throw ShapeError("execute: the parameters' sizes differ from those their handle was prepared for");
  if (rc == 1) throw std::bad_alloc();
  if (rc == 3) throw_bad_embedding_id(g, feeds, result.bindings);
  if (rc != 0) throw ShapeError("execute: the compiled graph refused the sizes (code " + std::to_string(rc) + ")");
  for (std::size_t k = 0; k < outs.size(); ++k)
    if (!into.contains(g.outputs()[k].name)) result.outputs[g.outputs()[k].name] = std::move(outs[k]);
  return result;
}
}  // namespace

RunResult run(const Graph& g, const Feeds& feeds, int threads, const Destinations& into, Specialise specialise) {
  return execute(*lower_cached(g), feeds, threads, into, specialise);
}

int gemv_max_rows() { return kGemvMaxRows; }

int fused_attention_count(const Graph& g) {
  int n = 0;
  const Graph lowered = lower(g);
  for (const auto& node : lowered.nodes()) n += node.op == Op::fused_attention;
  return n;
}

}  // namespace qkv::codegen::cpu
