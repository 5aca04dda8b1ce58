// The ORC LLJIT wrapper: host target machine, -O3 pipeline, typed lookup, errors as strings.
#include <qkv/codegen/jit.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

#include <unistd.h>

#include <llvm/ExecutionEngine/JITLink/JITLink.h>
#include <llvm/ExecutionEngine/ObjectCache.h>
#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ObjectLinkingLayer.h>
#include <llvm/ExecutionEngine/Orc/ObjectTransformLayer.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/TargetParser/Triple.h>

#include "llvm/code_cache.hpp"
#include "llvm/optimize.hpp"
#include "llvm/split_compile.hpp"

namespace qkv::codegen {

/// Hands each object LLJIT compiles from a module named by disk_cache::module_name to the disk
/// cache. Lookups do not come through here: Jit::add checks the cache before the -O3 pipeline.
class DiskObjectCache final : public llvm::ObjectCache {
 public:
  explicit DiskObjectCache(CodeCacheSettings settings) : settings_(std::move(settings)) {}
  void notifyObjectCompiled(const llvm::Module* module, llvm::MemoryBufferRef object) override {
    if (const auto key = disk_cache::key_of_module(*module)) disk_cache::store(settings_, *key, object.getBuffer());
  }
  std::unique_ptr<llvm::MemoryBuffer> getObject(const llvm::Module*) override { return nullptr; }
  [[nodiscard]] const CodeCacheSettings& settings() const { return settings_; }

 private:
  CodeCacheSettings settings_;
};

/// With QKV_PERF_MAP set, writes every function the JIT links to /tmp/perf-<pid>.map (Linux perf's
/// format for JIT code: start, size, name), so `perf report` names the generated kernels.
class PerfMapPlugin final : public llvm::orc::ObjectLinkingLayer::Plugin {
 public:
  static std::unique_ptr<PerfMapPlugin> from_environment() {
    if (!std::getenv("QKV_PERF_MAP")) return nullptr;
    const std::string path = "/tmp/perf-" + std::to_string(::getpid()) + ".map";
    std::FILE* file = std::fopen(path.c_str(), "a");
    return file ? std::make_unique<PerfMapPlugin>(file) : nullptr;
  }
  explicit PerfMapPlugin(std::FILE* file) : file_(file) {}
  ~PerfMapPlugin() override { std::fclose(file_); }
  PerfMapPlugin(const PerfMapPlugin&) = delete;
  PerfMapPlugin& operator=(const PerfMapPlugin&) = delete;

  void modifyPassConfig(llvm::orc::MaterializationResponsibility&, llvm::jitlink::LinkGraph&,
                        llvm::jitlink::PassConfiguration& config) override {
    // A call between two functions of one section needs no relocation, so nothing keeps a local
    // function's symbol alive and the linker would drop its name: keep them for the map.
    config.PrePrunePasses.push_back([](llvm::jitlink::LinkGraph& graph) {
      for (llvm::jitlink::Symbol* symbol : graph.defined_symbols())
        if (symbol->isCallable() && symbol->hasName()) symbol->setLive(true);
      return llvm::Error::success();
    });
    config.PostFixupPasses.push_back([this](llvm::jitlink::LinkGraph& graph) {
      const std::lock_guard lock(mutex_);
      for (const llvm::jitlink::Symbol* symbol : graph.defined_symbols())
        if (symbol->isCallable() && symbol->hasName() && symbol->getSize() > 0)
          std::fprintf(file_, "%llx %llx %s\n", static_cast<unsigned long long>(symbol->getAddress().getValue()),
                       static_cast<unsigned long long>(symbol->getSize()), symbol->getName().str().c_str());
      std::fflush(file_);
      return llvm::Error::success();
    });
  }
  llvm::Error notifyFailed(llvm::orc::MaterializationResponsibility&) override { return llvm::Error::success(); }
  llvm::Error notifyRemovingResources(llvm::orc::JITDylib&, llvm::orc::ResourceKey) override {
    return llvm::Error::success();
  }
  void notifyTransferringResources(llvm::orc::JITDylib&, llvm::orc::ResourceKey, llvm::orc::ResourceKey) override {}

 private:
  std::FILE* file_;
  std::mutex mutex_;
};

struct Jit::Impl {
  HostTarget host;
  std::unique_ptr<DiskObjectCache> cache;  // code_cache() when the JIT was made; must outlive jit
  std::string key;
  std::string refused;  // inspect mode, a target this CPU cannot run: why lookups hand out nothing
  bool inspect = false;
  mutable std::mutex objects_mutex;
  std::vector<std::string> objects;
  std::unique_ptr<llvm::TargetMachine> machine;  // for the optimisation pipeline's cost models
  std::unique_ptr<llvm::orc::LLJIT> jit;
  std::mutex mutex;  // the pass pipeline and LLJIT's module adds are serialised

  bool run_pipeline(llvm::Module& module, std::string* error);
};

namespace {

std::atomic<std::int64_t> g_modules{0}, g_compile_ns{0}, g_loaded{0};

/// Adds the time from its construction to its destruction to the process's compile time.
struct CompileTimer {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~CompileTimer() {
    g_compile_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  }
};

bool fail(std::string* error, std::string message) {
  if (error) *error = std::move(message);
  return false;
}

std::string consume(llvm::Error e) { return llvm::toString(std::move(e)); }

std::mutex g_target_mutex;
std::optional<HostTarget> g_target;  // set_jit_target's

llvm::orc::JITTargetMachineBuilder host_machine_builder(const HostTarget& host) {
  llvm::orc::JITTargetMachineBuilder jtmb{llvm::Triple(llvm::sys::getProcessTriple())};
  jtmb.setCPU(host.cpu);
  jtmb.addFeatures(host.features);
  jtmb.setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
  return jtmb;
}
}  // namespace

JitStats jit_stats() { return {g_modules.load(), static_cast<double>(g_compile_ns.load()) / 1e6, g_loaded.load()}; }

/// The host, read once per process (every JIT and every check compares against it).
const HostTarget& this_host() {
  static const HostTarget host = host_target();
  return host;
}

HostTarget jit_target() {
  std::lock_guard lock(g_target_mutex);
  return g_target ? *g_target : this_host();
}

void set_jit_target(const HostTarget& target) {
  const HostTarget& host = this_host();
  if (target_arch(target.triple) != target_arch(host.triple))
    throw std::invalid_argument("the JIT runs code for this host's architecture (" + target_arch(host.triple) +
                                "), not " + target_arch(target.triple) + "; use qkv emit for other targets");
  const auto missing = missing_features(target, host);
  if (!missing.empty()) throw std::invalid_argument(cpu_error(target, missing));
  std::lock_guard lock(g_target_mutex);
  g_target = target;
}

Jit::Jit(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Jit::~Jit() = default;

std::unique_ptr<Jit> Jit::create(std::string* error) { return create(JitOptions{}, error); }

std::unique_ptr<Jit> Jit::create(const JitOptions& options, std::string* error) {
  static const bool initialised = [] {
    return !llvm::InitializeNativeTarget() && !llvm::InitializeNativeTargetAsmPrinter();
  }();
  if (!initialised) {
    fail(error, "jit: LLVM has no native target for this host (InitializeNativeTarget failed)");
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->host = options.target ? *options.target : jit_target();
  impl->inspect = options.inspect;
  impl->key = impl->host.cpu + ":" + joined_features(impl->host);
  if (target_arch(impl->host.triple) != target_arch(llvm::sys::getProcessTriple())) {
    fail(error, "jit: cannot run code for " + impl->host.triple + " in this process");
    return nullptr;
  }
  if (const auto missing = missing_features(impl->host, this_host()); !missing.empty()) {
    impl->refused = "jit: " + cpu_error(impl->host, missing);
    if (!options.inspect) {
      fail(error, impl->refused);
      return nullptr;
    }
  }

  auto machine = host_machine_builder(impl->host).createTargetMachine();
  if (!machine) {
    fail(error, "jit: cannot create a target machine for " + impl->host.triple + " (" + impl->host.cpu +
                    "): " + consume(machine.takeError()));
    return nullptr;
  }
  impl->machine = std::move(*machine);

  llvm::orc::LLJITBuilder builder;
  builder.setJITTargetMachineBuilder(host_machine_builder(impl->host));
  if (const auto settings = code_cache(); settings && !options.inspect) {
    impl->cache = std::make_unique<DiskObjectCache>(*settings);
    builder.setCompileFunctionCreator([cache = impl->cache.get()](llvm::orc::JITTargetMachineBuilder jtmb)
                                          -> llvm::Expected<std::unique_ptr<llvm::orc::IRCompileLayer::IRCompiler>> {
      return std::make_unique<llvm::orc::ConcurrentIRCompiler>(std::move(jtmb), cache);
    });
  }
  if (auto plugin = PerfMapPlugin::from_environment())
    builder.setObjectLinkingLayerCreator(
        [plugin = std::shared_ptr<PerfMapPlugin>(std::move(plugin))](
            llvm::orc::ExecutionSession& session,
            const llvm::Triple&) -> llvm::Expected<std::unique_ptr<llvm::orc::ObjectLayer>> {
          auto layer = std::make_unique<llvm::orc::ObjectLinkingLayer>(session);
          layer->addPlugin(plugin);
          return layer;
        });
  auto jit = builder.create();
  if (!jit) {
    fail(error, "jit: cannot create LLJIT: " + consume(jit.takeError()));
    return nullptr;
  }
  impl->jit = std::move(*jit);
  if (impl->inspect) {
    Impl* keeper = impl.get();
    impl->jit->getObjTransformLayer().setTransform(
        [keeper](std::unique_ptr<llvm::MemoryBuffer> object) -> llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>> {
          std::lock_guard lock(keeper->objects_mutex);
          keeper->objects.push_back(object->getBuffer().str());
          return object;
        });
  }
  return std::unique_ptr<Jit>(new Jit(std::move(impl)));
}

const HostTarget& Jit::target() const { return impl_->host; }
const std::string& Jit::target_key() const { return impl_->key; }

bool Jit::Impl::run_pipeline(llvm::Module& module, std::string* error) {
  return optimize_module(module, *machine, "jit", error);
}

bool Jit::optimize(llvm::Module& module, std::string* error) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->run_pipeline(module, error);
}

bool Jit::add(std::unique_ptr<llvm::Module> module, std::unique_ptr<llvm::LLVMContext> context, std::string* error) {
  if (!module || !context) return fail(error, "jit: add() needs a module and its context");
  // From here the module and its context travel together (the module must die first).
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const CompileTimer timer;
  ++g_modules;
  // A large module is compiled in parts at once (split_compile.hpp), cached as its parts.
  if (const int parts = compile_parts(*module); parts > 1) {
    const std::optional<std::string> key =
        impl_->cache ? disk_cache::key_of(*module, impl_->key) : std::optional<std::string>();
    auto part_key = [&](int p) { return disk_cache::part_key(*key, p, parts); };
    std::vector<std::unique_ptr<llvm::MemoryBuffer>> objects;
    if (key) {
      for (int p = 0; p < parts; ++p)
        if (auto object = disk_cache::load(impl_->cache->settings(), part_key(p))) objects.push_back(std::move(object));
      if (static_cast<int>(objects.size()) == parts)
        ++g_loaded;
      else
        objects.clear();
    }
    if (objects.empty()) {
      // The tag makes the parts' names unique to this module: its key, or else a serial.
      static std::atomic<std::int64_t> serial{0};
      const std::string tag = key ? key->substr(0, 16) : "s" + std::to_string(serial++);
      objects = compile_split(
          std::move(module), parts, tag, "qkv-" + tag,
          [&](std::string* why) -> std::unique_ptr<llvm::TargetMachine> {
            auto machine = host_machine_builder(impl_->host).createTargetMachine();
            if (!machine) {
              *why = "jit: cannot create a target machine: " + consume(machine.takeError());
              return nullptr;
            }
            return std::move(*machine);
          },
          error);
      if (objects.empty()) return false;
      if (key)
        for (int p = 0; p < parts; ++p)
          disk_cache::store(impl_->cache->settings(), part_key(p), objects[static_cast<std::size_t>(p)]->getBuffer());
    }
    module.reset();  // (loaded from the cache: the objects stand for it) the module first, then its context
    context.reset();
    for (auto& object : objects)
      if (auto e = impl_->jit->addObjectFile(std::move(object)))
        return fail(error, "jit: cannot add a compiled part: " + consume(std::move(e)));
    return true;
  }
  if (impl_->cache) {
    if (const auto key = disk_cache::key_of(*module, impl_->key)) {
      if (auto object = disk_cache::load(impl_->cache->settings(), *key)) {
        module.reset();  // the object stands for it: the module first, then the context it lives in
        context.reset();
        if (auto e = impl_->jit->addObjectFile(std::move(object)))
          return fail(error, "jit: cannot add a cached object: " + consume(std::move(e)));
        ++g_loaded;
        return true;
      }
      module->setModuleIdentifier(disk_cache::module_name(*key));  // DiskObjectCache stores its object
    }
  }
  llvm::orc::ThreadSafeModule tsm(std::move(module), std::move(context));
  const bool ok = tsm.withModuleDo([&](llvm::Module& m) { return impl_->run_pipeline(m, error); });
  if (!ok) return false;
  if (auto e = impl_->jit->addIRModule(std::move(tsm)))
    return fail(error, "jit: cannot add module: " + consume(std::move(e)));
  return true;
}

void* Jit::lookup_address(std::string_view name, std::string* error) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const CompileTimer timer;  // the first lookup of a module's symbol generates its machine code
  auto address = impl_->jit->lookup(llvm::StringRef(name.data(), name.size()));
  if (!address) {
    fail(error, "jit: no symbol '" + std::string(name) + "': " + consume(address.takeError()));
    return nullptr;
  }
  if (!impl_->refused.empty()) {  // compiled for inspection; this CPU cannot run it
    fail(error, impl_->refused);
    return nullptr;
  }
  return address->toPtr<void*>();
}

std::vector<std::string> Jit::objects() const {
  std::lock_guard lock(impl_->objects_mutex);
  return impl_->objects;
}

}  // namespace qkv::codegen
