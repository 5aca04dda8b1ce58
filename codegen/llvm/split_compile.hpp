// codegen/llvm/split_compile.hpp — a large module compiled in parts at once: its functions shared
// out among the parts (by size), each part optimised and compiled to an object on its own thread
// in its own LLVMContext. A decoder's step graph is one module of hundreds of functions, and the
// -O3 pipeline and instruction selection of one module run on one core: with two parts on two
// cores the time to a first token drops by about that much. Private to codegen (includes LLVM).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace llvm {
class MemoryBuffer;
class Module;
class TargetMachine;
}  // namespace llvm

namespace qkv::codegen {

/// How many parts `module` is compiled in: 1 below kSplitInstructions instructions or on one
/// hardware thread, else up to one per hardware thread (at most 4), each with kSplitInstructions
/// at least.
inline constexpr std::size_t kSplitInstructions = 12000;
int compile_parts(const llvm::Module& module);

/// Compiles the unoptimised `module` in `parts` parts: every symbol of local linkage made hidden
/// and external under its name + "." + `tag` (so that the parts link to each other, and two
/// modules in one JIT never define the same name: `tag` unique per module), the function
/// definitions shared out largest first to the lightest part, the global variables' definitions
/// in part 0; each part then verified, optimised (optimize_module) and compiled to an object
/// with a target machine of its own from `make_machine`. Returns the objects, named `name`.i,
/// or none with `*error` set.
std::vector<std::unique_ptr<llvm::MemoryBuffer>> compile_split(
    std::unique_ptr<llvm::Module> module, int parts, const std::string& tag, const std::string& name,
    const std::function<std::unique_ptr<llvm::TargetMachine>(std::string* error)>& make_machine, std::string* error);

}  // namespace qkv::codegen
