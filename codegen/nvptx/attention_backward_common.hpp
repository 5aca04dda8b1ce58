// codegen/nvptx/attention_backward_common.hpp — what the NVPTX attention backward kernels share
// (the fp32 FMA ones, attention_backward_ptx.cpp, and the bf16 tensor-core ones,
// attention_backward_mma_ptx.cpp), which differ only in their products and in which rows and keys
// a thread holds: the .entry and its parameters, a query tile's rows and mod, the per-entry step
// from the scores to P ∘ Z and dS, and the gradients of the tensors a mod reads. Private.
//
// The tensor gradients are deterministic without atomics. Each dkdv block (key tile, kv head,
// batch) owns a slot of every such tensor's partial sums — a copy of the tensor, zeroed by the
// block — and adds its tiles' ∂L/∂score' ∘ ∂f/∂load into it at the elements each load reads: a
// load whose coordinates vary with neither the query nor the key (ALiBi's slopes) as the tile's
// block-wide sum (per thread in its entries' order, then the warps' butterflies, then the warps
// in order, added by thread 0); any other (bias tables, per-key or per-query terms) entry by
// entry, the tile's values and offsets gathered in shared memory and added by thread 0 in the
// tile's row-major order. Then the dtensor kernel (AttentionBackwardKernel::Part::dtensor) sums
// the slots in slot order — (batch, kv head, key tile) — into slot 0, which is the gradient. The
// partial buffers' addresses follow the mod's extents in the tensor table: tensors[count],
// extents[Σ ranks], partials[tensor_grads.size()]. A slot per block: numel(T) floats for each of
// ceil(S / block_k) · Hkv · B blocks.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <qkv/codegen/cpu/attention.hpp>

#include "nvptx/attention_mod_ptx.hpp"
#include "nvptx/geometry.hpp"
#include "nvptx/kernel_builder.hpp"

namespace qkv::codegen::nvptx::detail {

/// The backward kernels' parameters (attention_backward_params' order).
struct BackwardParams {
  llvm::Value *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *d_out = nullptr, *lse = nullptr,
              *delta = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr, *keep = nullptr, *bias = nullptr,
              *tensors = nullptr, *extents = nullptr, *nbatch = nullptr, *len_q = nullptr, *len_k = nullptr,
              *seed = nullptr;
};

/// Declares the .entry `name` for g.threads threads — the pointers noalias and nocapture; delta
/// written by dq, dq / dk / dv write-only, the rest read-only (the tensor table is read: the
/// kernels write through the addresses it holds) — and returns its parameters.
BackwardParams declare_attention_backward(KernelBuilder& kb, const std::string& name, const BackwardGeometry& g);

/// What the backward kernels report: grid (dq: ceil(len_q / block_q), Hq, batch; dkdv:
/// ceil(len_k / block_k), Hkv, batch; dtensor: kDtensorBlocks), g.threads a block, g's dynamic
/// shared memory.
KernelInfo attention_backward_info(const std::string& name, const BackwardGeometry& g, const cpu::AttentionSpec& spec);

/// A query tile of a backward kernel: its rows as the mod sees them (R of them per thread).
struct BackwardQueryTile {
  llvm::Value *q0 = nullptr, *nvalid = nullptr, *bh = nullptr;  // first row, rows < L, batch · Hq + head
  std::vector<llvm::Value*> abs, ok, lse2, delta;               // per row: absolute (i64), < L, lse in log2 units, D
  std::unique_ptr<AttentionModIr> mod;                          // with derivatives (dkdv: and the tensors' loads')
};

/// The query tile at q0 of `head` for rows `local` (i32 within the tile, one per mod row):
/// lse (−inf past L), D from delta when `load_delta` (0 past L; else left empty), the tile's mod
/// over `keys_per_thread` keys.
BackwardQueryTile backward_query_tile(KernelBuilder& kb, const cpu::AttentionSpec& spec, const BackwardGeometry& g,
                                      const BackwardParams& a, llvm::Value* batch, llvm::Value* head, llvm::Value* q0,
                                      const std::vector<llvm::Value*>& local, int keys_per_thread, bool load_delta);

class TensorGradsPtx;

/// A score tile's P ∘ Z (what dV sums) and dS, per entry in the mod's R × KJ order, from the raw
/// scores s (log2 units) and dP = dO·Vᵀ in the same order, at the tile keys `key` (of the tile at
/// k0; `always`: the tile is fully kept):
///   P = 2^(f(s) − lse), 0 where masked, past S, or in a row with no visible key;
///   Z = keep / (1 − p) by the forward's Philox counters (dropout); dS = P ∘ (dP ∘ Z − D) ∘ f'(s).
/// With `grads` (dkdv with tensor gradients) each differentiated load's share goes into the
/// block's slots, the entries at `position()`'s places in the tile (TensorGradsPtx::add).
struct BackwardEntries {
  std::vector<llvm::Value*> pz, ds;
};
BackwardEntries backward_entries(KernelBuilder& kb, const cpu::AttentionSpec& spec, const BackwardGeometry& g,
                                 const BackwardParams& a, BackwardQueryTile& t, std::vector<llvm::Value*> s,
                                 const std::vector<llvm::Value*>& dp, const std::vector<llvm::Value*>& key,
                                 llvm::Value* k0, llvm::Value* always, llvm::Value* batch32, llvm::Value* head32,
                                 TensorGradsPtx* grads, const std::function<std::vector<llvm::Value*>()>& position);

class TensorGradsPtx {
 public:
  /// In a dkdv kernel's prologue (all threads): this block's slots, zeroed — slot (batch, kv head
  /// = ctaid.y, key tile = ctaid.x) in the grid's order. `scratch`: the geometry's
  /// tensor-gradient region of shared memory (g.grad_offset: entries f32 values, entries i64
  /// offsets, then one f32 per warp). A barrier must follow before the first add.
  TensorGradsPtx(KernelBuilder& kb, const cpu::AttentionSpec& spec, const BackwardGeometry& g, const BackwardParams& a,
                 llvm::Value* batch, llvm::Value* tid, llvm::Value* scratch);

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
