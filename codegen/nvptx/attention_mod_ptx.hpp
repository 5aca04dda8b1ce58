// codegen/nvptx/attention_mod_ptx.hpp — the mod expression (effective_mod: the flags causal / key
// padding / bias and spec.mod as one expression) of the NVPTX attention kernels, per thread over
// an R × KJ block of scores (R thread rows, KJ tile keys; s[i·KJ + j]) in log2 units. Shared by
// the fp32 FMA kernel (attention_ptx.cpp) and the bf16 tensor-core kernel (attention_mma_ptx.cpp),
// which differ only in which rows and keys a thread holds; and the .entry both declare. Private.
//
// The mod's nodes are computed per thread as scalars, each at the outermost level it can be (as
// in the CPU kernel, attention_mod.cpp): nodes of neither the query nor the key once in the
// prologue, of the query only once per thread row in the prologue, of the key only once per
// tile key, the rest per entry. Loads are scalar global loads (indices clamped into range) from
// the tensor table: captured tensor k at tensors[k], its extents at extents[...] in order; the
// flags' key_keep [B, S] and bias [L, S] from their own parameters. e^x is ex2(x·log2 e), ln x
// is lg2(x)·ln 2 (the .approx.ftz instructions).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <qkv/ir/attention_graph.hpp>

#include "llvm/mod_ir.hpp"
#include "nvptx/geometry.hpp"
#include "nvptx/kernel_builder.hpp"

namespace qkv::codegen::nvptx::detail {

/// What the mod needs from the kernel (i64 unless said otherwise), all defined in the prologue.
/// The .entry both attention kernels declare (their ABI, attention_params: AttentionArgs' order)
///   q, k, v, out, weights, key_keep, bias, tensors, extents, batch, len_q, len_k, seed, lse
/// for `threads` threads: the pointers noalias and nocapture, out / weights / lse write-only, the
/// rest read-only (a kernel that has no weights or dropout ignores those parameters).
llvm::Function* declare_attention_entry(KernelBuilder& kb, const std::string& name, int threads);

/// What both report: grid (ceil(len_q / block_q), Hq, batch), g.threads a block, g's dynamic
/// shared memory.
KernelInfo attention_entry_info(const std::string& name, const AttentionGeometry& g, std::int64_t hq);

struct AttentionModFrame {
  llvm::Value *key_keep = nullptr, *bias = nullptr, *tensors = nullptr, *extents = nullptr;  // parameters
  llvm::Value *nbatch = nullptr, *len_q = nullptr, *len_k = nullptr;                         // sizes
  llvm::Value *batch = nullptr, *head = nullptr;                                             // this block's
  llvm::Value *q0 = nullptr, *nvalid = nullptr;  // the block's first query row and its rows < L
  int block_k = 64;                              // keys per tile
  int keys_per_thread = 8;                       // KJ
  std::vector<llvm::Value*> row_f32;             // per thread row i < R: its absolute row, as f32
};

class AttentionModIr {
 public:
  /// Emits the block- and row-level nodes at the builder's position (the prologue). With
  /// `derivative` (the backward kernels) the expression carries f'(s) too (mod_with_derivatives),
  /// and with `grad_tensors` (the dkdv kernels: spec.tensor_grads) ∂f/∂load of every load of
  /// those tensors.
  AttentionModIr(KernelBuilder& kb, const cpu::AttentionSpec& spec, AttentionModFrame frame, bool derivative = false,
                 bool grad_tensors = false);
  ~AttentionModIr();

  /// A load of a tensor that needs its gradient (grad_tensors).
  struct GradLoad {
    std::size_t grad = 0;  // its spec.tensor_grads entry
    bool uniform = false;  // its coordinates vary with neither the query nor the key
  };
  [[nodiscard]] const std::vector<GradLoad>& grad_loads() const { return grad_loads_; }
  /// ∂f/∂(load k) at the raw scores s (R × KJ, log2 units, before apply) and the tile keys.
  std::vector<llvm::Value*> load_derivative(std::size_t k, const std::vector<llvm::Value*>& s,
                                            const std::vector<llvm::Value*>& key);
  /// The row-major offset (i64) of the element load k reads at each entry (R × KJ; a uniform
  /// load: one, entry 0's), clamped into range as the load clamps it.
  std::vector<llvm::Value*> load_offsets(std::size_t k, const std::vector<llvm::Value*>& key);

  /// Whether the expression has a keep predicate.
  [[nodiscard]] bool has_keep() const;
  /// (always kept, never kept) over the tile at k0: block-uniform i1s.
  std::pair<llvm::Value*, llvm::Value*> classify_tile(llvm::Value* k0);
  /// The score modification on s (R × KJ, log2 units) at the tile keys `key` (i64 per j), then
  /// — where `masked` (a block-uniform i1) — the keep predicate where `partial` and keys past S
  /// (→ −inf).
  std::vector<llvm::Value*> apply(std::vector<llvm::Value*> s, const std::vector<llvm::Value*>& key,
                                  llvm::Value* masked, llvm::Value* partial);
  /// Whether the expression modifies the score (else f'(s) = 1).
  [[nodiscard]] bool has_score() const;
  /// f'(s) = d score' / d score at the raw scores s (R × KJ, log2 units, before apply) and the tile
  /// keys `key`; needs `derivative`. Entries of masked or past-S keys are finite and unused.
  std::vector<llvm::Value*> derivative(const std::vector<llvm::Value*>& s, const std::vector<llvm::Value*>& key);

 private:
  class Leaves;
  class BoundsLeaves;
  using Values = std::vector<llvm::Value*>;

  llvm::Value* axis_value(const std::string& axis, int i, llvm::Value* key, bool position);
  llvm::Value* axis_length(const std::string& axis);
  llvm::Value* load_element(const ModNode& n, const Values& index);
  Values key_values(llvm::Value* key, int root, const Values* seed);
  llvm::Value* mod_value(int root, int i, llvm::Value* key, llvm::Value* score, const Values& keyc);
  /// Node `root` at every entry (R × KJ) of the raw scores s and the tile keys (clamped to S − 1).
  Values entry_values(int root, const Values& s, const Values& key);
  [[nodiscard]] std::size_t si(int i, int j) const { return static_cast<std::size_t>(i * KJ_ + j); }

  KernelBuilder& kb_;
  llvm::IRBuilder<>& b_;
  AttentionModFrame f_;
  int R_, KJ_;
  cpu::EffectiveMod mod_;                  // with `derivative`: its expression followed by f'
  int dscore_ = -1;                        // f''s node
  std::vector<ModLoadDerivative> dloads_;  // grad_tensors: ∂f/∂load per load of those tensors
  std::vector<GradLoad> grad_loads_;       // the same loads
  ModAnalysis info_;
  std::vector<ModTensorIn> tensors_m_;
  llvm::Value *len_qf_ = nullptr, *len_kf_ = nullptr, *batchf_ = nullptr;
  Values task_cache_;              // nodes of neither query nor key
  std::vector<Values> row_cache_;  // per thread row: + the query's nodes
};

}  // namespace qkv::codegen::nvptx::detail
