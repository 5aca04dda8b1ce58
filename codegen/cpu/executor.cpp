#include <qkv/codegen/cpu/executor.hpp>

#include <new>
#include <stdexcept>
#include <vector>

#include <qkv/codegen/cpu/compiled_graph.hpp>
#include <qkv/codegen/lowering/storage.hpp>
#include <qkv/codegen/passes/pipeline.hpp>

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

RunResult execute(const Graph& g, const Feeds& feeds, int threads) {
  RunResult result;
  result.bindings = bind_extents(g, feeds);
  const auto compiled = compiled_for(g, result.bindings);
  const AotSignature& sig = compiled->signature();

  std::vector<std::int64_t> sizes;
  for (const auto& s : sig.sizes) sizes.push_back(result.bindings.at(s.symbol));
  std::vector<void*> args;
  std::vector<NdArray> converted;  // feeds stored otherwise than the backend stores them
  converted.reserve(sig.args.size());
  for (const auto& n : g.nodes()) {
    if (n.op != Op::input && n.op != Op::param) continue;
    const NdArray& a = feeds.find(n.name)->second;  // bind_extents checked it exists
    const NdArray* use = &a;
    if (a.dtype != storage_dtype(n.dtype)) {
      if (storage_dtype(n.dtype) == DType::boolean)
        throw std::invalid_argument("execute: `" + n.name + "` must be a bool tensor, not " +
                                    std::string(dtype_name(a.dtype)));
      use = &converted.emplace_back(NdArray::from_f32(a.to_f32(), a.shape));
    }
    args.push_back(const_cast<std::byte*>(reinterpret_cast<const std::byte*>(use->bytes.data())));
  }
  std::vector<NdArray> outs;
  outs.reserve(g.outputs().size());
  for (const auto& o : g.outputs()) {
    const Node& n = g.node(o.node);
    std::vector<std::int64_t> shape;
    for (const auto& a : n.axes) shape.push_back(*a.extent.resolve(result.bindings));
    outs.push_back(NdArray::zeros(storage_dtype(n.dtype), shape));
    args.push_back(outs.back().bytes.data());
  }
  const int rc = compiled->run(sizes.data(), args.data(), threads);
  if (rc == 1) throw std::bad_alloc();
  if (rc == 3) throw_bad_embedding_id(g, feeds, result.bindings);
  if (rc != 0) throw ShapeError("execute: the compiled graph refused the sizes (code " + std::to_string(rc) + ")");
  for (std::size_t k = 0; k < outs.size(); ++k) result.outputs[g.outputs()[k].name] = std::move(outs[k]);
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
