// codegen/llvm/optimize.hpp — the one -O3 pipeline every generated module goes through (JIT, AOT,
// NVPTX), for the target machine it will run on. Private to codegen (includes LLVM).
#pragma once

#include <string>

namespace llvm {
class Module;
class TargetMachine;
}  // namespace llvm

namespace qkv::codegen {

/// Sets the module's triple and data layout to the machine's, verifies it, then runs the -O3
/// pipeline of a PassBuilder that knows the machine (so cost models see the real vector width).
/// Returns false with `*error` set when the module does not verify; `who` prefixes the message.
bool optimize_module(llvm::Module& module, llvm::TargetMachine& machine, const std::string& who, std::string* error);

}  // namespace qkv::codegen
