// codegen/src/cpu/aot_module.hpp — a lowered graph under concrete sizes as one LLVM module with a
// C entry point (private to codegen; the public face is qkv/codegen/aot.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <qkv/codegen/aot.hpp>
#include <qkv/codegen/target.hpp>
#include <qkv/ir/graph.hpp>

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace qkv::codegen::cpu {

/// Where every value of the lowered graph lives while the generated function runs.
struct AotPlan {
  struct Alloc {
    std::size_t bytes = 0, offset = 0;
    int start = 0, end = 0;  // the node ids between which it is live (inclusive)
  };
  std::vector<std::vector<std::int64_t>> shape;  // per node, concrete
  std::vector<int> alloc;                        // per node: its arena block, -1 for leaves and views
  std::map<int, int> weights;                    // fused_attention id -> block of its weights
  std::map<int, int> bias;                       // fused_attention id -> block of its combined bias
  std::map<int, std::pair<int, int>> gemm;       // linear id on the GEMM kernel -> (packed Bᵀ, padded bias)
  std::vector<Alloc> allocs;
  std::size_t arena_bytes = 0;
};

/// Sizes every value and places the arena blocks (first fit, reused once dead). `lowered` is the
/// pass pipeline's output.
AotPlan plan_aot(const Graph& lowered, const Bindings& sizes, const HostTarget& target);

/// The arguments of the generated function (inputs and parameters in graph order, then outputs).
AotSignature aot_signature_of(const Graph& lowered, const Bindings& sizes, const AotOptions& options,
                              const AotPlan& plan);

/// The module: `<function>(args…)`, `<function>_packed(void* const* args)`, every kernel they call
/// (internal), compiled for `target`.
std::unique_ptr<llvm::Module> build_aot_module(llvm::LLVMContext& context, const Graph& lowered, const Bindings& sizes,
                                               const AotSignature& signature, const AotPlan& plan,
                                               const HostTarget& target, const std::string& function);

}  // namespace qkv::codegen::cpu
