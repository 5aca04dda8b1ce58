// codegen/cpu/module/cpu_check.hpp — the CPU check of an emitted library, as IR (private to codegen).
//
//   const char* <f>_required_features(void)   "avx,avx2,fma,…": what the code was compiled for
//   const char* <f>_check_cpu(void)           NULL when this CPU has every one; otherwise the line
//                                             "code for <cpu> needs …; this CPU lacks …"
//
// The check reads the CPU as the table in llvm/cpu_features.hpp says (cpuid and XCR0 on x86-64,
// getauxval(AT_HWCAP / AT_HWCAP2) on aarch64), once: the answer is cached in the library, and
// concurrent first calls agree (one thread writes the message, the others wait for it). Both
// functions, and every C entry point that calls the check, are compiled for the architecture's
// baseline (baseline_attributes), so nothing runs an instruction the CPU may lack before it.
#pragma once

#include <string>

#include <qkv/codegen/target.hpp>

namespace llvm {
class Function;
class Module;
}  // namespace llvm

namespace qkv::codegen::cpu {

struct CpuCheck {
  llvm::Function* required = nullptr;  // <prefix>_required_features
  llvm::Function* check = nullptr;     // <prefix>_check_cpu
};

/// Defines the two functions above in `module` for code built for `target`.
CpuCheck emit_cpu_check(llvm::Module& module, const HostTarget& target, const std::string& prefix);

/// nounwind, and the target CPU and features every CPU of `target`'s architecture has (x86-64:
/// "x86-64", SSE2; aarch64: "generic", NEON): for code that must run before the CPU check says
/// the rest may.
void baseline_attributes(llvm::Function* f, const HostTarget& target);

}  // namespace qkv::codegen::cpu
