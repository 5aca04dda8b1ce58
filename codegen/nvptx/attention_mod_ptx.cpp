// The mod expression of the NVPTX attention kernels (attention_mod_ptx.hpp).
#include "nvptx/attention_mod_ptx.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <llvm/IR/BasicBlock.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/Instructions.h>

#include <qkv/ir/error.hpp>

#include "llvm/vector_math.hpp"

namespace qkv::codegen::nvptx::detail {

llvm::Function* declare_attention_entry(KernelBuilder& kb, const std::string& name, int threads) {
  llvm::Type *p = kb.ptr(), *i64 = kb.i64();
  llvm::Function* fn = kb.declare_kernel(name, {p, p, p, p, p, p, p, p, p, i64, i64, i64, i64, p},
                                         {"q", "k", "v", "out", "weights", "key_keep", "bias", "tensors", "extents",
                                          "batch", "len_q", "len_k", "seed", "lse"},
                                         threads, /*min_blocks=*/1);
  for (unsigned a : {0u, 1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 13u}) {
    fn->addParamAttr(a, llvm::Attribute::NoAlias);
    fn->addParamAttr(a, llvm::Attribute::NoCapture);
    fn->addParamAttr(a, a == 3 || a == 4 || a == 13 ? llvm::Attribute::WriteOnly : llvm::Attribute::ReadOnly);
  }
  return fn;
}

KernelInfo attention_entry_info(const std::string& name, const AttentionGeometry& g, std::int64_t hq) {
  KernelInfo info;
  info.name = name;
  info.signature = attention_params();
  info.grid_rule = "(ceil(len_q / " + std::to_string(g.block_q) + "), " + std::to_string(hq) + ", batch)";
  info.block_x = g.threads;
  info.shared_bytes = g.shared_bytes();
  return info;
}

namespace {
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
using Values = std::vector<llvm::Value*>;
}  // namespace

/// Entry values of the leaves for thread row i (−1: none) and key `key` (null: none).
class AttentionModIr::Leaves final : public Log2ScoreLeaves {
 public:
  Leaves(AttentionModIr& k, int i, llvm::Value* key, llvm::Value* score_log2)
      : Log2ScoreLeaves(k.b_, score_log2, "nvptx attention"), k_(k), i_(i), key_(key) {}
  llvm::Value* exp2(llvm::Value* x) override { return k_.kb_.ex2(x); }
  llvm::Value* index(const std::string& axis) override { return k_.axis_value(axis, i_, key_, false); }
  llvm::Value* position(const std::string& axis) override { return k_.axis_value(axis, i_, key_, true); }
  llvm::Value* length(const std::string& axis) override { return k_.axis_length(axis); }
  llvm::Value* load(const ModNode& n, const std::vector<llvm::Value*>& at) override { return k_.load_element(n, at); }
  llvm::Value* extent(const ModNode& n, std::size_t d) override {
    return k_.tensors_m_.at(static_cast<std::size_t>(n.input)).extent_f32.at(d);
  }
  llvm::Value* exp(llvm::Value* x) override { return k_.kb_.ex2(k_.b_.CreateFMul(x, k_.kb_.cf(kLog2e))); }
  llvm::Value* log(llvm::Value* x) override { return k_.b_.CreateFMul(k_.kb_.lg2(x), k_.kb_.cf(kLn2)); }

 private:
  AttentionModIr& k_;
  int i_;
  llvm::Value* key_;
};

/// Bounds of the leaves over one tile: the block's rows [q0, q0 + nvalid) × keys [k0, k0 +
/// block_k) ∩ [0, S). Block-uniform: every thread computes the same.
class AttentionModIr::BoundsLeaves final : public ModBoundsLeaves {
 public:
  BoundsLeaves(AttentionModIr& k, llvm::Value* k0) : k_(k), k0_(k0) {}
  IrInterval index(const std::string& axis) override { return range(axis, false); }
  IrInterval position(const std::string& axis) override { return range(axis, true); }
  llvm::Value* length(const std::string& axis) override { return k_.axis_length(axis); }
  IrInterval load(const ModNode& n, const std::vector<IrInterval>& at) override {
    // Every thread scans the same addresses: broadcast loads.
    return emit_load_bounds(
        k_.b_, k_.mod_.expr, k_.info_.deps, n, at, k_.tensors_m_.at(static_cast<std::size_t>(n.input)).extent_f32,
        [&](const std::vector<llvm::Value*>& idx) { return k_.load_element(n, idx); },
        [&](llvm::Value* begin, llvm::Value* end, std::vector<llvm::Value*> init, const ModLoopBody& body) {
          return k_.kb_.loop(begin, end, 1, std::move(init), body, "mod_scan", /*unroll=*/false);
        });
  }

 private:
  IrInterval range(const std::string& axis, bool position) {
    auto& b = k_.b_;
    const TileSpan t{k_.f_.q0,   b.CreateAdd(k_.f_.q0, k_.f_.nvalid),
                     k0_,        k_.kb_.smin(b.CreateAdd(k0_, k_.kb_.c64(k_.f_.block_k)), k_.f_.len_k),
                     k_.len_qf_, k_.len_kf_};
    if (auto r = tile_axis_range(b, k_.mod_.expr, k_.mod_.axes.query, k_.mod_.axes.key, t, axis, position)) return *r;
    llvm::Value* x = k_.axis_value(axis, -1, nullptr, position);
    return {x, x};
  }

  AttentionModIr& k_;
  llvm::Value* k0_;
};

AttentionModIr::AttentionModIr(KernelBuilder& kb, const cpu::AttentionSpec& spec, AttentionModFrame frame,
                               bool derivative, bool grad_tensors)
    : kb_(kb),
      b_(kb.b()),
      f_(std::move(frame)),
      R_(static_cast<int>(f_.row_f32.size())),
      KJ_(f_.keys_per_thread),
      mod_(cpu::effective_mod(spec)) {
  // The effective mod's inputs of spec.tensor_grads (the flags' tensors come first).
  std::vector<int> inputs;
  const auto base = static_cast<int>(mod_.tensors.size() - spec.tensors.size());
  if (grad_tensors)
    for (const auto& t : spec.tensor_grads) inputs.push_back(base + t.tensor);
  if (derivative) {
    ModDerivative d = mod_with_derivatives(mod_.expr, inputs);
    mod_.expr = std::move(d.expr);
    dscore_ = d.dscore;
    dloads_ = std::move(d.loads);
  }
  // Captured tensors in order from the table `tensors`, their extents from `extents`; the flags'
  // masks from their own parameters.
  len_qf_ = b_.CreateSIToFP(f_.len_q, kb_.f32(), "len_qf");
  len_kf_ = b_.CreateSIToFP(f_.len_k, kb_.f32(), "len_kf");
  batchf_ = b_.CreateSIToFP(f_.batch, kb_.f32(), "batchf");
  tensors_m_ =
      mod_tensors(b_, mod_.tensors, f_.key_keep, f_.bias, f_.tensors, f_.extents, f_.nbatch, f_.len_q, f_.len_k);

  const ModExpr& e = mod_.expr;
  info_ = analyse_mod(e, mod_.axes.query, mod_.axes.key);
  for (const ModLoadDerivative& l : dloads_) {
    const auto input = std::find(inputs.begin(), inputs.end(), e.nodes[static_cast<std::size_t>(l.load)].input);
    grad_loads_.push_back({static_cast<std::size_t>(input - inputs.begin()),
                           (info_.deps[static_cast<std::size_t>(l.load)] & (kDepQuery | kDepKey)) == 0});
  }
  // (attention_geometry has refused a keep predicate that reads the score and 16-bit tensors.)
  // Block-level nodes, then row-level ones per thread row (the prologue dominates every use).
  task_cache_.assign(e.nodes.size(), nullptr);
  Leaves task(*this, -1, nullptr, nullptr);
  for (std::size_t i = 0; i < e.nodes.size(); ++i)
    if (info_.reach[i] && info_.deps[i] == 0) emit_mod(b_, e, static_cast<int>(i), task, task_cache_);
  row_cache_.assign(static_cast<std::size_t>(R_), task_cache_);
  for (int r = 0; r < R_; ++r) {
    Leaves row(*this, r, nullptr, nullptr);
    for (std::size_t i = 0; i < e.nodes.size(); ++i)
      if (info_.reach[i] && info_.deps[i] == kDepQuery) emit_mod(b_, e, static_cast<int>(i), row, row_cache_[r]);
  }
}

AttentionModIr::~AttentionModIr() = default;

bool AttentionModIr::has_keep() const { return mod_.expr.keep >= 0; }
bool AttentionModIr::has_score() const { return mod_.expr.score >= 0; }

Values AttentionModIr::derivative(const Values& s, const Values& key) {
  if (dscore_ < 0) internal_error("nvptx attention: f' of a mod built without its derivative");
  return entry_values(dscore_, s, key);
}

Values AttentionModIr::load_derivative(std::size_t k, const Values& s, const Values& key) {
  return entry_values(dloads_.at(k).d, s, key);
}

Values AttentionModIr::entry_values(int root, const Values& s, const Values& key) {
  llvm::Value* last_key = b_.CreateSub(f_.len_k, kb_.c64(1));
  Values d(static_cast<std::size_t>(R_ * KJ_));
  for (int j = 0; j < KJ_; ++j) {
    llvm::Value* kc = kb_.smin(key[j], last_key);  // read as apply reads them
    const Values keyc = key_values(kc, root, nullptr);
    for (int i = 0; i < R_; ++i) d[si(i, j)] = mod_value(root, i, kc, s.empty() ? nullptr : s[si(i, j)], keyc);
  }
  return d;
}

Values AttentionModIr::load_offsets(std::size_t k, const Values& key) {
  const ModNode& load = mod_.expr.nodes[static_cast<std::size_t>(dloads_.at(k).load)];
  const ModTensorIn& t = tensors_m_.at(static_cast<std::size_t>(load.input));
  const bool uniform = grad_loads_.at(k).uniform;
  llvm::Value* last_key = b_.CreateSub(f_.len_k, kb_.c64(1));
  Values out;
  for (int i = 0; i < (uniform ? 1 : R_); ++i)
    for (int j = 0; j < (uniform ? 1 : KJ_); ++j) {
      llvm::Value* kc = kb_.smin(key[j], last_key);
      Values index;
      for (std::size_t d = 0; d < load.at.size(); ++d) {
        const Values keyc = key_values(kc, load.at[d], nullptr);
        index.push_back(mod_clamp_index(b_, mod_value(load.at[d], i, kc, nullptr, keyc), t.extent_f32.at(d)));
      }
      out.push_back(mod_element_offset(b_, t, index, 1));
    }
  return out;
}

llvm::Value* AttentionModIr::axis_value(const std::string& axis, int i, llvm::Value* key, bool position) {
  const cpu::ModAxes& a = mod_.axes;
  if (axis == a.query) {
    if (i < 0) internal_error("nvptx attention: a query coordinate outside the entry loop");
    llvm::Value* x = f_.row_f32[static_cast<std::size_t>(i)];
    if (position && mod_.expr.shifts(axis)) x = b_.CreateFAdd(x, b_.CreateFSub(len_kf_, len_qf_));
    return x;
  }
  if (axis == a.key) {
    if (!key) internal_error("nvptx attention: a key coordinate outside the key loop");
    return b_.CreateSIToFP(key, kb_.f32());
  }
  if (axis == a.batch) return batchf_;
  if (llvm::Value* c = mod_head_coordinate(b_, a, axis, f_.head)) return c;
  internal_error("nvptx attention: a mod names the axis `" + axis + "`, which the scores do not have");
}

llvm::Value* AttentionModIr::axis_length(const std::string& axis) {
  return mod_axis_length(b_, mod_.axes, axis, len_qf_, len_kf_, f_.nbatch);
}

llvm::Value* AttentionModIr::load_element(const ModNode& n, const Values& index) {
  return load_mod_element(b_, tensors_m_.at(static_cast<std::size_t>(n.input)),
                          mod_.tensors.at(static_cast<std::size_t>(n.input)).dtype, index, 1);
}

Values AttentionModIr::key_values(llvm::Value* key, int root, const Values* seed) {
  Values cache = seed ? *seed : task_cache_;
  if (root < 0) return cache;
  const auto r = mod_reachable(mod_.expr, root);
  Leaves leaves(*this, -1, key, nullptr);
  for (std::size_t i = 0; i < r.size(); ++i)
    if (r[i] && info_.deps[i] == kDepKey) emit_mod(b_, mod_.expr, static_cast<int>(i), leaves, cache);
  return cache;
}

llvm::Value* AttentionModIr::mod_value(int root, int i, llvm::Value* key, llvm::Value* score, const Values& keyc) {
  Values cache = row_cache_[static_cast<std::size_t>(i)];
  for (std::size_t n = 0; n < cache.size() && n < keyc.size(); ++n)
    if (!cache[n]) cache[n] = keyc[n];
  Leaves leaves(*this, i, key, score);
  return emit_mod(b_, mod_.expr, root, leaves, cache);
}

std::pair<llvm::Value*, llvm::Value*> AttentionModIr::classify_tile(llvm::Value* k0) {
  if (mod_.expr.keep < 0) return {b_.getTrue(), b_.getFalse()};
  BoundsLeaves leaves(*this, k0);
  return emit_mod_classify(b_, mod_.expr, leaves);
}

Values AttentionModIr::apply(Values s, const Values& key, llvm::Value* masked, llvm::Value* partial) {
  const ModExpr& e = mod_.expr;
  llvm::Value* last_key = b_.CreateSub(f_.len_k, kb_.c64(1));
  llvm::Value* ninf = kb_.cf(kNegInf);
  // The mod reads keys clamped to S − 1 (their entries are masked below anyway).
  Values kc;
  for (int j = 0; j < KJ_; ++j) kc.push_back(kb_.smin(key[j], last_key));
  std::vector<Values> keyc(static_cast<std::size_t>(KJ_), task_cache_);
  if (e.score >= 0) {
    const int root = info_.score_add >= 0 ? info_.score_add : e.score;
    for (int j = 0; j < KJ_; ++j) {
      keyc[j] = key_values(kc[j], root, &keyc[j]);
      for (int i = 0; i < R_; ++i) {
        llvm::Value*& x = s[si(i, j)];
        if (info_.score_add >= 0) {
          llvm::Value* factor = kb_.cf(info_.score_add_sign * kLog2e);
          if (info_.score_add_factor >= 0)
            factor = b_.CreateFMul(mod_value(info_.score_add_factor, i, kc[j], nullptr, keyc[j]), factor);
          x = kb_.fma(mod_value(root, i, kc[j], nullptr, keyc[j]), factor, x);
        } else {
          // The scores are in log2 units (Q pre-scaled by log2 e): the mod sees nats, except a
          // softcap at the root, computed in log2 units directly.
          Leaves leaves(*this, i, kc[j], x);
          llvm::Value* capped = emit_softcap_log2(b_, e, root, leaves);
          x = capped ? capped : b_.CreateFMul(mod_value(root, i, kc[j], x, keyc[j]), kb_.cf(kLog2e));
        }
      }
    }
  }

  // The keep predicate and the keys past S, only where the tile needs them (a block-uniform branch).
  llvm::BasicBlock* from = b_.GetInsertBlock();
  llvm::BasicBlock* mask = llvm::BasicBlock::Create(kb_.ctx(), "mask", kb_.fn());
  llvm::BasicBlock* join = llvm::BasicBlock::Create(kb_.ctx(), "mask.done", kb_.fn());
  b_.CreateCondBr(masked, mask, join);
  b_.SetInsertPoint(mask);
  Values out = s;
  llvm::Value* full = b_.CreateNot(partial);
  for (int j = 0; j < KJ_; ++j) {
    llvm::Value* inside = b_.CreateICmpSLT(key[j], f_.len_k, "inside");
    if (e.keep >= 0) keyc[j] = key_values(kc[j], e.keep, &keyc[j]);
    for (int i = 0; i < R_; ++i) {
      llvm::Value* visible = inside;
      if (e.keep >= 0) {
        llvm::Value* k = mod_value(e.keep, i, kc[j], nullptr, keyc[j]);
        if (k->getType()->isFloatingPointTy()) k = b_.CreateFCmpUNE(k, kb_.cf(0.0));  // a literal
        visible = b_.CreateAnd(visible, b_.CreateOr(k, full));
      }
      out[si(i, j)] = b_.CreateSelect(visible, s[si(i, j)], ninf);
    }
  }
  llvm::BasicBlock* mask_end = b_.GetInsertBlock();
  b_.CreateBr(join);
  b_.SetInsertPoint(join);
  for (std::size_t k = 0; k < s.size(); ++k) {
    llvm::PHINode* phi = b_.CreatePHI(kb_.f32(), 2, "s");
    phi->addIncoming(s[k], from);
    phi->addIncoming(out[k], mask_end);
    out[k] = phi;
  }
  return out;
}

}  // namespace qkv::codegen::nvptx::detail
