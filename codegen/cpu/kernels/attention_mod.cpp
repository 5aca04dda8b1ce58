// The fused attention kernel, part 3: the score / mask modification (effective_mod) inside the
// kernel. Lanes are query rows, so a node's value is a scalar when it depends on no query and a
// <lanes x f32> vector when it does. Each node is computed at the outermost level it can be:
//   task   (batch, head, lengths, constants)        once per task, in the prologue
//   row    (+ the query coordinate)                  once per task and query vector
//   key    (+ the key coordinate, no query)          once per key: a scalar (e.g. key padding)
//   entry  (query and key, or the score)             per key and query vector
// Tiles are classified by the keep predicate's bounds over the tile (emit_mod_classify): never
// kept → skipped, always kept → no per-entry mask, else the mask is evaluated per entry. A load
// whose indices range over the tile along one axis is bounded by scanning that range (document
// ids: a tile inside one document is full, a tile between two is empty).
#include <limits>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Intrinsics.h>

#include "cpu/kernels/attention_emitter.hpp"
#include "llvm/ir_util.hpp"
#include "llvm/vector_math.hpp"

#include <qkv/ir/error.hpp>

namespace qkv::codegen::cpu {

/// Entry values of the leaves for query vector v (−1: none), key `key` (null: none) and the
/// score in log2 units (null: none).
class AttentionEmitter::Leaves final : public Log2ScoreLeaves {
 public:
  Leaves(AttentionEmitter& k, int v, llvm::Value* key, llvm::Value* score_log2)
      : Log2ScoreLeaves(k.b_, score_log2, "attention kernel"), k_(k), v_(v), key_(key) {}
  llvm::Value* index(const std::string& axis) override { return k_.axis_value(axis, v_, key_, false); }
  llvm::Value* position(const std::string& axis) override { return k_.axis_value(axis, v_, key_, true); }
  llvm::Value* length(const std::string& axis) override { return k_.axis_length(axis); }
  llvm::Value* load(const ModNode& n, const std::vector<llvm::Value*>& at) override { return k_.load_element(n, at); }
  llvm::Value* extent(const ModNode& n, std::size_t d) override {
    return k_.tensors_.at(static_cast<std::size_t>(n.input)).extent_f32.at(d);
  }

 private:
  AttentionEmitter& k_;
  int v_;
  llvm::Value* key_;
};

llvm::Value* AttentionEmitter::axis_value(const std::string& axis, int v, llvm::Value* key, bool position) {
  const ModAxes& a = mod_.axes;
  if (axis == a.query) {
    if (v < 0) internal_error("attention kernel: a query coordinate outside the entry loop");
    llvm::Value* x = rows_f32_[static_cast<std::size_t>(v)];
    if (position && mod_.expr.shifts(axis)) x = b_.CreateFAdd(x, splat(b_.CreateFSub(len_kf_, len_qf_)));
    return x;
  }
  if (axis == a.key) {
    if (!key) internal_error("attention kernel: a key coordinate outside the key loop");
    return b_.CreateSIToFP(key, f32_);
  }
  if (axis == a.batch) return batchf_;
  if (llvm::Value* c = mod_head_coordinate(b_, a, axis, head_)) return c;
  internal_error("attention kernel: a mod names the axis `" + axis + "`, which the scores do not have");
}

llvm::Value* AttentionEmitter::axis_length(const std::string& axis) {
  return mod_axis_length(b_, mod_.axes, axis, len_qf_, len_kf_, nbatch_);
}

llvm::Value* AttentionEmitter::load_element(const ModNode& n, const std::vector<llvm::Value*>& index) {
  return load_mod_element(b_, tensors_.at(static_cast<std::size_t>(n.input)),
                          mod_.tensors.at(static_cast<std::size_t>(n.input)).dtype, index, lanes_);
}

void AttentionEmitter::prepare_mod() {
  const ModExpr& e = mod_.expr;
  info_ = analyse_mod(e, mod_.axes.query, mod_.axes.key);
  if (e.keep >= 0 && (info_.deps[static_cast<std::size_t>(e.keep)] & kDepScore))
    throw std::invalid_argument("codegen: a mask modification may not read the score (use a score modification)");
  for (const ModTensor& t : mod_.tensors) (void)mod_element_type(b_, t.dtype);  // refuses what it cannot load
  // Task-level nodes, then row-level ones per query vector (the prologue dominates every use).
  task_cache_.assign(e.nodes.size(), nullptr);
  Leaves task(*this, -1, nullptr, nullptr);
  for (std::size_t i = 0; i < e.nodes.size(); ++i)
    if (info_.reach[i] && info_.deps[i] == 0) emit_mod(b_, e, static_cast<int>(i), task, task_cache_);
  row_cache_.assign(static_cast<std::size_t>(qv_), task_cache_);
  for (int v = 0; v < qv_; ++v) {
    Leaves row(*this, v, nullptr, nullptr);
    for (std::size_t i = 0; i < e.nodes.size(); ++i)
      if (info_.reach[i] && info_.deps[i] == kDepQuery) emit_mod(b_, e, static_cast<int>(i), row, row_cache_[v]);
  }
}

std::vector<llvm::Value*> AttentionEmitter::key_values(llvm::Value* key, int root,
                                                       const std::vector<llvm::Value*>* seed) {
  std::vector<llvm::Value*> cache = seed ? *seed : task_cache_;
  if (root < 0) return cache;
  const auto r = mod_reachable(mod_.expr, root);
  Leaves leaves(*this, -1, key, nullptr);
  for (std::size_t i = 0; i < r.size(); ++i)
    if (r[i] && info_.deps[i] == kDepKey) emit_mod(b_, mod_.expr, static_cast<int>(i), leaves, cache);
  return cache;
}

llvm::Value* AttentionEmitter::mod_value(int root, int v, llvm::Value* key, llvm::Value* score,
                                         std::vector<llvm::Value*>& keyc) {
  std::vector<llvm::Value*> cache = row_cache_[static_cast<std::size_t>(v)];
  for (std::size_t i = 0; i < cache.size() && i < keyc.size(); ++i)
    if (!cache[i]) cache[i] = keyc[i];
  Leaves leaves(*this, v, key, score);
  llvm::Value* x = emit_mod(b_, mod_.expr, root, leaves, cache);
  return x->getType()->isVectorTy() ? x : splat(x);
}

std::pair<llvm::Value*, llvm::Value*> AttentionEmitter::classify_keys(llvm::Value* k_begin, llvm::Value* k_end) {
  if (mod_.expr.keep < 0) return {b_.getTrue(), b_.getFalse()};
  const TileSpan span{q0_, b_.CreateAdd(q0_, nvalid_), k_begin, k_end, len_qf_, len_kf_};
  AttentionBoundsLeaves leaves(
      b_, mod_, info_.deps, tensors_, span,
      [&](const std::string& axis, bool position) { return axis_value(axis, -1, nullptr, position); },
      [&](const std::string& axis) { return axis_length(axis); },
      [&](const ModNode& n, const std::vector<llvm::Value*>& idx) { return load_element(n, idx); });
  return emit_mod_classify(b_, mod_.expr, leaves);
}

std::vector<llvm::Value*> AttentionEmitter::apply_score_mod(const std::vector<llvm::Value*>& s,
                                                            const std::vector<llvm::Value*>& key,
                                                            std::vector<std::vector<llvm::Value*>>& keyc) {
  const ModExpr& e = mod_.expr;
  if (e.score < 0) return s;
  const int root = info_.score_add >= 0 ? info_.score_add : e.score;
  std::vector<llvm::Value*> out = s;
  for (int j = 0; j < qk_keys_; ++j) {
    keyc[j] = key_values(key[j], root, &keyc[j]);
    for (int v = 0; v < qv_; ++v) {
      llvm::Value*& x = out[j * qv_ + v];
      if (info_.score_add >= 0) {
        llvm::Value* add = mod_value(root, v, key[j], nullptr, keyc[j]);
        llvm::Value* factor = vconst(info_.score_add_sign * kLog2e);
        if (info_.score_add_factor >= 0)  // free of the key: hoisted out of the tile loop
          factor = b_.CreateFMul(mod_value(info_.score_add_factor, v, key[j], nullptr, keyc[j]), factor);
        x = fma(add, factor, x);
      } else {
        // The kernel's scores are in log2 units (Q pre-scaled by log2 e): the mod sees nats,
        // except a softcap at the root, computed in log2 units directly.
        Leaves leaves(*this, v, key[j], x);
        llvm::Value* capped = emit_softcap_log2(b_, e, root, leaves);
        x = capped ? capped : b_.CreateFMul(mod_value(root, v, key[j], x, keyc[j]), vconst(kLog2e));
      }
    }
  }
  return out;
}

}  // namespace qkv::codegen::cpu
