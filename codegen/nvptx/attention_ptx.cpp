// The fused attention forward pass for NVPTX (FlashAttention-2's schedule, fp32 FMA).
//
// One block per (query tile, query head, batch) = (ctaid.x, ctaid.y, ctaid.z). The block stages
// its block_q queries once (pre-multiplied by scale·log2 e, so scores are in log2 units, as in the
// CPU kernel), then sweeps the K/V tiles, each first classified under the keep predicate of the
// mod expression (effective_mod: the flags causal / key padding / bias and spec.mod as one
// expression) over the tile's bounds — block-uniform values only (q0, the valid rows, k0, S,
// batch, head), so every thread takes the same branch and the barriers stay matched:
//
//   never kept         skipped (carried m, l, O pass through; the normalized sweep writes zero
//                      weights for its entries)
//   otherwise          barrier; K (and V) tile → shared memory (keys past S as zeros); barrier
//   S = Q·Kᵀ           per thread an R × KJ micro-tile, fma over d in order    (emit_qk_tile)
//   mod                the score modification on every tile (score + X: X·log2 e added; else
//                      ×ln 2 → mod → ×log2 e); the keep predicate (→ −inf) and keys past S only
//                      on partial tiles and the tile that runs past S               (apply_mod)
//   softmax step       m' = max(m, rowmax S), α = 2^(m − m'), P = 2^(S − m'), l' = α·l + Σ P
//                      (a row with m' = −inf uses 0 in place of m': P = 0, α = 0, never NaN)
//   dropout            P kept by the Philox test of (seed, batch, head, row, key), scaled by
//                      1/(1 − p) — after the sum: the softmax is normalised before dropout
//   P → shared (the warp's own rows); bar.warp.sync
//   O = α·O + P·V      per thread an R × TC·wv micro-tile                       (emit_pv_tile)
//
// and writes out = O / l (0 for rows with l = 0), and with write_lse lse = (m + lg2 l)·ln 2 per
// row (−inf for l = 0). With write_weights it makes two sweeps like the
// CPU kernel: the first computes only the final max and sum per row; the second recomputes S,
// forms exact probabilities 2^(S − m)/l (after dropout), writes them to weights and accumulates
// O without rescaling.
//
// The mod expression is attention_mod_ptx.hpp's, over each thread's R × KJ scores.
//
// The thread mapping and the shared-memory layout are in geometry.hpp. S = Q·Kᵀ and O += P·V are
// separate member functions over shared-memory tiles so that a tensor-core (mma.sync) version can
// replace them without touching the softmax / masking / dropout logic around them.
#include <cmath>
#include <limits>
#include <memory>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Intrinsics.h>

#include <qkv/ir/error.hpp>

#include "llvm/philox_ir.hpp"
#include "llvm/vector_math.hpp"
#include "nvptx/attention_mod_ptx.hpp"
#include "nvptx/geometry.hpp"
#include "nvptx/kernel_builder.hpp"

namespace qkv::codegen::nvptx::detail {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

using Values = std::vector<llvm::Value*>;

class AttentionPtx {
 public:
  AttentionPtx(llvm::Module& module, const AttentionKernel& request, const HostEmulation* emulation)
      : kb_(module, emulation),
        b_(kb_.b()),
        spec_(request.spec),
        g_(attention_geometry(request)),
        R_(g_.rows_per_thread),
        KJ_(g_.keys_per_thread),
        TC_(g_.col_chunks),
        dk_(spec_.dk),
        dv_(spec_.dv) {}

  KernelInfo emit(const std::string& name);

 private:
  enum class Pass { online, stats, normalized };

  void declare(const std::string& name);
  void prologue();
  void stage_queries();
  void zero_value_padding();
  /// One sweep over the tiles; m, l (online, stats) and o (online, normalized) are carried.
  void sweep(Pass pass, Values& m, Values& l, Values& o, const Values& m_final, const Values& inv_l);
  /// One tile that is not skipped: the carried values in (nm = R, or 0 in the normalized sweep),
  /// the next ones out.
  Values visit_tile(Pass pass, llvm::Value* k0, const Values& key, llvm::Value* always, const Values& carried,
                    std::ptrdiff_t nm, bool dropout, const Values& m_final, const Values& inv_l);
  void stage_tile(llvm::Value* k0, Pass pass);
  void stage_rows(llvm::Value* src, llvm::Value* k0, std::int64_t width, std::int64_t offset, std::int64_t stride,
                  const std::string& name);
  Values emit_qk_tile();
  Values emit_pv_tile(Values o);
  void store_output(const Values& o, const Values* inv);
  void store_lse(const Values& m, const Values& l);  // spec.write_lse: the row statistics as ln Σ e^s

  /// The normalized sweep's weights for a skipped tile: zeros.
  void zero_tile_weights(const Values& key);

  // helpers
  llvm::Value* shared(std::int64_t offset) { return b_.CreateConstInBoundsGEP1_64(kb_.f32(), smem_, offset); }
  llvm::Value* at(llvm::Value* base, llvm::Value* index) { return b_.CreateInBoundsGEP(kb_.f32(), base, index); }
  llvm::Value* c32(std::int64_t v) { return kb_.c32(v); }
  llvm::Value* c64(std::int64_t v) { return kb_.c64(v); }
  llvm::Value* zext64(llvm::Value* v) { return b_.CreateZExt(v, kb_.i64()); }
  std::size_t si(int i, int j) const { return static_cast<std::size_t>(i * KJ_ + j); }
  std::size_t oi(int i, int t, int e) const { return static_cast<std::size_t>((i * TC_ + t) * g_.wv + e); }

  KernelBuilder kb_;
  llvm::IRBuilder<>& b_;
  const cpu::AttentionSpec& spec_;
  AttentionGeometry g_;
  int R_, KJ_, TC_;
  std::int64_t dk_, dv_;

  // parameters
  llvm::Value *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *out_ = nullptr, *weights_ = nullptr, *keep_ = nullptr,
              *bias_ = nullptr, *tensors_ = nullptr, *extents_ = nullptr, *nbatch_ = nullptr, *len_q_ = nullptr,
              *len_k_ = nullptr, *seed_ = nullptr, *lse_ = nullptr;
  // block and thread geometry
  llvm::Value *tid_ = nullptr, *kg_ = nullptr, *head32_ = nullptr, *batch32_ = nullptr, *head_ = nullptr,
              *batch_ = nullptr;
  llvm::Value *q0_ = nullptr, *nvalid_ = nullptr, *ntiles_ = nullptr;
  Values local_row_;  // i32, per thread row i
  Values row_abs_;    // i64 absolute query row
  Values row_f32_;    // its f32 coordinate
  Values row_ok_;     // i1 row < L
  // global bases of this (batch, head, query tile)
  llvm::Value *q_blk_ = nullptr, *k_blk_ = nullptr, *v_blk_ = nullptr, *o_blk_ = nullptr, *w_blk_ = nullptr;
  std::unique_ptr<AttentionModIr> mod_;  // the mod expression (effective_mod)
  // shared memory
  llvm::Value* smem_ = nullptr;
  llvm::Value *qs_ = nullptr, *ks_ = nullptr, *vs_ = nullptr, *ps_ = nullptr;
  Values q_rows_, k_rows_, p_rows_;  // per-thread row pointers into Q, K, P
  llvm::Value* v_lane_ = nullptr;    // V + kg·wv: this lane's first value column
};

KernelInfo AttentionPtx::emit(const std::string& name) {
  declare(name);
  prologue();
  stage_queries();
  zero_value_padding();

  const auto f0 = kb_.cf(0.0), ninf = kb_.cf(kNegInf);
  Values m(static_cast<std::size_t>(R_), ninf), l(static_cast<std::size_t>(R_), f0);
  Values o(static_cast<std::size_t>(R_ * TC_ * g_.wv), f0);
  if (!spec_.write_weights) {
    sweep(Pass::online, m, l, o, {}, {});
    Values inv;
    for (int i = 0; i < R_; ++i)
      inv.push_back(b_.CreateSelect(b_.CreateFCmpOGT(l[i], f0), b_.CreateFDiv(kb_.cf(1.0), l[i]), f0, "inv_l"));
    store_output(o, &inv);
    store_lse(m, l);
  } else {
    Values none;
    sweep(Pass::stats, m, l, none, {}, {});
    Values m_final, inv_l;
    for (int i = 0; i < R_; ++i) {
      m_final.push_back(b_.CreateSelect(b_.CreateFCmpOEQ(m[i], ninf), f0, m[i], "m_final"));
      inv_l.push_back(b_.CreateSelect(b_.CreateFCmpOGT(l[i], f0), b_.CreateFDiv(kb_.cf(1.0), l[i]), f0, "inv_l"));
    }
    store_lse(m, l);
    sweep(Pass::normalized, m, l, o, m_final, inv_l);
    store_output(o, nullptr);
  }
  b_.CreateRetVoid();

  return attention_entry_info(name, g_, spec_.hq);
}

void AttentionPtx::declare(const std::string& name) {
  llvm::Function* fn = declare_attention_entry(kb_, name, g_.threads);
  q_ = fn->getArg(0);
  k_ = fn->getArg(1);
  v_ = fn->getArg(2);
  out_ = fn->getArg(3);
  weights_ = fn->getArg(4);
  keep_ = fn->getArg(5);
  bias_ = fn->getArg(6);
  tensors_ = fn->getArg(7);
  extents_ = fn->getArg(8);
  nbatch_ = fn->getArg(9);
  len_q_ = fn->getArg(10);
  len_k_ = fn->getArg(11);
  seed_ = fn->getArg(12);
  lse_ = fn->getArg(13);
  smem_ = kb_.dynamic_shared("qkv_attention_smem");
}

void AttentionPtx::prologue() {
  tid_ = kb_.tid_x();
  llvm::Value* warp = b_.CreateLShr(tid_, c32(5), "warp");
  llvm::Value* lane = b_.CreateAnd(tid_, c32(31), "lane");
  llvm::Value* rg = b_.CreateLShr(lane, c32(3), "rg");
  kg_ = b_.CreateAnd(lane, c32(7), "kg");
  batch32_ = kb_.ctaid_z();
  head32_ = kb_.ctaid_y();
  batch_ = zext64(batch32_);
  head_ = zext64(head32_);
  llvm::Value* batch = batch_;
  llvm::Value* head = head_;
  q0_ = b_.CreateMul(zext64(kb_.ctaid_x()), c64(g_.block_q), "q0");
  nvalid_ = kb_.smin(c64(g_.block_q), b_.CreateSub(len_q_, q0_));
  // Every tile is visited; the mod's keep predicate decides which are skipped (sweep).
  ntiles_ = b_.CreateSDiv(b_.CreateAdd(len_k_, c64(g_.block_k - 1)), c64(g_.block_k), "ntiles");

  for (int i = 0; i < R_; ++i) {
    llvm::Value* r = b_.CreateAdd(b_.CreateMul(warp, c32(4 * R_)), b_.CreateAdd(rg, c32(4 * i)), "row");
    local_row_.push_back(r);
    llvm::Value* abs = b_.CreateAdd(q0_, zext64(r), "row_abs");
    row_abs_.push_back(abs);
    row_f32_.push_back(b_.CreateSIToFP(abs, kb_.f32(), "row_f"));
    row_ok_.push_back(b_.CreateICmpSLT(abs, len_q_, "row_ok"));
  }

  // Query head h reads key/value head h / (hq / hkv).
  llvm::Value* kv_head = b_.CreateUDiv(head, c64(spec_.hq / spec_.hkv), "kv_head");
  llvm::Value* bh = b_.CreateAdd(b_.CreateMul(batch, c64(spec_.hq)), head);
  llvm::Value* row0 = b_.CreateAdd(b_.CreateMul(bh, len_q_), q0_, "row0");  // first row in [B·Hq·L]
  llvm::Value* kv_rows = b_.CreateMul(b_.CreateAdd(b_.CreateMul(batch, c64(spec_.hkv)), kv_head), len_k_);
  q_blk_ = at(q_, b_.CreateMul(row0, c64(dk_)));
  k_blk_ = at(k_, b_.CreateMul(kv_rows, c64(dk_)));
  v_blk_ = at(v_, b_.CreateMul(kv_rows, c64(dv_)));
  o_blk_ = at(out_, b_.CreateMul(row0, c64(dv_)));
  if (spec_.write_weights) w_blk_ = at(weights_, b_.CreateMul(row0, len_k_));

  qs_ = shared(g_.q_offset);
  ks_ = shared(g_.k_offset);
  vs_ = shared(g_.v_offset);
  ps_ = shared(g_.p_offset);
  for (int i = 0; i < R_; ++i) {
    q_rows_.push_back(at(qs_, b_.CreateMul(local_row_[i], c32(g_.qk_stride))));
    p_rows_.push_back(at(ps_, b_.CreateMul(local_row_[i], c32(g_.p_stride))));
  }
  for (int j = 0; j < KJ_; ++j)
    k_rows_.push_back(at(ks_, b_.CreateMul(b_.CreateAdd(kg_, c32(8 * j)), c32(g_.qk_stride))));
  v_lane_ = at(vs_, b_.CreateMul(kg_, c32(g_.wv)));

  AttentionModFrame frame{keep_,  bias_, tensors_, extents_, nbatch_,    len_q_, len_k_,
                          batch_, head_, q0_,      nvalid_,  g_.block_k, KJ_,    row_f32_};
  mod_ = std::make_unique<AttentionModIr>(kb_, spec_, std::move(frame));
}

void AttentionPtx::stage_queries() {
  // Q[r][d] = q[q0 + r][d] · scale · log2 e for r < nvalid, else 0 (the block's rows are
  // contiguous in q).
  kb_.stage_rows(tid_, g_.threads, q_blk_, b_.CreateMul(nvalid_, c64(dk_)), g_.block_q, dk_, g_.qk_stride, qs_,
                 spec_.effective_scale() * kLog2e, "stage_q");
}

void AttentionPtx::zero_value_padding() {
  // V's columns [dv, v_stride) are read by the last column chunk of some lanes: keep them 0 (the
  // tile loads never write them). Visible to all threads after the first tile's barrier.
  const std::int64_t pad = g_.v_stride - dv_;
  if (pad == 0) return;
  kb_.loop(
      tid_, c32(g_.block_k * pad), g_.threads,
      [&](llvm::Value* idx) {
        llvm::Value* r = b_.CreateUDiv(idx, c32(pad));
        llvm::Value* c = b_.CreateAdd(c32(dv_), b_.CreateSub(idx, b_.CreateMul(r, c32(pad))));
        b_.CreateStore(kb_.cf(0.0), at(vs_, b_.CreateAdd(b_.CreateMul(r, c32(g_.v_stride)), c)));
      },
      "zero_vpad");
}

void AttentionPtx::sweep(Pass pass, Values& m, Values& l, Values& o, const Values& m_final, const Values& inv_l) {
  // Carried: m[R], l[R] (not in the normalized sweep), then o[R·TC·wv] (not in the stats sweep).
  const std::ptrdiff_t nm = pass == Pass::normalized ? 0 : R_;
  Values init;
  if (nm) {
    init.insert(init.end(), m.begin(), m.end());
    init.insert(init.end(), l.begin(), l.end());
  }
  init.insert(init.end(), o.begin(), o.end());
  const bool dropout = spec_.dropout_p > 0 && pass != Pass::stats;
  const char* name = pass == Pass::online ? "tiles" : pass == Pass::stats ? "stats" : "exact";

  Values result = kb_.loop(
      c64(0), ntiles_, 1, init,
      [&](llvm::Value* kt, const Values& carried) {
        llvm::Value* k0 = b_.CreateMul(kt, c64(g_.block_k), "k0");
        Values key;
        for (int j = 0; j < KJ_; ++j) key.push_back(b_.CreateAdd(k0, zext64(b_.CreateAdd(kg_, c32(8 * j))), "key"));
        // The tile's class under the keep predicate (block-uniform): never kept → skipped, with
        // the carried values unchanged and, in the normalized sweep, zero weights.
        auto [always, never] = mod_->classify_tile(k0);
        llvm::Function* fn = kb_.fn();
        llvm::BasicBlock* skip = llvm::BasicBlock::Create(kb_.ctx(), std::string(name) + ".skip", fn);
        llvm::BasicBlock* visit = llvm::BasicBlock::Create(kb_.ctx(), std::string(name) + ".visit", fn);
        llvm::BasicBlock* join = llvm::BasicBlock::Create(kb_.ctx(), std::string(name) + ".joined", fn);
        b_.CreateCondBr(never, skip, visit);
        b_.SetInsertPoint(skip);
        if (pass == Pass::normalized) zero_tile_weights(key);
        llvm::BasicBlock* skip_end = b_.GetInsertBlock();
        b_.CreateBr(join);
        b_.SetInsertPoint(visit);
        Values next = visit_tile(pass, k0, key, always, carried, nm, dropout, m_final, inv_l);
        llvm::BasicBlock* visit_end = b_.GetInsertBlock();
        b_.CreateBr(join);
        b_.SetInsertPoint(join);
        Values out;
        for (std::size_t k = 0; k < next.size(); ++k) {
          llvm::PHINode* phi = b_.CreatePHI(next[k]->getType(), 2, "carried");
          phi->addIncoming(carried[k], skip_end);
          phi->addIncoming(next[k], visit_end);
          out.push_back(phi);
        }
        return out;
      },
      name, /*unroll=*/false);

  for (std::ptrdiff_t i = 0; i < nm; ++i) {
    m[static_cast<std::size_t>(i)] = result[static_cast<std::size_t>(i)];
    l[static_cast<std::size_t>(i)] = result[static_cast<std::size_t>(nm + i)];
  }
  for (std::size_t i = 0; i < o.size(); ++i) o[i] = result[static_cast<std::size_t>(2 * nm) + i];
}

Values AttentionPtx::visit_tile(Pass pass, llvm::Value* k0, const Values& key, llvm::Value* always,
                                const Values& carried, std::ptrdiff_t nm, bool dropout, const Values& m_final,
                                const Values& inv_l) {
  Values cm(carried.begin(), carried.begin() + nm);
  Values cl(carried.begin() + nm, carried.begin() + 2 * nm);
  Values co(carried.begin() + 2 * nm, carried.end());
  kb_.barrier();  // every warp is done with the previous tile's K, V (and the queries are staged)
  stage_tile(k0, pass);
  kb_.barrier();

  // The keep predicate only where the tile is partial; keys past S only on the last tile.
  llvm::Value* partial = b_.CreateNot(always, "partial");
  llvm::Value* past_s = b_.CreateICmpSGT(b_.CreateAdd(k0, c64(g_.block_k)), len_k_, "past_s");
  Values s = mod_->apply(emit_qk_tile(), key, b_.CreateOr(partial, past_s, "masked"), partial);

  // Softmax step, row by row (the 8 lanes of a row group hold the row's KJ·8 keys).
  Values p(s.size());
  Values alpha(static_cast<std::size_t>(R_));
  for (int i = 0; i < R_; ++i) {
    llvm::Value* m_use = nullptr;
    if (pass == Pass::normalized) {
      m_use = m_final[i];
    } else {
      llvm::Value* mx = kb_.cf(kNegInf);
      for (int j = 0; j < KJ_; ++j) mx = b_.CreateMaxNum(mx, s[si(i, j)]);
      mx = kb_.group_max(mx, 8);
      llvm::Value* m_new = b_.CreateMaxNum(cm[i], mx, "m_new");
      m_use = b_.CreateSelect(b_.CreateFCmpOEQ(m_new, kb_.cf(kNegInf)), kb_.cf(0.0), m_new, "m_use");
      alpha[i] = kb_.ex2(b_.CreateFSub(cm[i], m_use));
      cm[i] = m_new;
    }
    llvm::Value* sum = kb_.cf(0.0);
    for (int j = 0; j < KJ_; ++j) {
      llvm::Value* x = kb_.ex2(b_.CreateFSub(s[si(i, j)], m_use));
      if (pass != Pass::normalized) sum = b_.CreateFAdd(sum, x);
      if (pass == Pass::normalized) x = b_.CreateFMul(x, inv_l[i]);
      p[si(i, j)] = x;
    }
    if (pass != Pass::normalized) cl[i] = kb_.fma(cl[i], alpha[i], kb_.group_sum(sum, 8));
  }
  if (pass == Pass::stats) {
    Values next = cm;
    next.insert(next.end(), cl.begin(), cl.end());
    return next;
  }

  if (dropout) {
    llvm::Value* keep_scale = kb_.cf(1.0 / (1.0 - spec_.dropout_p));
    for (int i = 0; i < R_; ++i) {
      llvm::Value* row32 = b_.CreateTrunc(row_abs_[i], kb_.i32());
      for (int j = 0; j < KJ_; ++j) {
        llvm::Value* col32 = b_.CreateTrunc(key[j], kb_.i32());
        llvm::Value* keep = cpu::emit_dropout_keep(b_, spec_.dropout_p, seed_, batch32_, head32_, row32, col32);
        p[si(i, j)] = b_.CreateSelect(keep, b_.CreateFMul(p[si(i, j)], keep_scale), kb_.cf(0.0), "p_drop");
      }
    }
  }
  if (pass == Pass::normalized) {
    // weights[row][key] = P for rows < L and keys < S (masked entries are exact zeros).
    for (int i = 0; i < R_; ++i) {
      llvm::Value* wrow = at(w_blk_, b_.CreateMul(zext64(local_row_[i]), len_k_));
      for (int j = 0; j < KJ_; ++j) {
        llvm::Value* ok = b_.CreateAnd(row_ok_[i], b_.CreateICmpSLT(key[j], len_k_));
        kb_.if_then(ok, [&] { b_.CreateStore(p[si(i, j)], at(wrow, key[j])); }, "store_w");
      }
    }
  }
  for (int i = 0; i < R_; ++i)
    for (int j = 0; j < KJ_; ++j) b_.CreateStore(p[si(i, j)], at(p_rows_[i], b_.CreateAdd(kg_, c32(8 * j))));
  kb_.warp_sync();  // P rows are written and read by the same warp

  if (pass == Pass::online) {
    for (int i = 0; i < R_; ++i)
      for (int t = 0; t < TC_; ++t)
        for (int e = 0; e < g_.wv; ++e) co[oi(i, t, e)] = b_.CreateFMul(co[oi(i, t, e)], alpha[i]);
  }
  co = emit_pv_tile(co);
  Values next = cm;
  next.insert(next.end(), cl.begin(), cl.end());
  next.insert(next.end(), co.begin(), co.end());
  return next;
}

void AttentionPtx::stage_rows(llvm::Value* src, llvm::Value* k0, std::int64_t width, std::int64_t offset,
                              std::int64_t stride, const std::string& name) {
  // tile[key][c] = src[(k0 + key)·width + c] for keys before S, else 0.
  kb_.stage_rows(tid_, g_.threads, at(src, b_.CreateMul(k0, c64(width))),
                 b_.CreateMul(b_.CreateSub(len_k_, k0), c64(width)), g_.block_k, width, static_cast<int>(stride),
                 shared(offset), 1.0, name);
}

void AttentionPtx::stage_tile(llvm::Value* k0, Pass pass) {
  stage_rows(k_blk_, k0, dk_, g_.k_offset, g_.qk_stride, "stage_k");
  if (pass != Pass::stats) stage_rows(v_blk_, k0, dv_, g_.v_offset, g_.v_stride, "stage_v");
}

Values AttentionPtx::emit_qk_tile() {
  // s[i][j] = Σ_d Q[row_i][d] · K[key_j][d], one fma per d in increasing d (the CPU kernel's order).
  return kb_.dot_tile(q_rows_, k_rows_, dk_, g_.wk);
}

Values AttentionPtx::emit_pv_tile(Values o) {
  // o[i][t][e] += Σ_c P[row_i][c] · V[c][t·8·wv + kg·wv + e], keys c in increasing order.
  return kb_.rows_times_tile(std::move(o), p_rows_, g_.block_k, v_lane_, g_.v_stride, TC_, g_.wv);
}

void AttentionPtx::store_lse(const Values& m, const Values& l) {
  // lse[row] = (m + lg2 l)·ln 2, −inf where l = 0 (no key kept); the row's kg = 0 lane writes.
  if (!spec_.write_lse) return;
  llvm::Value* bh = b_.CreateAdd(b_.CreateMul(batch_, c64(spec_.hq)), head_);
  llvm::Value* base = at(lse_, b_.CreateAdd(b_.CreateMul(bh, len_q_), q0_));
  llvm::Value* writer = b_.CreateICmpEQ(kg_, c32(0));
  for (int i = 0; i < R_; ++i) {
    llvm::Value* value =
        b_.CreateSelect(b_.CreateFCmpOGT(l[i], kb_.cf(0.0)),
                        b_.CreateFMul(b_.CreateFAdd(m[i], kb_.lg2(l[i])), kb_.cf(kLn2)), kb_.cf(kNegInf), "lse");
    kb_.if_then(
        b_.CreateAnd(row_ok_[i], writer), [&] { b_.CreateStore(value, at(base, zext64(local_row_[i]))); }, "store_lse");
  }
}

void AttentionPtx::store_output(const Values& o, const Values* inv) {
  // out[row][col] = o · inv (online) or o (normalized), rows < L, columns < dv.
  const bool partial = g_.v_stride > dv_;
  for (int i = 0; i < R_; ++i) {
    llvm::Value* orow = at(o_blk_, b_.CreateMul(zext64(local_row_[i]), c64(dv_)));
    kb_.if_then(
        row_ok_[i],
        [&] {
          for (int t = 0; t < TC_; ++t)
            for (int e = 0; e < g_.wv; ++e) {
              llvm::Value* col = b_.CreateAdd(b_.CreateMul(kg_, c32(g_.wv)), c32(t * 8 * g_.wv + e), "col");
              llvm::Value* x = o[oi(i, t, e)];
              if (inv) x = b_.CreateFMul(x, (*inv)[i]);
              auto store = [&] { b_.CreateStore(x, at(orow, zext64(col))); };
              if (partial && (t + 1) * 8 * g_.wv > dv_)
                kb_.if_then(b_.CreateICmpSLT(col, c32(dv_)), store, "store_col");
              else
                store();
            }
        },
        "store_row");
  }
}

void AttentionPtx::zero_tile_weights(const Values& key) {
  // This thread's entries of the tile (rows < L, keys < S), as the visited tiles write them.
  for (int i = 0; i < R_; ++i) {
    llvm::Value* wrow = at(w_blk_, b_.CreateMul(zext64(local_row_[i]), len_k_));
    for (int j = 0; j < KJ_; ++j) {
      llvm::Value* ok = b_.CreateAnd(row_ok_[i], b_.CreateICmpSLT(key[j], len_k_));
      kb_.if_then(ok, [&] { b_.CreateStore(kb_.cf(0.0), at(wrow, key[j])); }, "zero_w");
    }
  }
}

}  // namespace

KernelInfo build_attention(llvm::Module& module, const AttentionKernel& request, const HostEmulation* emulation) {
  if (request.spec.storage == DType::bf16) return build_attention_mma(module, request, emulation);
  return AttentionPtx(module, request, emulation).emit(kernel_name(request));
}

}  // namespace qkv::codegen::nvptx::detail
