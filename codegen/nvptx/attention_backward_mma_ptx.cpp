// The fused attention backward for NVPTX with bf16 storage, on tensor cores (sm_80+): the fp32
// kernels' algorithm and semantics (attention_backward_ptx.cpp) with every product on
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, as FlashAttention-2's bf16 backward: q, k,
// v, out, dO read as stored (bf16 bits), the sums in f32, P (P ∘ Z with dropout) and dS rounded to
// bf16 for the products that take them (the CPU kernel's rule on vdpbf16ps, docs/semantics.md),
// each gradient rounded to bf16 once when it is stored. lse and D stay f32.
//
// Each kernel's block owns a tile and sweeps the other's: warp w owns 16 of its rows (the
// forward's tensor-core layout, attention_mma_ptx.cpp), and every product is either A·Bᵀ (A the
// own tile's rows, B the swept tile's rows, both as stored) or C·B (C a product's fragments
// re-packed in registers, B the swept tile read .trans):
//
//   dq   (block per query tile, query head, batch; own Q, dO; swept K, V tiles)
//        D = rowsum(dO ∘ O) of its rows (written to delta), then per key tile not ruled out:
//        S = Q·Kᵀ, dP = dO·Vᵀ, P, dS (registers), dQ += dS·K; dQ · scale stored.
//   dkdv (block per key tile, kv head, batch; own K, V; swept Q, dO tiles of every query head of
//        the group): Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, Pᵀ, dSᵀ; dV += (P ∘ Z)ᵀ·dO, dK += dSᵀ·Q; dK · scale and
//        dV stored.
//
// A thread holds the C fragments of its warp's 16 own rows × the swept tile's columns: own row
// g + 8h (g = lane / 4) and column 8·nt + 2t + e (t = lane % 4) in register nt·4 + 2h + e. The mod
// (attention_mod_ptx.hpp) sees them as R query rows × KJ keys: dq R = 2 (h), KJ = 2·NT (2nt + e);
// dkdv R = 2·NT (2nt + e), KJ = 2 (h). Every output element is summed by one thread in one
// order: deterministic, no atomics. Refused (mma_attention_backward_unsupported): head widths
// that are not multiples of 16 in [16, 128], more than 8 warps. q, k, v, out, d_out and the
// gradients must be 16-byte aligned (cudaMalloc gives 256).
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

class BackwardMmaPtx {
 public:
  BackwardMmaPtx(llvm::Module& module, const AttentionBackwardKernel& request, const HostEmulation* emulation)
      : kb_(module, emulation),
        b_(kb_.b()),
        spec_(request.spec),
        g_(attention_backward_geometry(request)),
        dkdv_(g_.dkdv),
        NT_((dkdv_ ? g_.block_q : g_.block_k) / 8),
        R_(dkdv_ ? 2 * NT_ : 2),
        KJ_(dkdv_ ? 2 : 2 * NT_),
        dk_(spec_.dk),
        dv_(spec_.dv) {}

  KernelInfo emit(const std::string& name);

 private:
  struct Scores {
    Values p;   // P ∘ Z (what dV sums), C fragments
    Values ds;  // dS
  };

  void declare(const std::string& name);
  void prologue();
  /// The query tile at q0 of `head`: its rows' coordinates, lse (log2 units) and — dkdv — D, and
  /// the tile's mod.
  void query_tile(llvm::Value* q0, llvm::Value* head);
  void emit_dq();
  void emit_dkdv();
  /// S, P, dP and dS of the own rows against the staged swept tile (keys `key`, per j < KJ).
  Scores scores(llvm::Value* k0, const Values& key, llvm::Value* always, llvm::Value* head32);
  /// acc (C fragments of the own rows × width columns) · factor → bf16 pairs of the rows at
  /// `rows` (the own tile's first row, `width` elements a row) where `ok[h]`.
  void store(const Values& acc, llvm::Value* rows, std::int64_t width, const Values& ok, double factor);

  /// dkdv: the swept tile's column of the mod's query row i (i32): 8(i / 2) + 2t + i % 2.
  llvm::Value* query_column(int i) { return b_.CreateAdd(b_.CreateMul(lane_t_, c32(2)), c32(8 * (i / 2) + i % 2)); }
  /// The C register of query row i and key j (the mod's R × KJ order).
  [[nodiscard]] std::size_t creg(int i, int j) const {
    const int own = dkdv_ ? j : i, col = dkdv_ ? i : j;  // own row half h; swept column 2nt + e
    return static_cast<std::size_t>((col / 2) * 4 + 2 * own + col % 2);
  }
  [[nodiscard]] std::size_t si(int i, int j) const { return static_cast<std::size_t>(i * KJ_ + j); }
  /// The C fragments of 16 rows × `columns`, zero.
  Values zeros(std::int64_t columns) { return Values(static_cast<std::size_t>(columns / 2), kb_.cf(0.0)); }
  void stage(llvm::Value* src, llvm::Value* valid, int rows, std::int64_t width, llvm::Value* tile, int stride,
             const std::string& name) {
    kb_.stage_bf16_rows(tid_, g_.threads, src, valid, rows, width, tile, stride, name);
  }
  llvm::Value* c32(std::int64_t v) { return kb_.c32(v); }
  llvm::Value* c64(std::int64_t v) { return kb_.c64(v); }
  llvm::Value* zext64(llvm::Value* v) { return b_.CreateZExt(v, kb_.i64()); }
  llvm::Value* at16(llvm::Value* base, llvm::Value* index) {
    return b_.CreateInBoundsGEP(b_.getInt16Ty(), base, index);
  }
  llvm::Value* at32(llvm::Value* base, llvm::Value* index) { return b_.CreateInBoundsGEP(kb_.f32(), base, index); }
  llvm::Value* shared(std::int64_t float_offset) {
    return b_.CreateConstInBoundsGEP1_64(kb_.f32(), smem_, static_cast<std::uint64_t>(float_offset));
  }
  /// f32 of the bf16 in bits 0..15 (lo) or 16..31 of a pair.
  llvm::Value* bf16_half(llvm::Value* pair, bool hi) {
    llvm::Value* bits = hi ? b_.CreateAnd(pair, c32(0xffff0000)) : b_.CreateShl(pair, c32(16));
    return b_.CreateBitCast(bits, kb_.f32());
  }

  KernelBuilder kb_;
  llvm::IRBuilder<>& b_;
  const cpu::AttentionSpec& spec_;
  BackwardGeometry g_;
  bool dkdv_;
  int NT_;      // n8 column tiles of the swept tile
  int R_, KJ_;  // the mod's query rows and keys per thread
  std::int64_t dk_, dv_;

  BackwardParams a_;
  // geometry
  llvm::Value *tid_ = nullptr, *warp_ = nullptr, *group_ = nullptr, *lane_t_ = nullptr, *batch_ = nullptr,
              *batch32_ = nullptr;
  Values own_local_;                       // i32: the thread's own rows g, g + 8 within the block's tile
  BackwardQueryTile t_;                    // the current query tile (query_tile)
  std::unique_ptr<TensorGradsPtx> grads_;  // dkdv with spec.tensor_grads
  // shared memory and this lane's ldmatrix addresses (attention_backward_mma_ptx's header)
  llvm::Value *smem_ = nullptr, *qs_ = nullptr, *dos_ = nullptr, *ks_ = nullptr, *vs_ = nullptr;
  llvm::Value *a1_ = nullptr, *a2_ = nullptr;  // own tile (Q, dO or K, V): A fragments of the warp's rows
  llvm::Value *b1_ = nullptr, *b2_ = nullptr;  // swept tile (K, V or Q, dO) as stored: B of A·Bᵀ
  llvm::Value *t1_ = nullptr, *t2_ = nullptr;  // the same read .trans: B of C·B
};

KernelInfo BackwardMmaPtx::emit(const std::string& name) {
  declare(name);
  prologue();
  if (dkdv_)
    emit_dkdv();
  else
    emit_dq();
  b_.CreateRetVoid();

  return attention_backward_info(name, g_, spec_);
}

void BackwardMmaPtx::declare(const std::string& name) {
  a_ = declare_attention_backward(kb_, name, g_);
  smem_ = kb_.dynamic_shared("qkv_attention_backward_smem");
}

void BackwardMmaPtx::prologue() {
  tid_ = kb_.tid_x();
  warp_ = b_.CreateLShr(tid_, c32(5), "warp");
  llvm::Value* lane = b_.CreateAnd(tid_, c32(31), "lane");
  group_ = b_.CreateLShr(lane, c32(2), "group");
  lane_t_ = b_.CreateAnd(lane, c32(3), "tig");
  batch32_ = kb_.ctaid_z();
  batch_ = zext64(batch32_);
  llvm::Value* warp_row = b_.CreateMul(warp_, c32(16));
  for (int h = 0; h < 2; ++h) own_local_.push_back(b_.CreateAdd(warp_row, b_.CreateAdd(group_, c32(8 * h)), "own"));

  qs_ = shared(g_.q_offset);
  dos_ = shared(g_.do_offset);
  ks_ = shared(g_.k_offset);
  vs_ = shared(g_.v_offset);
  llvm::Value *own1 = dkdv_ ? ks_ : qs_, *own2 = dkdv_ ? vs_ : dos_;
  llvm::Value *swept1 = dkdv_ ? qs_ : ks_, *swept2 = dkdv_ ? dos_ : vs_;
  a1_ = kb_.mma_lane_row(own1, g_.k_stride, warp_row, true);
  a2_ = kb_.mma_lane_row(own2, g_.v_stride, warp_row, true);
  b1_ = kb_.mma_lane_row(swept1, g_.k_stride, c32(0), false);
  b2_ = kb_.mma_lane_row(swept2, g_.v_stride, c32(0), false);
  t1_ = kb_.mma_lane_row(swept1, g_.k_stride, c32(0), true);
  t2_ = kb_.mma_lane_row(swept2, g_.v_stride, c32(0), true);
}

void BackwardMmaPtx::query_tile(llvm::Value* q0, llvm::Value* head) {
  // The mod's query rows: dq the own rows g, g + 8; dkdv the columns 8(i / 2) + 2t + i % 2.
  Values local = own_local_;
  if (dkdv_) {
    local.clear();
    for (int i = 0; i < R_; ++i) local.push_back(query_column(i));
  }
  t_ = backward_query_tile(kb_, spec_, g_, a_, batch_, head, q0, local, KJ_, /*load_delta=*/dkdv_);
}

BackwardMmaPtx::Scores BackwardMmaPtx::scores(llvm::Value* k0, const Values& key, llvm::Value* always,
                                              llvm::Value* head32) {
  const Values s_acc =
      kb_.mma_a_bt(zeros(8 * NT_), kb_.mma_a_fragments(a1_, static_cast<int>(dk_ / 16)), b1_, g_.k_stride);
  const Values dp_acc =
      kb_.mma_a_bt(zeros(8 * NT_), kb_.mma_a_fragments(a2_, static_cast<int>(dv_ / 16)), b2_, g_.v_stride);
  // S (in log2 units) and dP in the mod's R × KJ order
  llvm::Value* factor = kb_.cf(spec_.effective_scale() * kLog2e);
  Values s(static_cast<std::size_t>(R_ * KJ_)), dp(s.size());
  for (int i = 0; i < R_; ++i)
    for (int j = 0; j < KJ_; ++j) {
      s[si(i, j)] = b_.CreateFMul(s_acc[creg(i, j)], factor);
      dp[si(i, j)] = dp_acc[creg(i, j)];
    }
  BackwardEntries e =
      backward_entries(kb_, spec_, g_, a_, t_, std::move(s), dp, key, k0, always, batch32_, head32, grads_.get(), [&] {
        Values position;  // dkdv: query row i at column 8(i / 2) + 2t + i % 2, key j at own row j
        for (int i = 0; i < R_; ++i)
          for (int j = 0; j < KJ_; ++j)
            position.push_back(
                b_.CreateAdd(b_.CreateMul(query_column(i), c32(g_.block_k)), own_local_[static_cast<std::size_t>(j)]));
        return position;
      });
  Scores out{Values(s_acc.size()), Values(s_acc.size())};  // back to the C fragments' order
  for (int i = 0; i < R_; ++i)
    for (int j = 0; j < KJ_; ++j) {
      out.p[creg(i, j)] = e.pz[si(i, j)];
      out.ds[creg(i, j)] = e.ds[si(i, j)];
    }
  return out;
}

void BackwardMmaPtx::emit_dq() {
  llvm::Value* head32 = kb_.ctaid_y();
  llvm::Value* head = zext64(head32);
  llvm::Value* kv_head = b_.CreateUDiv(head, c64(spec_.hq / spec_.hkv), "kv_head");
  query_tile(b_.CreateMul(zext64(kb_.ctaid_x()), c64(g_.block_q), "q0"), head);
  llvm::Value* row0 = b_.CreateAdd(b_.CreateMul(t_.bh, a_.len_q), t_.q0, "row0");
  llvm::Value* kv_rows = b_.CreateMul(b_.CreateAdd(b_.CreateMul(batch_, c64(spec_.hkv)), kv_head), a_.len_k);
  llvm::Value* k_blk = at16(a_.k, b_.CreateMul(kv_rows, c64(dk_)));
  llvm::Value* v_blk = at16(a_.v, b_.CreateMul(kv_rows, c64(dv_)));
  llvm::Value* do_blk = at16(a_.d_out, b_.CreateMul(row0, c64(dv_)));
  stage(at16(a_.q, b_.CreateMul(row0, c64(dk_))), t_.nvalid, g_.block_q, dk_, qs_, g_.k_stride, "stage_q");
  stage(do_blk, t_.nvalid, g_.block_q, dv_, dos_, g_.v_stride, "stage_do");

  // D = rowsum(dO ∘ O) in f32: the row's 4 lanes take column pairs 2t + 8c, then a butterfly
  // sum; lane t = 0 writes delta for the dkdv kernel.
  llvm::Value* o_blk = at16(a_.out, b_.CreateMul(row0, c64(dv_)));
  llvm::Value* writer = b_.CreateICmpEQ(lane_t_, c32(0));
  for (int i = 0; i < 2; ++i) {
    llvm::Value* row = b_.CreateSelect(t_.ok[i], zext64(own_local_[i]), c64(0));  // in bounds
    llvm::Value* o_row = at16(o_blk, b_.CreateMul(row, c64(dv_)));
    llvm::Value* do_row = at16(do_blk, b_.CreateMul(row, c64(dv_)));
    llvm::Value* sum = kb_.cf(0.0);
    for (std::int64_t c = 0; c < dv_ / 8; ++c) {
      llvm::Value* col = zext64(b_.CreateAdd(b_.CreateMul(lane_t_, c32(2)), c32(8 * c)));
      llvm::Value* x = b_.CreateAlignedLoad(kb_.i32(), at16(do_row, col), llvm::Align(4));
      llvm::Value* o = b_.CreateAlignedLoad(kb_.i32(), at16(o_row, col), llvm::Align(4));
      sum = kb_.fma(bf16_half(x, false), bf16_half(o, false), sum);
      sum = kb_.fma(bf16_half(x, true), bf16_half(o, true), sum);
    }
    llvm::Value* d = b_.CreateSelect(t_.ok[i], kb_.group_sum(sum, 4), kb_.cf(0.0), "delta");
    t_.delta.push_back(d);
    kb_.if_then(
        b_.CreateAnd(t_.ok[i], writer),
        [&] { b_.CreateStore(d, at32(a_.delta, b_.CreateAdd(b_.CreateMul(t_.bh, a_.len_q), t_.abs[i]))); },
        "store_delta");
  }

  llvm::Value* ntiles = b_.CreateSDiv(b_.CreateAdd(a_.len_k, c64(g_.block_k - 1)), c64(g_.block_k), "ntiles");
  llvm::Value* key_t = zext64(b_.CreateMul(lane_t_, c32(2)));
  Values acc = kb_.loop(
      c64(0), ntiles, 1, zeros(dk_),
      [&](llvm::Value* kt, const Values& carried) {
        llvm::Value* k0 = b_.CreateMul(kt, c64(g_.block_k), "k0");
        Values key;
        for (int j = 0; j < KJ_; ++j) key.push_back(b_.CreateAdd(k0, b_.CreateAdd(key_t, c64(8 * (j / 2) + j % 2))));
        auto [always, never] = t_.mod->classify_tile(k0);
        return kb_.visit_unless(
            never, carried,
            [&](const Values& in) {
              kb_.barrier();  // every warp is done with the previous tiles (and Q, dO are staged)
              llvm::Value* valid = b_.CreateSub(a_.len_k, k0);
              stage(at16(k_blk, b_.CreateMul(k0, c64(dk_))), valid, g_.block_k, dk_, ks_, g_.k_stride, "stage_k");
              stage(at16(v_blk, b_.CreateMul(k0, c64(dv_))), valid, g_.block_k, dv_, vs_, g_.v_stride, "stage_v");
              kb_.barrier();
              const Scores sc = scores(k0, key, always, head32);
              return kb_.mma_c_b(in, sc.ds, t1_, g_.k_stride);  // dQ += dS·K
            },
            "tile");
      },
      "tiles", /*unroll=*/false);
  store(acc, at16(a_.dq, b_.CreateMul(row0, c64(dk_))), dk_, t_.ok, spec_.effective_scale());
}

void BackwardMmaPtx::emit_dkdv() {
  llvm::Value* kv_head = zext64(kb_.ctaid_y());
  llvm::Value* k0 = b_.CreateMul(zext64(kb_.ctaid_x()), c64(g_.block_k), "k0");
  llvm::Value* kv_row0 =
      b_.CreateAdd(b_.CreateMul(b_.CreateAdd(b_.CreateMul(batch_, c64(spec_.hkv)), kv_head), a_.len_k), k0, "kv_row0");
  llvm::Value* valid_keys = b_.CreateSub(a_.len_k, k0);
  stage(at16(a_.k, b_.CreateMul(kv_row0, c64(dk_))), valid_keys, g_.block_k, dk_, ks_, g_.k_stride, "stage_k");
  stage(at16(a_.v, b_.CreateMul(kv_row0, c64(dv_))), valid_keys, g_.block_k, dv_, vs_, g_.v_stride, "stage_v");
  if (!spec_.tensor_grads.empty())
    grads_ = std::make_unique<TensorGradsPtx>(kb_, spec_, g_, a_, batch_, tid_, shared(g_.grad_offset));
  Values key;
  for (llvm::Value* r : own_local_) key.push_back(b_.CreateAdd(k0, zext64(r), "key"));

  const std::size_t nk = static_cast<std::size_t>(dk_ / 2);  // dK's C registers, then dV's
  Values acc = zeros(dk_ + dv_);
  const std::int64_t group = spec_.hq / spec_.hkv;
  llvm::Value* nqt = b_.CreateSDiv(b_.CreateAdd(a_.len_q, c64(g_.block_q - 1)), c64(g_.block_q), "nqt");
  acc = kb_.loop(
      c64(0), c64(group), 1, acc,
      [&](llvm::Value* gi, const Values& per_head) {
        llvm::Value* head = b_.CreateAdd(b_.CreateMul(kv_head, c64(group)), gi, "head");
        llvm::Value* head32 = b_.CreateTrunc(head, kb_.i32());
        return kb_.loop(
            c64(0), nqt, 1, per_head,
            [&](llvm::Value* qt, const Values& carried) {
              query_tile(b_.CreateMul(qt, c64(g_.block_q), "q0"), head);
              auto [always, never] = t_.mod->classify_tile(k0);
              return kb_.visit_unless(
                  never, carried,
                  [&](const Values& in) {
                    kb_.barrier();  // every warp is done with the previous query tile (and K, V are staged)
                    llvm::Value* row0 = b_.CreateAdd(b_.CreateMul(t_.bh, a_.len_q), t_.q0, "row0");
                    stage(at16(a_.q, b_.CreateMul(row0, c64(dk_))), t_.nvalid, g_.block_q, dk_, qs_, g_.k_stride,
                          "stage_q");
                    stage(at16(a_.d_out, b_.CreateMul(row0, c64(dv_))), t_.nvalid, g_.block_q, dv_, dos_, g_.v_stride,
                          "stage_do");
                    kb_.barrier();
                    const Scores sc = scores(k0, key, always, head32);
                    Values dk_acc(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(nk));
                    Values dv_acc(in.begin() + static_cast<std::ptrdiff_t>(nk), in.end());
                    dv_acc = kb_.mma_c_b(dv_acc, sc.p, t2_, g_.v_stride);   // dV += (P ∘ Z)ᵀ·dO
                    dk_acc = kb_.mma_c_b(dk_acc, sc.ds, t1_, g_.k_stride);  // dK += dSᵀ·Q
                    dk_acc.insert(dk_acc.end(), dv_acc.begin(), dv_acc.end());
                    return dk_acc;
                  },
                  "qtile");
            },
            "qtiles", /*unroll=*/false);
      },
      "heads", /*unroll=*/false);

  Values ok;
  for (llvm::Value* r : own_local_) ok.push_back(b_.CreateICmpSLT(zext64(r), valid_keys));
  store(Values(acc.begin(), acc.begin() + static_cast<std::ptrdiff_t>(nk)),
        at16(a_.dk, b_.CreateMul(kv_row0, c64(dk_))), dk_, ok, spec_.effective_scale());
  store(Values(acc.begin() + static_cast<std::ptrdiff_t>(nk), acc.end()), at16(a_.dv, b_.CreateMul(kv_row0, c64(dv_))),
        dv_, ok, 1.0);
}

void BackwardMmaPtx::store(const Values& acc, llvm::Value* rows, std::int64_t width, const Values& ok, double factor) {
  // Row g (c0, c1) and g + 8 (c2, c3) of each n8 column tile: columns 2t, 2t + 1 as one bf16 pair.
  llvm::Value* col0 = zext64(b_.CreateMul(lane_t_, c32(2)));
  for (int h = 0; h < 2; ++h) {
    llvm::Value* row = at16(rows, b_.CreateMul(zext64(own_local_[static_cast<std::size_t>(h)]), c64(width)));
    kb_.if_then(
        ok[static_cast<std::size_t>(h)],
        [&] {
          for (std::int64_t dt = 0; dt < width / 8; ++dt) {
            const auto e = static_cast<std::size_t>(dt * 4 + 2 * h);
            llvm::Value* pair =
                kb_.pack_bf16x2(b_.CreateFMul(acc[e], kb_.cf(factor)), b_.CreateFMul(acc[e + 1], kb_.cf(factor)));
            b_.CreateAlignedStore(pair, at16(row, b_.CreateAdd(col0, c64(8 * dt))), llvm::Align(4));
          }
        },
        "store_row");
  }
}

}  // namespace

KernelInfo build_attention_backward_mma(llvm::Module& module, const AttentionBackwardKernel& request,
                                        const HostEmulation* emulation) {
  return BackwardMmaPtx(module, request, emulation).emit(kernel_name(request));
}

}  // namespace qkv::codegen::nvptx::detail
