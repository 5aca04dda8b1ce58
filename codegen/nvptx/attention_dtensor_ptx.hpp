// codegen/nvptx/attention_dtensor_ptx.hpp — the gradients of the tensors a mod reads
// (spec.tensor_grads) in the NVPTX attention backward, deterministic without atomics. Private.
//
// Each dkdv block (key tile, kv head, batch) owns a slot of every such tensor's partial sums — a
// copy of the tensor, zeroed by the block — and adds its tiles' ∂L/∂score' ∘ ∂f/∂load into it at
// the elements each load reads: a load whose coordinates vary with neither the query nor the key
// (ALiBi's slopes) as the tile's block-wide sum (per thread in its entries' order, then the warps'
// butterflies, then the warps in order, added by thread 0); any other (bias tables, per-key or
// per-query terms) entry by entry, the tile's values and offsets gathered in shared memory and
// added by thread 0 in the tile's row-major order. Then the dtensor kernel
// (AttentionBackwardKernel::Part::dtensor) sums the slots in slot order — (batch, kv head, key
// tile) — into slot 0, which is the gradient. The partial buffers' addresses follow the mod's
// extents in the tensor table: tensors[count], extents[Σ ranks], partials[tensor_grads.size()].
// A slot per block: numel(T) floats for each of ceil(S / block_k) · Hkv · B blocks.
#pragma once

#include <vector>

#include <qkv/codegen/cpu/attention.hpp>

#include "nvptx/geometry.hpp"
#include "nvptx/kernel_builder.hpp"

namespace qkv::codegen::nvptx::detail {

class AttentionModIr;

class TensorGradsPtx {
 public:
  /// In a dkdv kernel's prologue (all threads): this block's slots, zeroed. `block`: the block's
  /// linear index (i64) among the dkdv grid's, in slot order; `scratch`: the geometry's
  /// tensor-gradient region of shared memory (g.grad_offset: entries f32 values, entries i64
  /// offsets, then one f32 per warp). A barrier must follow before the first add.
  TensorGradsPtx(KernelBuilder& kb, const cpu::AttentionSpec& spec, const BackwardGeometry& g, llvm::Value* keep,
                 llvm::Value* bias, llvm::Value* tensors, llvm::Value* extents, llvm::Value* nbatch, llvm::Value* len_q,
                 llvm::Value* len_k, llvm::Value* block, llvm::Value* tid, llvm::Value* scratch);

  /// Adds one score tile's share of every differentiated load of `mod` (all threads, a
  /// block-uniform call). Per thread entry e (the mod's R × KJ order): p[e] its probability,
  /// ds[e] = ∂L/∂score' (before f'), s[e] its raw score, position[e] (i32) its place in the tile
  /// (row-major over block_q × block_k, distinct across the block), key the tile keys.
  void add(AttentionModIr& mod, const std::vector<llvm::Value*>& p, const std::vector<llvm::Value*>& ds,
           const std::vector<llvm::Value*>& s, const std::vector<llvm::Value*>& key,
           const std::vector<llvm::Value*>& position);

 private:
  KernelBuilder& kb_;
  const BackwardGeometry& g_;
  llvm::Value *tid_, *values_, *offsets_, *warp_sums_;
  std::vector<llvm::Value*> slot_;  // per spec.tensor_grads entry: this block's slot (f32*)
};

/// The dtensor kernel: every differentiated tensor's slots summed in slot order into slot 0.
KernelInfo build_attention_dtensor(llvm::Module& module, const AttentionBackwardKernel& request,
                                   const HostEmulation* emulation);

}  // namespace qkv::codegen::nvptx::detail
