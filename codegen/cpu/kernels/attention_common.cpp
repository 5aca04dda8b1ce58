// What the CPU attention kernels share (attention_common.hpp).
#include "cpu/kernels/attention_common.hpp"

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsX86.h>

#include <qkv/ir/error.hpp>

#include "llvm/ir_util.hpp"

namespace qkv::codegen::cpu {

llvm::Function* declare_attention_function(llvm::Module& module, llvm::IRBuilder<>& b, const KernelConfig& config,
                                           const std::string& name, const std::vector<llvm::Type*>& params) {
  return ir::declare_kernel(module, b, name, params, config.cpu, config.features, config.lanes, /*args_param=*/true);
}

llvm::Value* flush_denormals(llvm::IRBuilder<>& b, const KernelConfig& config) {
  if (!config.flush_denormals) return nullptr;
  // MXCSR |= FTZ for this call; the caller's MXCSR comes back before the return.
  llvm::Value* saved = ir::entry_alloca(b, b.getInt32Ty(), 1, 4, "mxcsr.saved");
  llvm::Value* ftz = ir::entry_alloca(b, b.getInt32Ty(), 1, 4, "mxcsr.ftz");
  b.CreateIntrinsic(llvm::Intrinsic::x86_sse_stmxcsr, {}, {saved});
  b.CreateStore(b.CreateOr(b.CreateLoad(b.getInt32Ty(), saved), b.getInt32(0x8000)), ftz);
  b.CreateIntrinsic(llvm::Intrinsic::x86_sse_ldmxcsr, {}, {ftz});
  return saved;
}

void restore_denormals(llvm::IRBuilder<>& b, llvm::Value* saved) {
  if (saved) b.CreateIntrinsic(llvm::Intrinsic::x86_sse_ldmxcsr, {}, {saved});
}

llvm::Value* load_args_field(llvm::IRBuilder<>& b, llvm::Value* args, std::size_t offset, llvm::Type* type,
                             const llvm::Twine& name) {
  return b.CreateLoad(type, b.CreateConstInBoundsGEP1_64(b.getInt8Ty(), args, offset), name);
}

llvm::Value* head_rows(llvm::IRBuilder<>& b, llvm::Value* args, llvm::Value* len_k) {
  llvm::Value* rows = load_args_field(b, args, offsetof(AttentionArgs, kv_rows), b.getInt64Ty(), "kv_rows");
  return b.CreateSelect(b.CreateICmpEQ(rows, b.getInt64(0)), len_k, rows, "head_rows");
}

std::vector<ModTensorIn> load_mod_tensors(llvm::IRBuilder<>& b, llvm::Value* args,
                                          const std::vector<ModTensor>& tensors, llvm::Value* batch, llvm::Value* len_q,
                                          llvm::Value* len_k) {
  llvm::Type* ptr = b.getPtrTy();
  llvm::Value *keep = nullptr, *bias = nullptr, *table = nullptr, *extents = nullptr;
  for (const ModTensor& t : tensors) {
    if (t.source == ModTensor::Source::key_keep && !keep)
      keep = load_args_field(b, args, offsetof(AttentionArgs, key_keep), ptr, "key_keep");
    if (t.source == ModTensor::Source::bias && !bias)
      bias = load_args_field(b, args, offsetof(AttentionArgs, bias), ptr, "bias");
    if (t.source == ModTensor::Source::captured && !table) {
      table = load_args_field(b, args, offsetof(AttentionArgs, tensors), ptr, "tensors");
      extents = load_args_field(b, args, offsetof(AttentionArgs, extents), ptr, "extents");
    }
  }
  return mod_tensors(b, tensors, keep, bias, table, extents, batch, len_q, len_k);
}

IrInterval AttentionBoundsLeaves::range(const std::string& axis, bool position) {
  if (auto r = tile_axis_range(b_, mod_.expr, mod_.axes.query, mod_.axes.key, span_, axis, position)) return *r;
  llvm::Value* x = point_(axis, position);
  return {x, x};
}

IrInterval AttentionBoundsLeaves::load(const ModNode& n, const std::vector<IrInterval>& at) {
  return emit_load_bounds(
      b_, mod_.expr, deps_, n, at, tensors_.at(static_cast<std::size_t>(n.input)).extent_f32,
      [&](const std::vector<llvm::Value*>& idx) { return load_(n, idx); },
      [&](llvm::Value* begin, llvm::Value* end, std::vector<llvm::Value*> init, const ModLoopBody& body) {
        return ir::emit_loop(b_, begin, end, 1, std::move(init), body, "mod.scan");
      });
}

}  // namespace qkv::codegen::cpu
