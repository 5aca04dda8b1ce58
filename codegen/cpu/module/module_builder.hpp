// codegen/cpu/module/module_builder.hpp — a lowered graph as ONE LLVM module for the CPU: the code
// generator of every op, for the in-process executor (JIT) and for `qkv emit` (AOT) alike
// (private to codegen; the public faces are qkv/codegen/cpu/compiled_graph.hpp and aot.hpp).
//
// Sizes are `fixed` (static extents and the symbols the code is specialised on: constants in the
// code) or dynamic (every other symbol of the graph: run-time arguments, in the order of
// ModulePlan::dynamic). The module defines
//
//   i32 <f>_entry(const i64* sizes, void* const* args, i32 threads, ptr handle)   sizes[i]: dynamic[i]
//   ptr <f>_prepare_entry(const i64* sizes, void* const* args)   a handle: the params, packed panels
//   void <f>_release_entry(ptr handle)
//   i32 <f>(i64 size…, ptr arg…)         the C entry point (sizes first, then the arrays)
//   i32 <f>_packed([const i64* sizes,] void* const* args)
//   i32 <f>_set_threads(i32 n)
//   ptr <f>_prepare(i64 size…, ptr param…), <f>_prepare_packed([sizes,] params)
//   i32 <f>_run(ptr handle, i64 size…, ptr other arg…), <f>_run_packed(handle, [sizes,] args)
//   void <f>_release(ptr handle)
//
// args are the graph's inputs and parameters in graph order, then its outputs (AotSignature).
// Returns 0; 1 when the scratch arena cannot be allocated; 2 when the sizes are invalid
// (negative, or failing one of the graph's shape checks); 3 for an embedding id outside its table;
// 4 when a handle was prepared for other sizes of the parameters; 5 for a null handle; 6 (the C
// entry points of an AOT build) when this CPU lacks a feature the code was compiled for
// (cpu_check.hpp: <f>_check_cpu says which, <f>_required_features lists them all).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <qkv/codegen/aot.hpp>
#include <qkv/codegen/lowering/attention_call.hpp>

#include <qkv/codegen/target.hpp>
#include <qkv/ir/graph.hpp>
#include "cpu/kernels/attention_backward.hpp"
#include "cpu/kernels/decode_kernel.hpp"
#include "cpu/kernels/gemm_kernel.hpp"

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace qkv::codegen::cpu {

/// What the C entry points return when this CPU lacks a feature the code was compiled for.
inline constexpr int kCpuLacksFeatures = 6;

/// Where every value of the lowered graph lives while the generated function runs. Block sizes
/// are computed by the generated code from the sizes (block_bytes); only the assignment of blocks
/// to arena slots is decided here.
struct ModulePlan {
  enum class Block : std::uint8_t {
    value,
    weights,
    lse,
    gemm_panels,
    gemm_bias,
    split_kv,
    backward_delta,  // a fused backward's D = rowsum(dO ∘ O) [B, Hq, L]
    backward_dq,     // its chunks' dQ partial sums [chunks, B, Hq, L rounded up to Br, dk rounded up]
    backward_dk,     // dK / dV when no companion node reads them
    backward_dv,
    backward_dtensor,  // a tensor gradient's partial sums [slots, the tensor's entries] (node: its attention_dtensor)
  };
  struct Alloc {
    Block kind = Block::value;
    int node = 0;
    int start = 0, end = 0;  // node ids between which it is live (inclusive)
    int slot = 0;
  };
  Bindings fixed;                           // the sizes the code is specialised on
  std::vector<std::string> dynamic;         // the run-time sizes, in argument order
  std::vector<int> alloc;                   // per node: its block, -1 for leaves, views and in-place outputs
  std::vector<int> output_arg;              // per node: the output argument it is computed into, or -1
  std::map<int, AttentionCall> attention;   // fused_attention id -> its call
  std::map<int, int> weights;               // fused_attention id -> block of its weights (-1: an output)
  std::map<int, int> lse;                   // fused_attention id -> block of its log-sum-exp (-1: an output)
  std::map<int, std::pair<int, int>> gemm;  // linear id on the GEMM kernel -> (packed Bᵀ, padded bias)
  /// fused_attention_backward id -> its call (cpu/kernels/attention_backward.hpp), blocking and
  /// blocks: D, the dQ partial sums, and dK / dV where no attention_dk / attention_dv node takes
  /// them (-1: written into that node's buffer).
  struct Backward {
    AttentionCall call;
    BackwardConfig config;
    int delta = -1, partial = -1, dk = -1, dv = -1;
    std::vector<int> tensor_partial;  // per call.spec.tensor_grads entry: its partial sums
  };
  std::map<int, Backward> backward;
  /// fused_attention id -> its split-KV decode path (cpu/kernels/decode_kernel.hpp), for the
  /// calls with L <= max_queries: the blocking and the block of its chunks' partial results.
  struct Decode {
    DecodeConfig config;
    std::int64_t max_queries = 0;
    int block = -1;
  };
  std::map<int, Decode> decode;
  /// K and V read in place out of KV caches (cache_append's prefixes): the slices not copied, and
  /// per fused_attention id the rows each K/V head has as stored (the caches' capacity).
  std::set<int> kv_alias;
  std::map<int, Extent> kv_rows;
  /// The linears on the GEMM kernel whose weights (and bias) are parameters: a prepared handle
  /// (<f>_prepare) holds their panels packed once.
  std::vector<int> prepared;
  std::vector<Alloc> allocs;
  int slots = 0;
  std::map<int, GemmConfig> gemm_config;  // linear id on the GEMM kernel -> its configuration
};

/// Plans `lowered` for code specialised on `fixed` (a symbol of the graph that `fixed` does not
/// bind is dynamic). Throws ShapeError when a size a kernel is specialised on is not fixed.
ModulePlan plan_module(const Graph& lowered, const Bindings& fixed, const HostTarget& target);

/// The GEMM / GEMV configuration of linear node `id` of `lowered` on `target`: bf16 x and W read
/// as stored (legalize-dtypes left them so, storage.hpp's half_operand), f32 otherwise.
GemmConfig linear_gemm_config(const Graph& lowered, int id, const HostTarget& target);

/// The arguments of the generated function.
AotSignature module_signature(const Graph& lowered, const AotOptions& options, const ModulePlan& plan);

/// The bytes of block `a` with extents evaluated by `dim` (an int64 estimate when planning, IR in
/// the generated code). I is std::int64_t or ir::Int.
template <class I, class Dim>
I block_bytes(const Graph& g, const ModulePlan& plan, const ModulePlan::Alloc& a, const Dim& dim);

/// The module (see the top of this file), compiled for `target`. `aot`: only the C entry points
/// are visible outside the module (<f>_entry is internal).
std::unique_ptr<llvm::Module> build_graph_module(llvm::LLVMContext& context, const Graph& lowered,
                                                 const AotSignature& signature, const ModulePlan& plan,
                                                 const HostTarget& target, const std::string& function, bool aot);

}  // namespace qkv::codegen::cpu

#include "cpu/module/module_plan_bytes.hpp"
