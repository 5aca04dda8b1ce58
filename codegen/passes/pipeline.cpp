#include <qkv/codegen/passes/pipeline.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <mutex>

#include <qkv/codegen/passes/canonicalize.hpp>
#include <qkv/codegen/passes/fuse_attention.hpp>
#include <qkv/codegen/passes/layout.hpp>
#include <qkv/codegen/passes/legalize_dtypes.hpp>
#include <qkv/codegen/passes/verify.hpp>

namespace qkv::codegen {

Graph lower(const Graph& input, const PipelineOptions& o) {
  std::ostream& log = o.log ? *o.log : std::cerr;
  Graph g = input;
  Stage stage = Stage::any;  // from the layout pass on, the kernels' operand orders hold too
  auto step = [&](const char* name, auto&& pass) {
    const auto t0 = std::chrono::steady_clock::now();
    g = pass(g);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (std::string_view(name) == "layout") stage = Stage::laid_out;
    if (o.verify_each) verify_or_throw(g, name, stage);
    if (o.time_passes) log << "pass " << name << ": " << ms << " ms, " << g.size() << " nodes\n";
    if (o.dump_after == name || o.dump_after == "all") log << "--- after " << name << " ---\n" << g.table();
  };
  step("verify", [](const Graph& x) {
    verify_or_throw(x, "the DSL");
    return x;
  });
  step("canonicalize", canonicalize);
  step("fuse-attention", fuse_attention);
  step("layout", layout);
  step("cleanup", canonicalize);
  step("legalize-dtypes", legalize_dtypes);
  return g;
}

ForwardForGradients fuse_for_gradients(const Graph& g, int loss) {
  std::string name = "loss";  // an output name g does not use
  while (std::any_of(g.outputs().begin(), g.outputs().end(), [&](const auto& o) { return o.name == name; }))
    name += "'";
  Graph with_loss = g;
  with_loss.mark_output(loss, name);
  const Graph fused = fuse_attention(canonicalize(with_loss));
  ForwardForGradients out;
  for (const Node& n : fused.nodes()) out.g.add(n);
  for (const auto& c : fused.constraints()) out.g.require(c);
  for (const auto& o : fused.outputs()) {
    if (o.name == name)
      out.loss = o.node;
    else
      out.g.mark_output(o.node, o.name);
  }
  return out;
}

std::shared_ptr<const Graph> lower_cached(const Graph& g) {
  // By the source graph's hash; the source is kept to tell a hash collision from a hit, and the
  // lowered graphs are shared so a replaced entry never pulls one from under a running call.
  struct Entry {
    Graph source;
    std::shared_ptr<const Graph> lowered;
  };
  static std::mutex mutex;
  static std::map<std::uint64_t, Entry> cache;
  std::lock_guard lock(mutex);
  auto it = cache.find(g.hash());
  if (it == cache.end() || !(it->second.source == g))
    it = cache.insert_or_assign(g.hash(), Entry{g, std::make_shared<const Graph>(lower(g))}).first;
  return it->second.lowered;
}

}  // namespace qkv::codegen
