// CompiledGraph (qkv/codegen/cpu/compiled_graph.hpp): plan_module + build_graph_module, JIT'd.
#include <qkv/codegen/cpu/compiled_graph.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <qkv/codegen/jit.hpp>
#include <qkv/codegen/passes/canonicalize.hpp>

#include "cpu/module/module_builder.hpp"
#include "cpu/thread_pool.hpp"

namespace qkv::codegen::cpu {

using EntryFn = int(const std::int64_t*, void* const*, int, void*);
using PrepareFn = void*(const std::int64_t*, void* const*);
using ReleaseFn = void(void*);

struct CompiledGraph::Impl {
  AotSignature signature;
  std::unique_ptr<Jit> jit;
  EntryFn* entry = nullptr;
  PrepareFn* prepare = nullptr;
  ReleaseFn* release = nullptr;
};

CompiledGraph::CompiledGraph(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CompiledGraph::~CompiledGraph() = default;

std::shared_ptr<const CompiledGraph> CompiledGraph::compile(const Graph& lowered, const Bindings& fixed,
                                                            const std::string& function) {
  auto impl = std::make_unique<Impl>();
  std::string error;
  impl->jit = Jit::create(&error);
  if (!impl->jit) throw ToolError("compiling the graph: " + error);
  const ModulePlan plan = plan_module(lowered, fixed, impl->jit->target());
  impl->signature = module_signature(lowered, AotOptions{.function = function, .dynamic = {}}, plan);
  auto context = std::make_unique<llvm::LLVMContext>();
  auto module = build_graph_module(*context, lowered, impl->signature, plan, impl->jit->target(), function, false);
  if (!impl->jit->add(std::move(module), std::move(context), &error)) throw ToolError("compiling the graph: " + error);
  impl->entry = impl->jit->lookup<EntryFn>(function + "_entry", &error);
  if (impl->entry) impl->prepare = impl->jit->lookup<PrepareFn>(function + "_prepare_entry", &error);
  if (impl->prepare) impl->release = impl->jit->lookup<ReleaseFn>(function + "_release_entry", &error);
  if (!impl->release) throw ToolError("compiling the graph: " + error);
  // The parallel regions run on the process's pool (its threads persist across calls).
  using SetParallelFn = void(int (*)(void (*)(void*, std::int64_t), void*, std::int64_t, int));
  auto* set_parallel = impl->jit->lookup<SetParallelFn>(function + "_set_parallel", &error);
  if (!set_parallel) throw ToolError("compiling the graph: " + error);
  set_parallel(&ThreadPool::module_hook);
  return std::shared_ptr<const CompiledGraph>(new CompiledGraph(std::move(impl)));
}

const AotSignature& CompiledGraph::signature() const { return impl_->signature; }

int CompiledGraph::run(const std::int64_t* sizes, void* const* args, int threads) const {
  return impl_->entry(sizes, args, threads, nullptr);
}

void* CompiledGraph::prepare(const std::int64_t* sizes, void* const* args) const { return impl_->prepare(sizes, args); }

int CompiledGraph::run(void* handle, const std::int64_t* sizes, void* const* args, int threads) const {
  return handle ? impl_->entry(sizes, args, threads, handle) : 5;
}

void CompiledGraph::release(void* handle) const { impl_->release(handle); }

std::shared_ptr<const CompiledGraph> compiled_for(const Graph& lowered, const Bindings& sizes, Specialise specialise) {
  Bindings fixed;
  if (specialise == Specialise::every_size) fixed = sizes;
  for (const auto& s : specialised_sizes(lowered)) {
    auto it = sizes.find(s);
    if (it == sizes.end()) throw ShapeError("execute: no size given for the dynamic extent '" + s + "'");
    fixed[s] = it->second;
  }
  struct Entry {
    Graph graph;
    Bindings fixed;
    std::shared_ptr<const CompiledGraph> compiled;
  };
  static std::mutex mutex;
  static std::map<std::uint64_t, std::vector<Entry>> cache;
  std::lock_guard lock(mutex);  // compiling under the lock: one compilation per shape class
  auto& bucket = cache[lowered.hash()];
  auto it = std::find_if(bucket.begin(), bucket.end(),
                         [&](const Entry& e) { return e.fixed == fixed && e.graph == lowered; });
  if (it != bucket.end()) return it->compiled;
  // The module's graph: leaves and outputs as in `lowered`, so the same signature (as aot.cpp's prepare).
  bucket.push_back({lowered, fixed, CompiledGraph::compile(fuse_elementwise(lowered), fixed)});
  return bucket.back().compiled;
}

}  // namespace qkv::codegen::cpu
