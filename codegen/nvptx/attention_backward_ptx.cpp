// The fused attention backward for NVPTX (FlashAttention-2's algorithm, fp32 FMA), two kernels.
//
// Both recompute the probabilities tile by tile from the forward's log-sum-exp, over the
// forward's score micro-tile (geometry.hpp: a thread's R query rows × KJ keys), with the mod
// expression of attention_mod_ptx.hpp (f, and f' from mod_with_derivatives):
//
//   S  = (scale·Q) Kᵀ · log2 e          dot_tile over shared Q and K
//   P  = 2^(f(S) − lse·log2 e)          0 where masked, past S, or in a row with no visible key
//   dP = dO Vᵀ                          dot_tile over shared dO and V
//   dS = P ∘ (dP ∘ Z − D) ∘ f'(S)       Z = keep / (1 − p) replays the forward's dropout
//
// dq (block per query tile, query head, batch): D = rowsum(dO ∘ O) of its rows (written to
// delta for dkdv), then for every key tile the keep predicate does not rule out (the forward's
// classify_tile, block-uniform): barrier, K and V tiles → shared, barrier, S, P, dP, dS; dS →
// shared (the warp's own rows), bar.warp.sync; dQ += dS K. dQ · scale is stored at the end.
//
// dkdv (block per key tile, kv head, batch): K and V staged once; for every query head of the
// group and every query tile not ruled out: barrier, Q (· scale) and dO → shared, barrier, S, P,
// dP, dS; P ∘ Z and dS → shared transposed (any warp reads them), barrier; dV += (P ∘ Z)ᵀ dO,
// dK += dSᵀ (scale·Q) on the thread's key rows. dK and dV are stored at the end.
//
// Every output element is summed by one thread in one order: deterministic, no atomics.
#include <cmath>
#include <iterator>
#include <memory>
#include <string>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>

#include "llvm/vector_math.hpp"
#include "nvptx/attention_backward_common.hpp"
#include "nvptx/attention_mod_ptx.hpp"
#include "nvptx/geometry.hpp"
#include "nvptx/kernel_builder.hpp"

namespace qkv::codegen::nvptx::detail {

namespace {

using Values = std::vector<llvm::Value*>;

class BackwardPtx {
 public:
  BackwardPtx(llvm::Module& module, const AttentionBackwardKernel& request, const HostEmulation* emulation)
      : kb_(module, emulation),
        b_(kb_.b()),
        spec_(request.spec),
        g_(attention_backward_geometry(request)),
        R_(g_.rows_per_thread),
        KJ_(g_.keys_per_thread),
        dk_(spec_.dk),
        dv_(spec_.dv) {}

  KernelInfo emit(const std::string& name);

 private:
  /// A score tile's probabilities and gradient, per thread R × KJ.
  struct Scores {
    Values p;   // P ∘ Z (what dV sums)
    Values ds;  // dS
  };

  void declare(const std::string& name);
  void prologue();
  /// The thread's query rows for the tile at q0 (local, absolute, f32, < L) and the tile's mod.
  void query_tile(llvm::Value* q0, llvm::Value* head);
  void emit_dq();
  void emit_dkdv();

  /// S, P, dP and dS for the staged Q, dO, K and V at the key tile k0 (keys `key`); `always`:
  /// the tile is fully kept.
  Scores scores(llvm::Value* k0, const Values& key, llvm::Value* always, llvm::Value* head32);
  /// tile[r][c] = src[r·width + c] · factor for rows r < valid, else 0 (c < width): stage_rows.
  void stage(llvm::Value* src, llvm::Value* valid, int rows, std::int64_t width, int stride, llvm::Value* tile,
             double factor, const std::string& name) {
    kb_.stage_rows(tid_, g_.threads, src, b_.CreateMul(valid, c64(width)), rows, width, stride, tile, factor, name);
  }
  /// rows[i][t·8·w + kg·w + e] = acc · factor for rows `ok` and columns < width.
  void store_rows(const Values& acc, const Values& rows, const Values& ok, int tc, int w, std::int64_t width,
                  double factor);

  // helpers
  llvm::Value* shared(std::int64_t offset) { return b_.CreateConstInBoundsGEP1_64(kb_.f32(), smem_, offset); }
  llvm::Value* at(llvm::Value* base, llvm::Value* index) { return b_.CreateInBoundsGEP(kb_.f32(), base, index); }
  llvm::Value* c32(std::int64_t v) { return kb_.c32(v); }
  llvm::Value* c64(std::int64_t v) { return kb_.c64(v); }
  llvm::Value* zext64(llvm::Value* v) { return b_.CreateZExt(v, kb_.i64()); }
  [[nodiscard]] std::size_t si(int i, int j) const { return static_cast<std::size_t>(i * KJ_ + j); }
  /// Rows of a tile region for the thread's rows `local` (i32).
  Values row_pointers(llvm::Value* base, const Values& local, int stride) {
    Values out;
    for (llvm::Value* r : local) out.push_back(at(base, b_.CreateMul(r, c32(stride))));
    return out;
  }

  KernelBuilder kb_;
  llvm::IRBuilder<>& b_;
  const cpu::AttentionSpec& spec_;
  BackwardGeometry g_;
  int R_, KJ_;
  std::int64_t dk_, dv_;

  BackwardParams a_;
  // block and thread geometry
  llvm::Value *tid_ = nullptr, *warp_ = nullptr, *rg_ = nullptr, *kg_ = nullptr, *batch_ = nullptr, *batch32_ = nullptr,
              *kv_head_ = nullptr;
  Values local_row_;                       // i32, the thread's rows within a query tile
  BackwardQueryTile t_;                    // the current query tile (query_tile)
  std::unique_ptr<TensorGradsPtx> grads_;  // dkdv with spec.tensor_grads
  // shared memory
  llvm::Value* smem_ = nullptr;
  llvm::Value *qs_ = nullptr, *dos_ = nullptr, *ks_ = nullptr, *vs_ = nullptr, *t0_ = nullptr, *t1_ = nullptr;
  Values q_rows_, do_rows_, k_rows_, v_rows_;
};

KernelInfo BackwardPtx::emit(const std::string& name) {
  declare(name);
  prologue();
  if (g_.dkdv)
    emit_dkdv();
  else
    emit_dq();
  b_.CreateRetVoid();

  return attention_backward_info(name, g_, spec_);
}

void BackwardPtx::declare(const std::string& name) {
  a_ = declare_attention_backward(kb_, name, g_);
  smem_ = kb_.dynamic_shared("qkv_attention_backward_smem");
}

void BackwardPtx::prologue() {
  tid_ = kb_.tid_x();
  warp_ = b_.CreateLShr(tid_, c32(5), "warp");
  llvm::Value* lane = b_.CreateAnd(tid_, c32(31), "lane");
  rg_ = b_.CreateLShr(lane, c32(3), "rg");
  kg_ = b_.CreateAnd(lane, c32(7), "kg");
  batch32_ = kb_.ctaid_z();
  batch_ = zext64(batch32_);
  for (int i = 0; i < R_; ++i)
    local_row_.push_back(b_.CreateAdd(b_.CreateMul(warp_, c32(4 * R_)), b_.CreateAdd(rg_, c32(4 * i)), "row"));

  qs_ = shared(g_.q_offset);
  dos_ = shared(g_.do_offset);
  ks_ = shared(g_.k_offset);
  vs_ = shared(g_.v_offset);
  t0_ = shared(g_.t0_offset);
  t1_ = shared(g_.t1_offset);
  q_rows_ = row_pointers(qs_, local_row_, g_.k_stride);
  do_rows_ = row_pointers(dos_, local_row_, g_.v_stride);
  Values key_local;
  for (int j = 0; j < KJ_; ++j) key_local.push_back(b_.CreateAdd(kg_, c32(8 * j)));
  k_rows_ = row_pointers(ks_, key_local, g_.k_stride);
  v_rows_ = row_pointers(vs_, key_local, g_.v_stride);
}

void BackwardPtx::query_tile(llvm::Value* q0, llvm::Value* head) {
  t_ = backward_query_tile(kb_, spec_, g_, a_, batch_, head, q0, local_row_, KJ_, /*load_delta=*/g_.dkdv);
}

BackwardPtx::Scores BackwardPtx::scores(llvm::Value* k0, const Values& key, llvm::Value* always, llvm::Value* head32) {
  Values s = kb_.dot_tile(q_rows_, k_rows_, dk_, g_.wk);
  for (llvm::Value*& x : s) x = b_.CreateFMul(x, kb_.cf(kLog2e));  // Q holds scale·q: log2 units
  const Values dp = kb_.dot_tile(do_rows_, v_rows_, dv_, g_.wv);
  BackwardEntries e =
      backward_entries(kb_, spec_, g_, a_, t_, std::move(s), dp, key, k0, always, batch32_, head32, grads_.get(), [&] {
        Values position;  // row-major in the tile: local row · block_k + local key
        for (int i = 0; i < R_; ++i)
          for (int j = 0; j < KJ_; ++j)
            position.push_back(
                b_.CreateAdd(b_.CreateMul(local_row_[i], c32(g_.block_k)), b_.CreateAdd(kg_, c32(8 * j))));
        return position;
      });
  return {std::move(e.pz), std::move(e.ds)};
}

void BackwardPtx::emit_dq() {
  llvm::Value* head32 = kb_.ctaid_y();
  llvm::Value* head = zext64(head32);
  kv_head_ = b_.CreateUDiv(head, c64(spec_.hq / spec_.hkv), "kv_head");
  query_tile(b_.CreateMul(zext64(kb_.ctaid_x()), c64(g_.block_q), "q0"), head);
  llvm::Value* row0 = b_.CreateAdd(b_.CreateMul(t_.bh, a_.len_q), t_.q0, "row0");
  llvm::Value* kv_rows = b_.CreateMul(b_.CreateAdd(b_.CreateMul(batch_, c64(spec_.hkv)), kv_head_), a_.len_k);
  llvm::Value* k_blk = at(a_.k, b_.CreateMul(kv_rows, c64(dk_)));
  llvm::Value* v_blk = at(a_.v, b_.CreateMul(kv_rows, c64(dv_)));
  stage(at(a_.q, b_.CreateMul(row0, c64(dk_))), t_.nvalid, g_.block_q, dk_, g_.k_stride, qs_, spec_.effective_scale(),
        "stage_q");
  llvm::Value* do_blk = at(a_.d_out, b_.CreateMul(row0, c64(dv_)));
  stage(do_blk, t_.nvalid, g_.block_q, dv_, g_.v_stride, dos_, 1.0, "stage_do");

  // D = rowsum(dO ∘ O): the row group's 8 lanes take every 8th column, then a butterfly sum;
  // its kg = 0 lane writes delta for the dkdv kernel.
  llvm::Value* o_blk = at(a_.out, b_.CreateMul(row0, c64(dv_)));
  llvm::Value* writer = b_.CreateICmpEQ(kg_, c32(0));
  for (int i = 0; i < R_; ++i) {
    llvm::Value* row = b_.CreateSelect(t_.ok[i], zext64(local_row_[i]), c64(0));  // in bounds
    llvm::Value* o_row = at(o_blk, b_.CreateMul(row, c64(dv_)));
    llvm::Value* do_row = at(do_blk, b_.CreateMul(row, c64(dv_)));
    Values sum = kb_.loop(
        kg_, c32(dv_), 8, {kb_.cf(0.0)},
        [&](llvm::Value* c, const Values& acc) {
          llvm::Value* x = b_.CreateLoad(kb_.f32(), at(do_row, zext64(c)));
          llvm::Value* o = b_.CreateLoad(kb_.f32(), at(o_row, zext64(c)));
          return Values{kb_.fma(x, o, acc[0])};
        },
        "delta", /*unroll=*/false);
    llvm::Value* d = b_.CreateSelect(t_.ok[i], kb_.group_sum(sum[0], 8), kb_.cf(0.0), "delta");
    t_.delta.push_back(d);
    kb_.if_then(
        b_.CreateAnd(t_.ok[i], writer),
        [&] { b_.CreateStore(d, at(a_.delta, b_.CreateAdd(b_.CreateMul(t_.bh, a_.len_q), t_.abs[i]))); },
        "store_delta");
  }

  Values ds_rows = row_pointers(t0_, local_row_, g_.t_stride);
  llvm::Value* k_lane = at(ks_, b_.CreateMul(kg_, c32(g_.wk)));
  llvm::Value* ntiles = b_.CreateSDiv(b_.CreateAdd(a_.len_k, c64(g_.block_k - 1)), c64(g_.block_k), "ntiles");
  Values acc(static_cast<std::size_t>(R_ * g_.tck * g_.wk), kb_.cf(0.0));
  acc = kb_.loop(
      c64(0), ntiles, 1, acc,
      [&](llvm::Value* kt, const Values& carried) {
        llvm::Value* k0 = b_.CreateMul(kt, c64(g_.block_k), "k0");
        Values key;
        for (int j = 0; j < KJ_; ++j) key.push_back(b_.CreateAdd(k0, zext64(b_.CreateAdd(kg_, c32(8 * j))), "key"));
        auto [always, never] = t_.mod->classify_tile(k0);
        return kb_.visit_unless(
            never, carried,
            [&](const Values& in) {
              kb_.barrier();  // every warp is done with the previous tiles (and Q, dO are staged)
              llvm::Value* valid = b_.CreateSub(a_.len_k, k0);
              stage(at(k_blk, b_.CreateMul(k0, c64(dk_))), valid, g_.block_k, dk_, g_.k_stride, ks_, 1.0, "stage_k");
              stage(at(v_blk, b_.CreateMul(k0, c64(dv_))), valid, g_.block_k, dv_, g_.v_stride, vs_, 1.0, "stage_v");
              kb_.barrier();
              const Scores sc = scores(k0, key, always, head32);
              for (int i = 0; i < R_; ++i)
                for (int j = 0; j < KJ_; ++j)
                  b_.CreateStore(sc.ds[si(i, j)], at(ds_rows[i], b_.CreateAdd(kg_, c32(8 * j))));
              kb_.warp_sync();  // dS rows are written and read by the same warp
              return kb_.rows_times_tile(in, ds_rows, g_.block_k, k_lane, g_.k_stride, g_.tck, g_.wk);
            },
            "tile");
      },
      "tiles", /*unroll=*/false);

  Values dq_rows;
  llvm::Value* dq_blk = at(a_.dq, b_.CreateMul(row0, c64(dk_)));
  for (int i = 0; i < R_; ++i) dq_rows.push_back(at(dq_blk, b_.CreateMul(zext64(local_row_[i]), c64(dk_))));
  store_rows(acc, dq_rows, t_.ok, g_.tck, g_.wk, dk_, spec_.effective_scale());
}

void BackwardPtx::emit_dkdv() {
  kv_head_ = zext64(kb_.ctaid_y());
  llvm::Value* k0 = b_.CreateMul(zext64(kb_.ctaid_x()), c64(g_.block_k), "k0");
  llvm::Value* kv_rows =
      b_.CreateAdd(b_.CreateMul(b_.CreateAdd(b_.CreateMul(batch_, c64(spec_.hkv)), kv_head_), a_.len_k), k0, "kv_row0");
  llvm::Value* valid_keys = b_.CreateSub(a_.len_k, k0);
  stage(at(a_.k, b_.CreateMul(kv_rows, c64(dk_))), valid_keys, g_.block_k, dk_, g_.k_stride, ks_, 1.0, "stage_k");
  stage(at(a_.v, b_.CreateMul(kv_rows, c64(dv_))), valid_keys, g_.block_k, dv_, g_.v_stride, vs_, 1.0, "stage_v");
  if (!spec_.tensor_grads.empty())
    grads_ = std::make_unique<TensorGradsPtx>(kb_, spec_, g_, a_, batch_, tid_, shared(g_.grad_offset));
  Values key;
  for (int j = 0; j < KJ_; ++j) key.push_back(b_.CreateAdd(k0, zext64(b_.CreateAdd(kg_, c32(8 * j))), "key"));

  // The thread's key rows of dK and dV, and its rows of Pᵀ and dSᵀ.
  Values key_local;
  for (int i = 0; i < g_.key_rows; ++i)
    key_local.push_back(b_.CreateAdd(b_.CreateMul(warp_, c32(4 * g_.key_rows)), b_.CreateAdd(rg_, c32(4 * i))));
  const Values pt_rows = row_pointers(t0_, key_local, g_.t_stride);
  const Values dst_rows = row_pointers(t1_, key_local, g_.t_stride);
  llvm::Value* do_lane = at(dos_, b_.CreateMul(kg_, c32(g_.wv)));
  llvm::Value* q_lane = at(qs_, b_.CreateMul(kg_, c32(g_.wk)));
  const std::size_t nk = static_cast<std::size_t>(g_.key_rows * g_.tck * g_.wk);
  const std::size_t nv = static_cast<std::size_t>(g_.key_rows * g_.tcv * g_.wv);
  Values acc(nk + nv, kb_.cf(0.0));  // dK then dV

  const std::int64_t group = spec_.hq / spec_.hkv;
  llvm::Value* nqt = b_.CreateSDiv(b_.CreateAdd(a_.len_q, c64(g_.block_q - 1)), c64(g_.block_q), "nqt");
  acc = kb_.loop(
      c64(0), c64(group), 1, acc,
      [&](llvm::Value* gi, const Values& per_head) {
        llvm::Value* head = b_.CreateAdd(b_.CreateMul(kv_head_, c64(group)), gi, "head");
        llvm::Value* head32 = b_.CreateTrunc(head, kb_.i32());
        return kb_.loop(
            c64(0), nqt, 1, per_head,
            [&](llvm::Value* qt, const Values& carried) {
              query_tile(b_.CreateMul(qt, c64(g_.block_q), "q0"), head);
              auto [always, never] = t_.mod->classify_tile(k0);
              return kb_.visit_unless(
                  never, carried,
                  [&](const Values& in) {
                    kb_.barrier();  // every warp is done with the previous query tile
                    llvm::Value* row0 = b_.CreateAdd(b_.CreateMul(t_.bh, a_.len_q), t_.q0, "row0");
                    stage(at(a_.q, b_.CreateMul(row0, c64(dk_))), t_.nvalid, g_.block_q, dk_, g_.k_stride, qs_,
                          spec_.effective_scale(), "stage_q");
                    stage(at(a_.d_out, b_.CreateMul(row0, c64(dv_))), t_.nvalid, g_.block_q, dv_, g_.v_stride, dos_,
                          1.0, "stage_do");
                    kb_.barrier();
                    const Scores sc = scores(k0, key, always, head32);
                    // Transposed: Pᵀ[key][row], dSᵀ[key][row]; other warps' key rows read them.
                    for (int i = 0; i < R_; ++i)
                      for (int j = 0; j < KJ_; ++j) {
                        llvm::Value* off =
                            b_.CreateAdd(b_.CreateMul(b_.CreateAdd(kg_, c32(8 * j)), c32(g_.t_stride)), local_row_[i]);
                        b_.CreateStore(sc.p[si(i, j)], at(t0_, off));
                        b_.CreateStore(sc.ds[si(i, j)], at(t1_, off));
                      }
                    kb_.barrier();
                    Values dkacc(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(nk));
                    Values dvacc(in.begin() + static_cast<std::ptrdiff_t>(nk), in.end());
                    dvacc = kb_.rows_times_tile(dvacc, pt_rows, g_.block_q, do_lane, g_.v_stride, g_.tcv, g_.wv);
                    dkacc = kb_.rows_times_tile(dkacc, dst_rows, g_.block_q, q_lane, g_.k_stride, g_.tck, g_.wk);
                    dkacc.insert(dkacc.end(), dvacc.begin(), dvacc.end());
                    return dkacc;
                  },
                  "qtile");
            },
            "qtiles", /*unroll=*/false);
      },
      "heads", /*unroll=*/false);

  Values ok, dk_rows, dv_rows;
  for (llvm::Value* r : key_local) {
    llvm::Value* row = b_.CreateAdd(kv_rows, zext64(r));
    ok.push_back(b_.CreateICmpSLT(zext64(r), valid_keys));
    dk_rows.push_back(at(a_.dk, b_.CreateMul(row, c64(dk_))));
    dv_rows.push_back(at(a_.dv, b_.CreateMul(row, c64(dv_))));
  }
  store_rows(Values(acc.begin(), acc.begin() + static_cast<std::ptrdiff_t>(nk)), dk_rows, ok, g_.tck, g_.wk, dk_, 1.0);
  store_rows(Values(acc.begin() + static_cast<std::ptrdiff_t>(nk), acc.end()), dv_rows, ok, g_.tcv, g_.wv, dv_, 1.0);
}

void BackwardPtx::store_rows(const Values& acc, const Values& rows, const Values& ok, int tc, int w, std::int64_t width,
                             double factor) {
  const bool partial = tc * 8 * w > width;
  for (std::size_t i = 0; i < rows.size(); ++i)
    kb_.if_then(
        ok[i],
        [&] {
          for (int t = 0; t < tc; ++t)
            for (int e = 0; e < w; ++e) {
              llvm::Value* col = b_.CreateAdd(b_.CreateMul(kg_, c32(w)), c32(t * 8 * w + e), "col");
              llvm::Value* x =
                  acc[(i * static_cast<std::size_t>(tc) + static_cast<std::size_t>(t)) * static_cast<std::size_t>(w) +
                      static_cast<std::size_t>(e)];
              if (factor != 1.0) x = b_.CreateFMul(x, kb_.cf(factor));
              auto store = [&] { b_.CreateStore(x, at(rows[i], zext64(col))); };
              if (partial && (t + 1) * 8 * w > width)
                kb_.if_then(b_.CreateICmpSLT(col, c32(width)), store, "store_col");
              else
                store();
            }
        },
        "store_row");
}

}  // namespace

KernelInfo build_attention_backward(llvm::Module& module, const AttentionBackwardKernel& request,
                                    const HostEmulation* emulation) {
  if (request.part == AttentionBackwardKernel::Part::dtensor)
    return build_attention_dtensor(module, request, emulation);
  if (request.spec.storage == DType::bf16) return build_attention_backward_mma(module, request, emulation);
  return BackwardPtx(module, request, emulation).emit(kernel_name(request));
}

}  // namespace qkv::codegen::nvptx::detail
