// qkv/codegen/jit.hpp — a small wrapper over LLVM's ORC LLJIT for the host CPU.
//
//   std::string error;
//   auto jit = qkv::codegen::Jit::create(&error);            // nullptr + message on failure
//   llvm::LLVMContext& ctx = ...; auto module = ...;           // (inside codegen's .cpp files)
//   if (!jit->add(std::move(module), std::move(ctx), &error)) ...
//   auto* fn = jit->lookup<void(const float*, float*)>("my_kernel", &error);
//
// Modules are compiled for the host — LLVM's name for the host CPU and every feature as the host
// reports it, enabled and disabled (target.hpp) — or for the target set_jit_target chose (`qkv
// run --cpu`), which must be one this CPU runs; with the -O3 pipeline of a PassBuilder that knows the target
// machine (so the cost models see the real vector width), then code generation at
// CodeGenOptLevel::Aggressive. Nothing here exits the process: every failure comes back as
// false / nullptr with a message.
//
// The LLVM types appear only as forward declarations: including this header does not pull in
// LLVM's headers, and only code that builds modules (and includes LLVM itself) can call add().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <qkv/codegen/target.hpp>

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace qkv::codegen {

/// What the JIT compiled in this process: LLVM modules added, and the milliseconds spent on them
/// (the -O3 pipeline and machine code, or loading it from the code cache: code_cache.hpp). `qkv run --stats` and `qkv
/// bench --json` report it.
struct JitStats {
  std::int64_t modules = 0;
  double compile_ms = 0;
  std::int64_t loaded_from_cache = 0;  // of `modules`: machine code loaded from the code cache
};
JitStats jit_stats();

/// The target every JIT is created for unless told otherwise: the host (host_target()), or the
/// one set_jit_target chose.
HostTarget jit_target();

/// Makes the JITs created from now on compile for `target` (`qkv run … --cpu x86-64-v3`: the code
/// a library for that CPU would run, timed here). Throws std::invalid_argument with cpu_error's
/// line when this CPU lacks a feature the target needs, or when it is another architecture.
void set_jit_target(const HostTarget& target);

struct JitOptions {
  /// The target to compile for; jit_target() when empty.
  std::optional<HostTarget> target{};
  /// Compile only, for inspection: keep every object file the JIT links (objects()), and accept
  /// a target this CPU cannot run — lookups then compile the code but hand out no address.
  bool inspect = false;
};

class Jit {
 public:
  /// A JIT for jit_target(), or nullptr with `*error` set (if error is non-null).
  static std::unique_ptr<Jit> create(std::string* error);
  /// A JIT as `options` say. Unless options.inspect, a target whose features this CPU lacks is
  /// refused (nullptr, cpu_error's line): code for it would raise SIGILL.
  static std::unique_ptr<Jit> create(const JitOptions& options, std::string* error);
  ~Jit();
  Jit(const Jit&) = delete;
  Jit& operator=(const Jit&) = delete;

  /// The target modules are compiled for (triple, CPU name, features, vector width).
  [[nodiscard]] const HostTarget& target() const;
  /// "cpu:+feature,+feature,…": the part of a kernel cache key that names the target.
  [[nodiscard]] const std::string& target_key() const;

  /// Sets the module's triple and data layout to the JIT's, runs the -O3 pipeline over it, then
  /// hands it (and its context, which the JIT owns from now on) to LLJIT. Symbols are compiled
  /// on their first lookup. Returns false with `*error` set when the module does not verify or
  /// LLJIT refuses it. Thread-safe.
  bool add(std::unique_ptr<llvm::Module> module, std::unique_ptr<llvm::LLVMContext> context, std::string* error);

  /// Runs the same -O3 pipeline add() runs, without adding the module (for inspection).
  bool optimize(llvm::Module& module, std::string* error);

  /// The address of `name` (compiling its module if needed), or nullptr with `*error` set.
  void* lookup_address(std::string_view name, std::string* error);

  /// With JitOptions::inspect: the object files linked so far, in the order they were made.
  [[nodiscard]] std::vector<std::string> objects() const;

  template <class Fn>
  Fn* lookup(std::string_view name, std::string* error) {
    return reinterpret_cast<Fn*>(lookup_address(name, error));
  }

 private:
  struct Impl;
  explicit Jit(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace qkv::codegen
