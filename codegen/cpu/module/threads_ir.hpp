// codegen/cpu/module/threads_ir.hpp — the threads of compiled graphs, as IR (private).
//
//   i32 <function>_set_threads(i32 n)   n >= 1: that many threads; 0: one per online CPU
//   void <function>_set_parallel(ptr hook)   i32 hook(ptr body, ptr ctx, i64 n, i32 threads): a
//       thread pool of the caller's that runs body(ctx, i) for i in [0, n) and returns 0, or
//       returns non-zero having run none (busy); null: none
//   threads = requested > 0 ? requested : sysconf(_SC_NPROCESSORS_ONLN), clamped to [1, 256]
//   void qkv_parallel(ptr body, ptr ctx, i64 n, i32 threads)
//
// calls body(ctx, i) for every i in [0, n): through the hook when one is set and more than one
// thread would run them (the JIT sets the process's persistent pool: a decode step has dozens of
// parallel regions, and a thread created per region cost more than the second core gave);
// otherwise task indices are handed out one at a time through an atomic counter to the calling
// thread and min(threads, n, 256) − 1 pthreads created for the call and joined before it returns;
// a thread that cannot be created leaves its share to the others. Needs only pthread_create /
// pthread_join from the C library.
#pragma once

#include <functional>

#include <string>

#include <llvm/IR/IRBuilder.h>

namespace qkv::codegen::cpu {

/// Adds the setting <name>_threads (an i32, 0 at first) and the exported
/// <name>_set_threads(i32) -> i32 (0, or 1 for n < 0) to `module`; returns the setting.
/// `*set_threads` receives the exported function.
llvm::GlobalVariable* emit_thread_setting(llvm::Module& module, const std::string& name,
                                          const std::function<void(llvm::Function*)>& attributes,
                                          llvm::Function** set_threads);

/// Adds the exported <name>_set_parallel(ptr hook) (see above) to `module`.
llvm::Function* emit_parallel_setter(llvm::Module& module, const std::string& name,
                                     const std::function<void(llvm::Function*)>& attributes);

/// At b's insertion point: the thread count of a call that asked for `requested` (an i32; <= 0:
/// one per online CPU), clamped to [1, 256].
llvm::Value* emit_thread_count(llvm::IRBuilder<>& b, llvm::Value* requested);

/// Closure conversion of `task` (a function whose body was generated referring to values of
/// another function, the one b is building): every instruction or argument of another function
/// that it uses becomes a field of a context struct, stored at b's insertion point and loaded at
/// the top of the task, which then uses the loads. Returns the context (null when the task uses
/// none), the task's first argument at run time.
llvm::Value* capture_into(llvm::IRBuilder<>& b, llvm::Function& task);

/// Adds qkv_parallel and its worker (internal linkage) to `module`; `attributes` is applied to
/// both functions (target CPU and features).
llvm::Function* emit_parallel_runtime(llvm::Module& module, const std::function<void(llvm::Function*)>& attributes);

}  // namespace qkv::codegen::cpu
