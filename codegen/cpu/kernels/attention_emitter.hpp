// codegen/cpu/kernels/attention_emitter.hpp — the state of one kernel being emitted, shared by
// attention_kernel.cpp (prologue, tile loops, epilogue) and attention_tile.cpp (the body of one
// K/V tile: scores, softmax step, P·V). Private to codegen.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include "cpu/kernels/attention_common.hpp"
#include "cpu/kernels/attention_kernel.hpp"
#include "llvm/mod_ir.hpp"

namespace qkv::codegen::cpu {

class AttentionEmitter {
 public:
  AttentionEmitter(llvm::Module& module, const AttentionSpec& spec, const KernelConfig& config);
  llvm::Function* emit(const std::string& name);

 private:
  /// What a sweep over the K/V tiles computes.
  enum class Pass {
    online,      // running max/sum, rescaled accumulator: the whole forward pass in one sweep
    stats,       // max and sum only (first sweep when the weights are written)
    normalized,  // final max and 1/sum known: P is exact, written out, accumulated without rescaling
  };

  // --- attention_kernel.cpp: the task around the tiles
  void declare(const std::string& name);
  void load_arguments();
  void compute_geometry();
  void allocate_state();
  void pack_queries();
  void init_state();
  void emit_tiles(Pass pass);
  void finish_stats();
  void zero_weights(llvm::Value* k0, llvm::Value* nk);
  void store_output(Pass pass);
  void store_lse();  // spec.write_lse: ln Σ e^s per row from the final max and sum

  // --- the mod expression (effective_mod): leaves, levels, tile classes
  class Leaves;
  void prepare_mod();
  /// The values of the key-level nodes reachable from `root` for key `key` (i64), seeded with
  /// the task-level ones.
  std::vector<llvm::Value*> key_values(llvm::Value* key, int root, const std::vector<llvm::Value*>* seed);
  llvm::Value* mod_value(int root, int v, llvm::Value* key, llvm::Value* score, std::vector<llvm::Value*>& keyc);
  /// The class of the keys [k_begin, k_end) for the task's rows: (always kept, never kept) as i1.
  std::pair<llvm::Value*, llvm::Value*> classify_keys(llvm::Value* k_begin, llvm::Value* k_end);
  /// How many of the tile's keys its loops visit: tile_, or the shortest prefix (halves down to 16
  /// keys) past which no row of the task keeps a key.
  llvm::Value* tile_span(llvm::Value* k0, llvm::Value* k_end);
  llvm::Value* load_element(const ModNode& n, const std::vector<llvm::Value*>& index_i64);
  llvm::Value* axis_value(const std::string& axis, int v, llvm::Value* key, bool position);
  llvm::Value* axis_length(const std::string& axis);

  // --- attention_tile.cpp: one tile of `key_tile` keys starting at key k0
  void emit_tile(llvm::Value* kt, Pass pass);
  std::vector<llvm::Value*> emit_scores(llvm::Value* k0, llvm::Value* span, llvm::Value* masked, llvm::Value* partial);
  std::vector<llvm::Value*> apply_score_mod(const std::vector<llvm::Value*>& s, const std::vector<llvm::Value*>& key,
                                            std::vector<std::vector<llvm::Value*>>& keyc);
  std::vector<llvm::Value*> apply_tile_masks(const std::vector<llvm::Value*>& s, const std::vector<llvm::Value*>& key,
                                             llvm::Value* masked, llvm::Value* partial,
                                             std::vector<std::vector<llvm::Value*>>& keyc);
  std::vector<llvm::Value*> emit_probabilities(llvm::Value* k0, llvm::Value* span, Pass pass,
                                               const std::vector<llvm::Value*>& m_use,
                                               const std::vector<llvm::Value*>& inv_l);
  void emit_pv(llvm::Value* k0, llvm::Value* nk, const std::vector<llvm::Value*>* alpha);
  void emit_pv_block(llvm::Value* k0, llvm::Value* nk, llvm::Value* dc, int width,
                     const std::vector<llvm::Value*>* alpha);
  void emit_weights_copy(llvm::Value* k0, llvm::Value* nk);
  /// cfg_.dpbf16: P of the tile rounded to bf16 (key, key+1) pairs into spb_ (unless the softmax
  /// step wrote them: `p_packed`), V's rows of the tile repacked as (key, key+1) pairs into vp_ (a
  /// missing second key is zero).
  void pack_pairs(llvm::Value* k0, llvm::Value* nk, bool p_packed);
  /// acc + Σ over the pairs of a·b (vdpbf16ps); a, b: 64-byte vectors of any lane type.
  llvm::Value* dot_pairs(llvm::Value* acc, llvm::Value* a, llvm::Value* b);
  /// `every` where all the task's rows are real rows (all but a sequence's last task), else `some`.
  void if_every_row(const std::function<void()>& every, const std::function<void()>& some);
  /// The alignment of a stored q/k/v/out element (st_).
  llvm::Align st_align() const { return llvm::Align(half_ ? 2 : 4); }
  /// One stored q/k/v element at `index` of `base` as f32 (bf16 storage: converted).
  llvm::Value* load_stored(llvm::Value* base, llvm::Value* index);

  // --- helpers
  llvm::Value* c64(std::int64_t v) { return b_.getInt64(static_cast<std::uint64_t>(v)); }
  llvm::Value* vconst(double v) { return llvm::ConstantFP::get(vf_, v); }
  llvm::Value* splat(llvm::Value* scalar) { return b_.CreateVectorSplat(static_cast<unsigned>(lanes_), scalar); }
  llvm::Value* fma(llvm::Value* a, llvm::Value* x, llvm::Value* c);
  /// 2^x of x <= 0 or NaN (a softmax step): cfg_.scalef_exp2's form or the portable one.
  llvm::Value* exp2(llvm::Value* x);
  llvm::Value* smin(llvm::Value* a, llvm::Value* x, const llvm::Twine& name = "");
  llvm::Value* smax(llvm::Value* a, llvm::Value* x, const llvm::Twine& name = "");
  /// Vector number `index` of a stack buffer of vectors.
  llvm::Value* vec_ptr(llvm::AllocaInst* buffer, llvm::Value* index);
  llvm::Value* load_vec(llvm::AllocaInst* buffer, llvm::Value* index);
  void store_vec(llvm::AllocaInst* buffer, llvm::Value* index, llvm::Value* value);
  /// Row `row` of a stack buffer laid out [rows][R] vectors, and vector v of such a row.
  llvm::Value* vec_row(llvm::AllocaInst* buffer, llvm::Value* row);
  llvm::Value* load_at(llvm::Value* row, int v);
  void store_at(llvm::Value* row, int v, llvm::Value* value);
  /// Float number `index` of a float array in memory.
  llvm::Value* float_ptr(llvm::Value* base, llvm::Value* index);
  llvm::Value* load_float(llvm::Value* base, llvm::Value* index);
  /// Element offsets (v·lanes + lane) · stride of the lanes of query vector v, as <lanes x i32>.
  llvm::Value* lane_offsets(int v, std::int64_t stride);

  llvm::Module& module_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const AttentionSpec& spec_;
  KernelConfig cfg_;
  int lanes_, qv_, tile_, qk_keys_, pv_dims_, rows_;  // rows_ = query rows per task
  std::int64_t dk_, dv_;
  EffectiveMod mod_;  // the one expression of every score / mask modification (effective_mod)

  llvm::Type *f32_, *i8_, *i32_, *i64_, *ptr_;
  llvm::Type* st_;  // how q, k, v and out are stored: f32, or i16 (the bits of bf16)
  bool half_;       // spec.storage is bf16 or f16
  bool brain_;      // ... bf16
  /// O's tile sums are added by Fast2Sum, their rounding errors kept in ct_ (f32 output). A bf16
  /// output is rounded to 8 bits, 2^16 times coarser than what that recovers: a plain add.
  bool compensated_;
  /// The exponentials are used only as P rounded to bf16 (cfg_.dpbf16), its row sum and the
  /// rescale of O and that sum alike (no log-sum-exp, no weights written): 2^x to bf16's
  /// accuracy (emit_exp2_scalef's for_bf16, 7.5e-5 against P's own rounding of up to 2.0e-3).
  bool bf16_exp_;
  llvm::VectorType *vf_, *vi32_, *vi64_;
  llvm::Function* fn_ = nullptr;

  // arguments
  llvm::Value *args_, *batch_, *head_, *q0_;
  llvm::Value *len_q_, *len_k_, *seed_;
  llvm::Value *q_base_, *k_base_, *v_base_, *o_base_, *w_base_ = nullptr, *lse_base_ = nullptr;
  // geometry of the task
  llvm::Value *nvalid_, *ntiles_, *nclean_;
  // the mod expression
  ModAnalysis info_;
  std::vector<ModTensorIn> tensors_;
  llvm::Value *len_qf_ = nullptr, *len_kf_ = nullptr, *batchf_ = nullptr, *nbatch_ = nullptr;
  std::vector<llvm::Value*> task_cache_;
  std::vector<std::vector<llvm::Value*>> row_cache_;
  std::vector<llvm::Value*> lane_rows_;  // per query vector: <lanes x i32> row offsets v·lanes + lane
  std::vector<llvm::Value*> valid_;      // per query vector: <lanes x i1> row < L (the task's rows)
  std::vector<llvm::Value*> w_rows_;     // per query vector: <lanes x i64> row offset · S (weights scatter)
  std::vector<llvm::Value*> abs_rows_;   // per query vector: <lanes x i32> q_begin + row offset (dropout)
  std::vector<llvm::Value*> rows_f32_;   // per query vector: <lanes x f32> q_begin + row offset
  llvm::Value *batch32_ = nullptr, *head32_ = nullptr;
  // stack state of the task
  llvm::AllocaInst *qt_, *ot_, *ct_, *sp_, *m_, *l_, *m_use_, *inv_l_;  // ct_: Oᵀ's compensation
  llvm::AllocaInst *spb_ = nullptr, *vp_ = nullptr;                     // cfg_.dpbf16: P and V of a tile as bf16 pairs
  std::uint64_t vec_bytes_;  // bytes per vector (its alignment in the stack buffers)
};

}  // namespace qkv::codegen::cpu
