// codegen/cpu/kernels/attention_common.hpp — what the CPU attention kernels share (private): the
// fused kernel (lanes over query rows, attention_kernel.hpp) and the split-KV decode kernel
// (lanes over keys, decode_kernel.hpp) declare their functions alike, read AttentionArgs
// alike and load the effective mod's tensors alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include "cpu/kernels/attention_kernel.hpp"
#include "llvm/mod_ir.hpp"

namespace qkv::codegen::cpu {

/// A kernel function `name` returning void with the kernels' attributes (target CPU and
/// features, vectors of `lanes` floats never split, nounwind; parameter 0, the AttentionArgs,
/// noalias read-only); the builder is left at its entry block.
llvm::Function* declare_attention_function(llvm::Module& module, llvm::IRBuilder<>& b, const KernelConfig& config,
                                           const std::string& name, const std::vector<llvm::Type*>& params);

/// x86 with config.flush_denormals: sets MXCSR's flush-to-zero bit and returns the slot holding
/// the caller's MXCSR (restore it with restore_denormals before returning); else nullptr.
llvm::Value* flush_denormals(llvm::IRBuilder<>& b, const KernelConfig& config);
void restore_denormals(llvm::IRBuilder<>& b, llvm::Value* saved);

/// A field of the AttentionArgs at `args` (its byte offset, e.g. offsetof(AttentionArgs, q)).
llvm::Value* load_args_field(llvm::IRBuilder<>& b, llvm::Value* args, std::size_t offset, llvm::Type* type,
                             const llvm::Twine& name);

/// The rows each K/V head has as stored: AttentionArgs::kv_rows, or len_k where it is 0.
llvm::Value* head_rows(llvm::IRBuilder<>& b, llvm::Value* args, llvm::Value* len_k);

/// The mod's tensors (EffectiveMod::tensors, in order) from the args (load_mod_tensors with the
/// AttentionArgs' key_keep, bias, tensors and extents fields).
std::vector<ModTensorIn> load_mod_tensors(llvm::IRBuilder<>& b, llvm::Value* args,
                                          const std::vector<ModTensor>& tensors, llvm::Value* batch, llvm::Value* len_q,
                                          llvm::Value* len_k);

/// Bounds of the mod's leaves over a block of entries: queries [q0, q_end) × keys [k0, k_end)
/// (TileSpan); any other axis takes the single value `point(axis, position)` of the block;
/// lengths come from `length`; loads are bounded by emit_load_bounds, reading through `load`.
class AttentionBoundsLeaves final : public ModBoundsLeaves {
 public:
  using Point = std::function<llvm::Value*(const std::string& axis, bool position)>;
  using Length = std::function<llvm::Value*(const std::string& axis)>;
  using Load = std::function<llvm::Value*(const ModNode& n, const std::vector<llvm::Value*>& index)>;
  AttentionBoundsLeaves(llvm::IRBuilder<>& b, const EffectiveMod& mod, const std::vector<unsigned>& deps,
                        const std::vector<ModTensorIn>& tensors, const TileSpan& span, Point point, Length length,
                        Load load)
      : b_(b),
        mod_(mod),
        deps_(deps),
        tensors_(tensors),
        span_(span),
        point_(std::move(point)),
        length_(std::move(length)),
        load_(std::move(load)) {}
  IrInterval index(const std::string& axis) override { return range(axis, false); }
  IrInterval position(const std::string& axis) override { return range(axis, true); }
  llvm::Value* length(const std::string& axis) override { return length_(axis); }
  IrInterval load(const ModNode& n, const std::vector<IrInterval>& at) override;

 private:
  IrInterval range(const std::string& axis, bool position);

  llvm::IRBuilder<>& b_;
  const EffectiveMod& mod_;
  const std::vector<unsigned>& deps_;
  const std::vector<ModTensorIn>& tensors_;
  TileSpan span_;
  Point point_;
  Length length_;
  Load load_;
};

}  // namespace qkv::codegen::cpu
