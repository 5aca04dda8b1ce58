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

std::vector<ModTensorIn> load_mod_tensors(llvm::IRBuilder<>& b, llvm::Value* args,
                                          const std::vector<ModTensor>& tensors, llvm::Value* batch,
                                          llvm::Value* len_q, llvm::Value* len_k) {
  llvm::Type* ptr = b.getPtrTy();
  llvm::Type* i64 = b.getInt64Ty();
  llvm::Value* captured_base = nullptr;
  llvm::Value* extents = nullptr;
  std::uint64_t captured = 0, ext_at = 0;
  std::vector<ModTensorIn> out;
  for (const ModTensor& t : tensors) {
    ModTensorIn in;
    switch (t.source) {
      case ModTensor::Source::key_keep:
        in.base = load_args_field(b, args, offsetof(AttentionArgs, key_keep), ptr, "key_keep");
        in.extent = {batch, len_k};
        break;
      case ModTensor::Source::bias:
        in.base = load_args_field(b, args, offsetof(AttentionArgs, bias), ptr, "bias");
        in.extent = {len_q, len_k};
        break;
      case ModTensor::Source::captured:
        if (!captured_base) {
          captured_base = load_args_field(b, args, offsetof(AttentionArgs, tensors), ptr, "tensors");
          extents = load_args_field(b, args, offsetof(AttentionArgs, extents), ptr, "extents");
        }
        in.base = b.CreateLoad(ptr, b.CreateConstInBoundsGEP1_64(ptr, captured_base, captured++), "tensor");
        for (int d = 0; d < t.rank; ++d)
          in.extent.push_back(b.CreateLoad(i64, b.CreateConstInBoundsGEP1_64(i64, extents, ext_at++)));
        break;
    }
    in.stride.assign(in.extent.size(), b.getInt64(1));
    for (std::size_t d = in.extent.size(); d-- > 1;) in.stride[d - 1] = b.CreateMul(in.stride[d], in.extent[d]);
    for (llvm::Value* e : in.extent) in.extent_f32.push_back(b.CreateSIToFP(e, b.getFloatTy()));
    out.push_back(std::move(in));
  }
  return out;
}

llvm::Value* load_mod_element(llvm::IRBuilder<>& b, const ModTensorIn& t, DType dtype,
                              const std::vector<llvm::Value*>& index, int lanes) {
  auto splat = [&](llvm::Value* x) { return b.CreateVectorSplat(static_cast<unsigned>(lanes), x); };
  llvm::Value* off = b.getInt64(0);
  bool vector = false;
  for (std::size_t d = 0; d < index.size(); ++d) {
    llvm::Value* i = index[d];
    llvm::Value* s = t.stride[d];
    if (i->getType()->isVectorTy()) {
      vector = true;
      s = splat(s);
      if (!off->getType()->isVectorTy()) off = splat(off);
    } else if (off->getType()->isVectorTy()) {
      i = splat(i);
      s = splat(s);
    }
    off = b.CreateAdd(off, b.CreateMul(i, s));
  }
  llvm::Type* et = mod_element_type(b, dtype);
  llvm::Value* x = nullptr;
  if (vector) {
    llvm::Type* vt = llvm::FixedVectorType::get(et, static_cast<unsigned>(lanes));
    llvm::Value* ptrs = b.CreateGEP(et, t.base, off);
    x = b.CreateMaskedGather(vt, ptrs, llvm::Align(static_cast<unsigned>(dtype_size(dtype))));
  } else {
    x = b.CreateLoad(et, b.CreateGEP(et, t.base, off));
  }
  return mod_element_to_f32(b, x, dtype);
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

llvm::Value* mod_axis_length(llvm::IRBuilder<>& b, const ModAxes& axes, const std::string& axis, llvm::Value* len_qf,
                             llvm::Value* len_kf, llvm::Value* nbatch) {
  if (axis == axes.query) return len_qf;
  if (axis == axes.key) return len_kf;
  if (axis == axes.batch) return b.CreateSIToFP(nbatch, b.getFloatTy());
  for (const auto& h : axes.heads)
    if (h.name == axis) return llvm::ConstantFP::get(b.getFloatTy(), static_cast<double>(h.extent));
  internal_error("attention kernel: a mod names the axis `" + axis + "`, which the scores do not have");
}

llvm::Value* mod_head_coordinate(llvm::IRBuilder<>& b, const ModAxes& axes, const std::string& axis,
                                 llvm::Value* head) {
  for (const auto& h : axes.heads) {
    if (h.name != axis) continue;
    llvm::Value* c = b.CreateURem(b.CreateUDiv(head, ir::i64c(b, h.stride)), ir::i64c(b, h.extent));
    return b.CreateSIToFP(c, b.getFloatTy());
  }
  return nullptr;
}

}  // namespace qkv::codegen::cpu
