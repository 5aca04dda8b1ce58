// The fused attention kernel, part 2: one K/V tile of `key_tile` keys starting at key k0, for the
// task's R vectors of query rows (lanes = rows).
//
//   scores  S[c][v] = Qᵀ·K (Q pre-scaled by scale·log2 e), modified, masked to −inf     (emit_scores)
//   step    m' = max(m, max_c S), α = 2^(m − m'), P = 2^(S − m'), l' = α·l + Σ_c P          (emit_tile)
//           dropout applied to P after the sum (the softmax is normalised before dropout)
//   P·V     Oᵀ[d][v] = α·Oᵀ[d][v] + Σ_c P[c][v]·V[k0 + c][d]                               (emit_pv)
//
// A row whose keys are all masked keeps m = −inf; the step then uses 0 in place of m' (so
// 2^(−inf − 0) = 0 rather than NaN), its sum stays 0 and its output row is written as zeros.
#include <limits>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsX86.h>

#include "cpu/kernels/attention_emitter.hpp"
#include "llvm/ir_util.hpp"
#include "llvm/philox_ir.hpp"
#include "llvm/vector_math.hpp"

namespace qkv::codegen::cpu {

namespace {
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// Unroll factor of the d loop of Q·Kᵀ: the largest of 4, 2, 1 dividing dk.
int d_unroll(std::int64_t dk) { return dk % 4 == 0 ? 4 : dk % 2 == 0 ? 2 : 1; }
}  // namespace

llvm::Value* AttentionEmitter::exp2(llvm::Value* x) {
  return cfg_.scalef_exp2 ? emit_exp2_scalef(b_, x, bf16_exp_) : emit_exp2(b_, x, /*no_overflow=*/true);
}

void AttentionEmitter::emit_tile(llvm::Value* kt, Pass pass) {
  llvm::Value* k0 = b_.CreateMul(kt, c64(tile_), "k0", true, true);
  llvm::Value* nk = smin(c64(tile_), b_.CreateSub(len_k_, k0), "nk");  // keys of this tile before S
  llvm::Value* k_end = b_.CreateAdd(k0, nk, "k_end");
  // The tile's class under the keep predicate: never kept → skipped (its weights are zeros);
  // always kept → no per-entry mask unless it runs past S.
  auto [always, never] = classify_keys(k0, k_end);
  llvm::Function* fn = b_.GetInsertBlock()->getParent();
  llvm::BasicBlock* body = llvm::BasicBlock::Create(ctx_, "tile.body", fn);
  llvm::BasicBlock* skip = llvm::BasicBlock::Create(ctx_, "tile.skip", fn);
  llvm::BasicBlock* done = llvm::BasicBlock::Create(ctx_, "tile.done", fn);
  b_.CreateCondBr(never, skip, body);
  b_.SetInsertPoint(skip);
  if (pass == Pass::normalized) zero_weights(k0, nk);
  b_.CreateBr(done);
  b_.SetInsertPoint(body);

  llvm::Value* partial = b_.CreateNot(always, "partial");
  llvm::Value* masked = b_.CreateOr(partial, b_.CreateICmpSGE(kt, nclean_), "masked");
  llvm::Value* span = pass == Pass::online ? tile_span(k0, k_end) : c64(tile_);
  nk = smin(nk, span, "nk");
  std::vector<llvm::Value*> tile_max = emit_scores(k0, span, masked, partial);

  std::vector<llvm::Value*> m_use(static_cast<std::size_t>(qv_)), alpha(static_cast<std::size_t>(qv_)),
      inv_l(static_cast<std::size_t>(qv_));
  for (int v = 0; v < qv_; ++v) {
    if (pass == Pass::normalized) {
      m_use[v] = load_vec(m_use_, c64(v));
      inv_l[v] = load_vec(inv_l_, c64(v));
      continue;
    }
    llvm::Value* m_old = load_vec(m_, c64(v));
    llvm::Value* m_new = b_.CreateMaxNum(m_old, tile_max[v], "m_new");
    m_use[v] = b_.CreateSelect(b_.CreateFCmpOEQ(m_new, vconst(kNegInf)), vconst(0.0), m_new, "m_use");
    alpha[v] = exp2(b_.CreateFSub(m_old, m_use[v]));
    store_vec(m_, c64(v), m_new);
  }

  std::vector<llvm::Value*> sums = emit_probabilities(k0, span, pass, m_use, inv_l);
  if (pass != Pass::normalized) {
    for (int v = 0; v < qv_; ++v) store_vec(l_, c64(v), fma(load_vec(l_, c64(v)), alpha[v], sums[v]));
  }
  if (pass != Pass::stats) {
    if (cfg_.dpbf16) pack_pairs(k0, nk, /*p_packed=*/pass == Pass::online);
    emit_pv(k0, nk, pass == Pass::online ? &alpha : nullptr);
    if (pass == Pass::normalized) emit_weights_copy(k0, nk);
  }
  b_.CreateBr(done);
  b_.SetInsertPoint(done);
}

llvm::Value* AttentionEmitter::tile_span(llvm::Value* k0, llvm::Value* k_end) {
  // A causal diagonal tile (or a window's far edge) ends in keys that no row of the task keeps:
  // the loops stop before them instead of computing scores to mask. Halves, quarters, … of the
  // tile, each a whole number of Q·Kᵀ blocks and of bf16 pairs; the smallest never-kept suffix
  // wins (a longer one contains it). Each is a few scalar operations on the predicate's bounds.
  llvm::Value* span = c64(tile_);
  if (mod_.expr.keep < 0) return span;
  for (int h = tile_ / 2; h >= 16 && h % qk_keys_ == 0 && h % 2 == 0; h /= 2) {
    llvm::Value* begin = b_.CreateAdd(k0, c64(h));
    llvm::Value* never = b_.CreateOr(b_.CreateICmpSGE(begin, k_end), classify_keys(begin, k_end).second);
    span = b_.CreateSelect(never, c64(h), span, "span");
  }
  return span;
}

std::vector<llvm::Value*> AttentionEmitter::emit_scores(llvm::Value* k0, llvm::Value* span, llvm::Value* masked,
                                                        llvm::Value* partial) {
  // With dpbf16 the loop runs over the dk/2 pairs of features: Qᵀ's rows are pairs, a key's pair
  // (d, d+1) is one 32-bit broadcast from K in place.
  const std::int64_t depth = cfg_.dpbf16 ? dk_ / 2 : dk_;
  const int unroll = d_unroll(depth);
  llvm::Value* last_key = b_.CreateSub(len_k_, c64(1), "last_key");
  std::vector<llvm::Value*> max_init(static_cast<std::size_t>(qv_), vconst(kNegInf));
  return ir::emit_loop(
      b_, c64(0), span, qk_keys_, max_init,
      [&](llvm::Value* sb, const std::vector<llvm::Value*>& running_max) {
        // The block's keys; keys past S (last tile only) read row S−1 and are masked below.
        llvm::Value* kbase = b_.CreateAdd(k0, sb, "", true, true);
        std::vector<llvm::Value*> key(static_cast<std::size_t>(qk_keys_)), krow(key.size()), kptr(key.size());
        for (int j = 0; j < qk_keys_; ++j) {
          key[j] = b_.CreateAdd(kbase, c64(j), "key", true, true);
          krow[j] = smin(key[j], last_key);
          kptr[j] = b_.CreateInBoundsGEP(st_, k_base_, b_.CreateMul(krow[j], c64(dk_), "", true, true), "krow");
        }
        // acc[j·R + v] = Σ_d Qᵀ[d][v] · K[key_j][d]
        std::vector<llvm::Value*> zero(static_cast<std::size_t>(qk_keys_ * qv_), vconst(0.0));
        std::vector<llvm::Value*> acc = ir::emit_loop(
            b_, c64(0), c64(depth), unroll, zero,
            [&](llvm::Value* d0, const std::vector<llvm::Value*>& in) {
              std::vector<llvm::Value*> a = in;
              for (int u = 0; u < unroll; ++u) {
                llvm::Value* d = b_.CreateAdd(d0, c64(u), "", true, true);
                llvm::Value* qrow = vec_row(qt_, d);
                std::vector<llvm::Value*> qv(static_cast<std::size_t>(qv_));
                for (int v = 0; v < qv_; ++v) qv[v] = load_at(qrow, v);
                for (int j = 0; j < qk_keys_; ++j) {
                  if (cfg_.dpbf16) {
                    llvm::Value* pair =
                        b_.CreateAlignedLoad(i32_, b_.CreateInBoundsGEP(i32_, kptr[j], d), llvm::Align(2));
                    llvm::Value* kb = b_.CreateVectorSplat(static_cast<unsigned>(lanes_), pair);
                    for (int v = 0; v < qv_; ++v) a[j * qv_ + v] = dot_pairs(a[j * qv_ + v], qv[v], kb);
                    continue;
                  }
                  llvm::Value* kb = splat(load_stored(kptr[j], d));
                  for (int v = 0; v < qv_; ++v) a[j * qv_ + v] = fma(qv[v], kb, a[j * qv_ + v]);
                }
              }
              return a;
            },
            "qk.d");
        if (cfg_.dpbf16) {  // Qᵀ was packed unscaled
          llvm::Value* factor = vconst(spec_.effective_scale() * kLog2e);
          for (auto& x : acc) x = b_.CreateFMul(x, factor);
        }

        // The score modification on every tile; the keep predicate where the tile needs it. The
        // mod reads keys clamped to S − 1 (their entries are masked anyway).
        std::vector<std::vector<llvm::Value*>> keyc(static_cast<std::size_t>(qk_keys_), task_cache_);
        acc = apply_score_mod(acc, krow, keyc);
        acc = apply_tile_masks(acc, key, masked, partial, keyc);

        std::vector<llvm::Value*> mx = running_max;
        for (int j = 0; j < qk_keys_; ++j) {
          llvm::Value* srow = vec_row(sp_, b_.CreateAdd(sb, c64(j), "", true, true));
          for (int v = 0; v < qv_; ++v) {
            store_at(srow, v, acc[j * qv_ + v]);
            mx[v] = b_.CreateMaxNum(mx[v], acc[j * qv_ + v]);
          }
        }
        return mx;
      },
      "qk");
}

std::vector<llvm::Value*> AttentionEmitter::apply_tile_masks(const std::vector<llvm::Value*>& s,
                                                             const std::vector<llvm::Value*>& key, llvm::Value* masked,
                                                             llvm::Value* partial,
                                                             std::vector<std::vector<llvm::Value*>>& keyc) {
  // Only partial tiles and the tile that runs past S take this branch (a well-predicted branch
  // per Q·Kᵀ block instead of a second copy of the whole tile).
  llvm::BasicBlock* from = b_.GetInsertBlock();
  llvm::Function* fn = from->getParent();
  llvm::BasicBlock* mask = llvm::BasicBlock::Create(ctx_, "mask", fn);
  llvm::BasicBlock* join = llvm::BasicBlock::Create(ctx_, "mask.done", fn);
  b_.CreateCondBr(masked, mask, join);

  b_.SetInsertPoint(mask);
  const int keep = mod_.expr.keep;
  llvm::Value* last_key = b_.CreateSub(len_k_, c64(1));
  std::vector<llvm::Value*> out = s;
  for (int j = 0; j < qk_keys_; ++j) {
    llvm::Value* inside = b_.CreateICmpSLT(key[j], len_k_, "inside");  // a scalar: key < S
    llvm::Value* krow = smin(key[j], last_key);
    if (keep >= 0) keyc[j] = key_values(krow, keep, &keyc[j]);
    for (int v = 0; v < qv_; ++v) {
      llvm::Value* visible = splat(inside);
      if (keep >= 0) {
        llvm::Value* k = mod_value(keep, v, krow, nullptr, keyc[j]);
        if (k->getType()->getScalarType()->isFloatingPointTy()) k = b_.CreateFCmpUNE(k, vconst(0.0));  // a literal
        visible = b_.CreateAnd(visible, b_.CreateOr(k, splat(b_.CreateNot(partial))));
      }
      out[j * qv_ + v] = b_.CreateSelect(visible, s[j * qv_ + v], vconst(kNegInf));
    }
  }
  llvm::BasicBlock* mask_end = b_.GetInsertBlock();
  b_.CreateBr(join);

  b_.SetInsertPoint(join);
  for (std::size_t i = 0; i < s.size(); ++i) {
    llvm::PHINode* phi = b_.CreatePHI(vf_, 2, "s");
    phi->addIncoming(s[i], from);
    phi->addIncoming(out[i], mask_end);
    out[i] = phi;
  }
  return out;
}

std::vector<llvm::Value*> AttentionEmitter::emit_probabilities(llvm::Value* k0, llvm::Value* span, Pass pass,
                                                               const std::vector<llvm::Value*>& m_use,
                                                               const std::vector<llvm::Value*>& inv_l) {
  const bool dropout = spec_.dropout_p > 0 && pass != Pass::stats;
  // One pass (the weights are not written): P goes straight to spb_'s bf16 pairs, key by key
  // pair, never stored in f32 (its sum is taken in f32, in the same order).
  const bool to_pairs = cfg_.dpbf16 && pass == Pass::online;
  const int step = to_pairs ? 2 : 1;
  llvm::Value* keep_scale = vconst(dropout ? 1.0 / (1.0 - spec_.dropout_p) : 1.0);
  std::vector<llvm::Value*> zero(static_cast<std::size_t>(qv_), vconst(0.0));
  return ir::emit_loop(
      b_, c64(0), b_.CreateSDiv(span, c64(step)), 1, zero,
      [&](llvm::Value* i, const std::vector<llvm::Value*>& in) {
        std::vector<llvm::Value*> sums = in;
        std::vector<std::vector<llvm::Value*>> pairs(static_cast<std::size_t>(qv_));
        for (int half = 0; half < step; ++half) {
          llvm::Value* c = to_pairs ? b_.CreateAdd(b_.CreateMul(i, c64(2)), c64(half)) : i;
          llvm::Value* col = dropout ? b_.CreateTrunc(b_.CreateAdd(k0, c), i32_, "col") : nullptr;
          llvm::Value* row = vec_row(sp_, c);
          for (int v = 0; v < qv_; ++v) {
            llvm::Value* p = exp2(b_.CreateFSub(load_at(row, v), m_use[v]));
            if (pass != Pass::normalized) sums[v] = b_.CreateFAdd(sums[v], p);
            if (pass == Pass::stats) continue;
            if (pass == Pass::normalized) p = b_.CreateFMul(p, inv_l[v]);
            if (dropout) {
              llvm::Value* keep = emit_dropout_keep(b_, spec_.dropout_p, seed_, batch32_, head32_, abs_rows_[v], col);
              p = b_.CreateSelect(keep, b_.CreateFMul(p, keep_scale), vconst(0.0));
            }
            if (to_pairs)
              pairs[v].push_back(p);
            else
              store_at(row, v, p);
          }
        }
        if (to_pairs) {
          llvm::Value* out = vec_row(spb_, i);
          for (int v = 0; v < qv_; ++v) store_at(out, v, ir::bf16_pairs(b_, pairs[v][0], pairs[v][1]));
        }
        return sums;
      },
      "softmax");
}

void AttentionEmitter::emit_pv(llvm::Value* k0, llvm::Value* nk, const std::vector<llvm::Value*>* alpha) {
  const std::int64_t full = dv_ / pv_dims_ * pv_dims_;
  if (full > 0) {
    ir::emit_loop(
        b_, c64(0), c64(full), pv_dims_, [&](llvm::Value* dc) { emit_pv_block(k0, nk, dc, pv_dims_, alpha); }, "pv");
  }
  if (full < dv_) emit_pv_block(k0, nk, c64(full), static_cast<int>(dv_ - full), alpha);
}

void AttentionEmitter::emit_pv_block(llvm::Value* k0, llvm::Value* nk, llvm::Value* dc, int width,
                                     const std::vector<llvm::Value*>* alpha) {
  // acc[j·R + v] = Σ P[c][v] · V[k0 + c][dc + j] over the tile's keys, from zero; then
  // Oᵀ[dc + j][v] = α · Oᵀ[dc + j][v] + acc, compensated: the sum of p·v over random values is a
  // random walk far larger than its mean, and rounding it key by key cost ~1e-7 absolute however
  // long the row (7.6 × PyTorch fp32's error at S = 20 000). So each tile's sum starts afresh and
  // is added to O by Fast2Sum, its rounding error kept in Cᵀ (scaled by α like O, added at the end):
  // what remains is the rounding within the tiles (tests/numerics/test_long_rows.cpp). A bf16
  // output (compensated_ false) takes the plain sum: its own rounding is 2^-9.
  std::vector<llvm::Value*> orow(static_cast<std::size_t>(width));
  std::vector<llvm::Value*> init(static_cast<std::size_t>(width * qv_), vconst(0.0));
  std::vector<llvm::Value*> crow(static_cast<std::size_t>(width));
  for (int j = 0; j < width; ++j) {
    orow[j] = vec_row(ot_, b_.CreateAdd(dc, c64(j), "", true, true));
    if (compensated_) crow[j] = vec_row(ct_, b_.CreateAdd(dc, c64(j), "", true, true));
  }
  llvm::Value* vbase = b_.CreateInBoundsGEP(st_, v_base_, b_.CreateAdd(b_.CreateMul(k0, c64(dv_)), dc), "vtile");
  std::vector<llvm::Value*> acc;
  if (cfg_.dpbf16) {
    // Over the tile's key pairs: P's pairs (spb_) against V's (vp_), one 32-bit broadcast each.
    llvm::Value* npairs = b_.CreateSDiv(b_.CreateAdd(nk, c64(1)), c64(2), "npairs");
    acc = ir::emit_loop(
        b_, c64(0), npairs, 1, init,
        [&](llvm::Value* cp, const std::vector<llvm::Value*>& in) {
          std::vector<llvm::Value*> a = in;
          llvm::Value* prow = vec_row(spb_, cp);
          std::vector<llvm::Value*> p(static_cast<std::size_t>(qv_));
          for (int v = 0; v < qv_; ++v) p[v] = load_at(prow, v);
          llvm::Value* vrow = b_.CreateInBoundsGEP(i32_, vp_, b_.CreateAdd(b_.CreateMul(cp, c64(dv_)), dc));
          for (int j = 0; j < width; ++j) {
            llvm::Value* pair =
                b_.CreateLoad(i32_, b_.CreateConstInBoundsGEP1_64(i32_, vrow, static_cast<std::uint64_t>(j)));
            llvm::Value* vb = b_.CreateVectorSplat(static_cast<unsigned>(lanes_), pair);
            for (int v = 0; v < qv_; ++v) a[j * qv_ + v] = dot_pairs(a[j * qv_ + v], p[v], vb);
          }
          return a;
        },
        "pv.pair", ir::Unroll::allowed);
  } else {
    acc = ir::emit_loop(
        b_, c64(0), nk, 1, init,
        [&](llvm::Value* c, const std::vector<llvm::Value*>& in) {
          std::vector<llvm::Value*> a = in;
          llvm::Value* prow = vec_row(sp_, c);
          std::vector<llvm::Value*> p(static_cast<std::size_t>(qv_));
          for (int v = 0; v < qv_; ++v) p[v] = load_at(prow, v);
          llvm::Value* vrow = b_.CreateInBoundsGEP(st_, vbase, b_.CreateMul(c, c64(dv_), "", true, true));
          for (int j = 0; j < width; ++j) {
            llvm::Value* vb = splat(load_stored(vrow, c64(j)));
            for (int v = 0; v < qv_; ++v) a[j * qv_ + v] = fma(p[v], vb, a[j * qv_ + v]);
          }
          return a;
        },
        "pv.key", ir::Unroll::allowed);
  }
  for (int j = 0; j < width; ++j)
    for (int v = 0; v < qv_; ++v) {
      llvm::Value* o = load_at(orow[j], v);
      if (alpha) o = b_.CreateFMul(o, (*alpha)[v]);
      llvm::Value* x = acc[j * qv_ + v];
      if (!compensated_) {
        store_at(orow[j], v, b_.CreateFAdd(o, x));
        continue;
      }
      llvm::Value* c = load_at(crow[j], v);
      if (alpha) c = b_.CreateFMul(c, (*alpha)[v]);
      // Fast2Sum (Dekker): t + e = o + x exactly when |o| >= |x| — the running sum is the larger
      // but for the first tiles, where e is still a close estimate (3 operations, not TwoSum's 6).
      llvm::Value* t = b_.CreateFAdd(o, x);
      llvm::Value* e = b_.CreateFSub(x, b_.CreateFSub(t, o));
      store_at(orow[j], v, t);
      store_at(crow[j], v, b_.CreateFAdd(c, e));
    }
}

void AttentionEmitter::pack_pairs(llvm::Value* k0, llvm::Value* nk, bool p_packed) {
  // P: spb_[c/2][v] = bf16 pairs (P[c][rows], P[c+1][rows]), rounded to nearest even. Keys past S
  // already have P = 0.
  if (!p_packed) {
    ir::emit_loop(
        b_, c64(0), c64(tile_ / 2), 1,
        [&](llvm::Value* cp) {
          llvm::Value* c = b_.CreateMul(cp, c64(2));
          llvm::Value* row0 = vec_row(sp_, c);
          llvm::Value* row1 = vec_row(sp_, b_.CreateAdd(c, c64(1)));
          llvm::Value* out = vec_row(spb_, cp);
          for (int v = 0; v < qv_; ++v) store_at(out, v, ir::bf16_pairs(b_, load_at(row0, v), load_at(row1, v)));
        },
        "pack.p");
  }
  // V: vp_[c/2][d] = the pair (V[k0 + c][d], V[k0 + c + 1][d]), zero where key c + 1 is past the
  // tile's keys (nk odd), so that P's zero there meets a finite value.
  llvm::Type* lane16 = llvm::FixedVectorType::get(st_, static_cast<unsigned>(lanes_));
  llvm::Value* npairs = b_.CreateSDiv(b_.CreateAdd(nk, c64(1)), c64(2), "npairs");
  ir::emit_loop(
      b_, c64(0), npairs, 1,
      [&](llvm::Value* cp) {
        llvm::Value* c = b_.CreateMul(cp, c64(2));
        llvm::Value* second = b_.CreateICmpSLT(b_.CreateAdd(c, c64(1)), nk);
        llvm::Value* r0 = b_.CreateInBoundsGEP(st_, v_base_, b_.CreateMul(b_.CreateAdd(k0, c), c64(dv_)));
        llvm::Value* r1 = b_.CreateInBoundsGEP(st_, r0, b_.CreateSelect(second, c64(dv_), c64(0)));
        llvm::Value* out = b_.CreateInBoundsGEP(i32_, vp_, b_.CreateMul(cp, c64(dv_)));
        for (std::int64_t d = 0; d < dv_; d += lanes_) {
          llvm::Value* x = b_.CreateAlignedLoad(
              lane16, b_.CreateConstInBoundsGEP1_64(st_, r0, static_cast<std::uint64_t>(d)), llvm::Align(2));
          llvm::Value* y = b_.CreateAlignedLoad(
              lane16, b_.CreateConstInBoundsGEP1_64(st_, r1, static_cast<std::uint64_t>(d)), llvm::Align(2));
          y = b_.CreateSelect(second, y, llvm::Constant::getNullValue(lane16));
          b_.CreateAlignedStore(b_.CreateShuffleVector(x, y, ir::interleave_halves(lanes_)),
                                b_.CreateConstInBoundsGEP1_64(i32_, out, static_cast<std::uint64_t>(d)),
                                llvm::Align(vec_bytes_));
        }
      },
      "pack.v");
}

void AttentionEmitter::emit_weights_copy(llvm::Value* k0, llvm::Value* nk) {
  // weights[row][k0 + c] = P[c][row]: a strided scatter per vector, for the task's rows and the
  // tile's keys before S.
  ir::emit_loop(
      b_, c64(0), nk, 1,
      [&](llvm::Value* c) {
        llvm::Value* column = b_.CreateInBoundsGEP(f32_, w_base_, b_.CreateAdd(k0, c));
        llvm::Value* prow = vec_row(sp_, c);
        for (int v = 0; v < qv_; ++v)
          b_.CreateMaskedScatter(load_at(prow, v), b_.CreateGEP(f32_, column, w_rows_[v]), llvm::Align(4), valid_[v]);
      },
      "weights");
}

}  // namespace qkv::codegen::cpu
