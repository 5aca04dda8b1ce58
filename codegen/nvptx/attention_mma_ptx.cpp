// The fused attention forward pass for NVPTX with bf16 storage, on tensor cores (sm_80+):
// FlashAttention-2's schedule with mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32.
//
// Semantics: AttentionKernel's with spec.storage == bf16, as the CPU kernel's bf16 storage
// (qkv/codegen/cpu/attention.hpp): q, k, v, out are bf16 bits (uint16); S = Q·Kᵀ accumulates in
// fp32 (bf16 products are exact in fp32), the softmax and O are fp32, P is rounded to bf16 (nearest
// even) for P·V, out is rounded to bf16 (nearest even), lse is f32. GQA, key padding, bias, causal
// (both alignments) and spec.mod as the fp32 kernel (attention_mod_ptx.hpp); rows with no visible
// key → zeros, lse −inf. Refused (mma_attention_unsupported): write_weights, dropout, head widths
// that are not multiples of 16 in [16, 128], more than 8 warps. q, k, v, out must be 16-byte
// aligned (rows are moved 16 bytes at a time; cudaMalloc gives 256).
//
// One block per (query tile, query head, batch) = (ctaid.x, ctaid.y, ctaid.z), 16·warps query
// rows. Warp w owns the block's rows [16w, 16w + 16) for the whole sweep:
//   prologue      Q tile → shared (16-byte rows; rows past L are 0), barrier, then each warp's
//                 A fragments of Q for every 16-wide slice of dk → registers (ldmatrix.x4), once
//   per K/V tile  (tiles the keep predicate never keeps are skipped, block-uniformly)
//                 barrier; K, V tile → shared (keys past S are 0); barrier
//                 S = Q·Kᵀ: per 16 keys and 16 features one ldmatrix.x4 of K (the B fragments of
//                 two n8 tiles) and two mma; S·scale·log2 e → the mod (log2 units, as the fp32
//                 kernel) → online softmax in registers (row max / sum over the 4 lanes of a
//                 fragment row: two butterfly shuffles)
//                 P·V: P's C fragments re-packed as A fragments in registers (FA2's trick: the
//                 C layout of two adjacent n8 tiles is the A layout of one k16 slice), V's B
//                 fragments by ldmatrix.x4.trans, O += P·V by mma
//   epilogue      out = O / l → bf16 pairs (32-bit stores), lse.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type";
// groupID g = lane >> 2, threadID_in_group t = lane % 4):
//   A (16×16, row): a0,a1: (g, 2t+{0,1}); a2,a3: (g+8, 2t+{0,1}); a4,a5: (g, 2t+8+{0,1});
//                   a6,a7: (g+8, 2t+8+{0,1}) — registers of two bf16 each, low half first.
//   B (16×8, col):  b0,b1: (k = 2t+{0,1}, n = g); b2,b3: (k = 2t+8+{0,1}, n = g).
//   C/D (16×8):     c0,c1: (g, 2t+{0,1}); c2,c3: (g+8, 2t+{0,1}).
// ldmatrix.x4: lane 8m + r gives the address of row r of matrix m; register m of lane l holds
// matrix m's (row l/4, columns 2(l%4) + {0,1}), or with .trans (rows 2(l%4) + {0,1}, column l/4).
// So for S = Q·Kᵀ the B operand (k = feature, n = key) is K's rows as stored (no .trans), and for
// O += P·V the B operand (k = key, n = feature) is V's rows transposed (.trans).
#include <cmath>
#include <limits>
#include <memory>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>

#include "llvm/vector_math.hpp"
#include "nvptx/attention_mod_ptx.hpp"
#include "nvptx/geometry.hpp"
#include "nvptx/kernel_builder.hpp"

namespace qkv::codegen::nvptx::detail {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

using Values = std::vector<llvm::Value*>;

class AttentionMmaPtx {
 public:
  AttentionMmaPtx(llvm::Module& module, const AttentionKernel& request, const HostEmulation* emulation)
      : kb_(module, emulation),
        b_(kb_.b()),
        spec_(request.spec),
        g_(attention_geometry(request)),
        dk_(spec_.dk),
        dv_(spec_.dv),
        NT_(g_.block_k / 8),
        KJ_(g_.keys_per_thread),
        DT_(static_cast<int>(dv_ / 8)),
        KS_(static_cast<int>(dk_ / 16)) {}

  KernelInfo emit(const std::string& name);

 private:
  void declare(const std::string& name);
  void prologue();
  void stage_rows(llvm::Value* src, llvm::Value* valid, int rows, std::int64_t width, llvm::Value* tile, int stride,
                  const std::string& name) {
    kb_.stage_bf16_rows(tid_, g_.threads, src, valid, rows, width, tile, stride, name);
  }
  /// One visited tile: m[2], l[2], o[DT·4] in, out.
  Values visit_tile(llvm::Value* k0, llvm::Value* always, const Values& carried);
  void store_output(const Values& o, const Values& inv);
  void store_lse(const Values& m, const Values& l);

  llvm::Value* c32(std::int64_t v) { return kb_.c32(v); }
  llvm::Value* c64(std::int64_t v) { return kb_.c64(v); }
  llvm::Value* zext64(llvm::Value* v) { return b_.CreateZExt(v, kb_.i64()); }
  llvm::Type* i16() { return b_.getInt16Ty(); }
  /// base + index bf16 elements.
  llvm::Value* at16(llvm::Value* base, llvm::Value* index) { return b_.CreateInBoundsGEP(i16(), base, index); }
  llvm::Value* shared16(std::int64_t float_offset) {
    return b_.CreateConstInBoundsGEP1_64(kb_.f32(), smem_, static_cast<std::uint64_t>(float_offset));
  }
  /// Score register of row half i (0: row g, 1: row g + 8) and thread key j (tile j / 2, column
  /// 2t + j % 2), in the C fragments of S.
  static std::size_t ci(int i, int j) { return static_cast<std::size_t>((j / 2) * 4 + 2 * i + j % 2); }

  KernelBuilder kb_;
  llvm::IRBuilder<>& b_;
  const cpu::AttentionSpec& spec_;
  AttentionGeometry g_;
  std::int64_t dk_, dv_;
  int NT_;  // n8 key tiles per K/V tile
  int KJ_;  // keys per thread per tile (2·NT)
  int DT_;  // n8 column tiles of O
  int KS_;  // k16 slices of dk

  llvm::Value *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *out_ = nullptr, *keep_ = nullptr, *bias_ = nullptr,
              *tensors_ = nullptr, *extents_ = nullptr, *nbatch_ = nullptr, *len_q_ = nullptr, *len_k_ = nullptr,
              *lse_ = nullptr;
  llvm::Value *tid_ = nullptr, *lane_t_ = nullptr, *head_ = nullptr, *batch_ = nullptr;
  llvm::Value *q0_ = nullptr, *nvalid_ = nullptr, *ntiles_ = nullptr;
  Values local_row_, row_abs_, row_f32_, row_ok_;  // rows g and g + 8 of the warp's 16
  llvm::Value *q_blk_ = nullptr, *k_blk_ = nullptr, *v_blk_ = nullptr, *o_blk_ = nullptr;
  llvm::Value *smem_ = nullptr, *qs_ = nullptr, *ks_ = nullptr, *vs_ = nullptr;
  llvm::Value *ld_q_ = nullptr, *ld_k_ = nullptr, *ld_v_ = nullptr;  // this lane's ldmatrix row addresses
  std::vector<Values> qa_;                                           // Q's A fragments per k16 slice
  std::unique_ptr<AttentionModIr> mod_;
};

KernelInfo AttentionMmaPtx::emit(const std::string& name) {
  declare(name);
  prologue();
  stage_rows(q_blk_, nvalid_, g_.block_q, dk_, qs_, g_.qk_stride, "stage_q");
  kb_.barrier();
  qa_ = kb_.mma_a_fragments(ld_q_, KS_);

  const auto f0 = kb_.cf(0.0), ninf = kb_.cf(kNegInf);
  Values init{ninf, ninf, f0, f0};  // m[2], l[2]
  init.insert(init.end(), static_cast<std::size_t>(DT_ * 4), f0);
  Values result = kb_.loop(
      c64(0), ntiles_, 1, init,
      [&](llvm::Value* kt, const Values& carried) {
        llvm::Value* k0 = b_.CreateMul(kt, c64(g_.block_k), "k0");
        auto [always, never] = mod_->classify_tile(k0);
        return kb_.visit_unless(never, carried, [&](const Values& in) { return visit_tile(k0, always, in); }, "tiles");
      },
      "tiles", /*unroll=*/false);

  Values m(result.begin(), result.begin() + 2), l(result.begin() + 2, result.begin() + 4);
  Values o(result.begin() + 4, result.end());
  Values inv;
  for (int i = 0; i < 2; ++i)
    inv.push_back(b_.CreateSelect(b_.CreateFCmpOGT(l[i], f0), b_.CreateFDiv(kb_.cf(1.0), l[i]), f0, "inv_l"));
  store_output(o, inv);
  store_lse(m, l);
  b_.CreateRetVoid();

  return attention_entry_info(name, g_, spec_.hq);
}

void AttentionMmaPtx::declare(const std::string& name) {
  llvm::Function* fn = declare_attention_entry(kb_, name, g_.threads);
  q_ = fn->getArg(0);
  k_ = fn->getArg(1);
  v_ = fn->getArg(2);
  out_ = fn->getArg(3);
  keep_ = fn->getArg(5);
  bias_ = fn->getArg(6);
  tensors_ = fn->getArg(7);
  extents_ = fn->getArg(8);
  nbatch_ = fn->getArg(9);
  len_q_ = fn->getArg(10);
  len_k_ = fn->getArg(11);
  lse_ = fn->getArg(13);
  smem_ = kb_.dynamic_shared("qkv_attention_smem");
}

void AttentionMmaPtx::prologue() {
  tid_ = kb_.tid_x();
  llvm::Value* warp = b_.CreateLShr(tid_, c32(5), "warp");
  llvm::Value* lane = b_.CreateAnd(tid_, c32(31), "lane");
  llvm::Value* group = b_.CreateLShr(lane, c32(2), "group");  // groupID
  lane_t_ = b_.CreateAnd(lane, c32(3), "tig");                // threadID_in_group
  batch_ = zext64(kb_.ctaid_z());
  head_ = zext64(kb_.ctaid_y());
  q0_ = b_.CreateMul(zext64(kb_.ctaid_x()), c64(g_.block_q), "q0");
  nvalid_ = kb_.smin(c64(g_.block_q), b_.CreateSub(len_q_, q0_));
  ntiles_ = b_.CreateSDiv(b_.CreateAdd(len_k_, c64(g_.block_k - 1)), c64(g_.block_k), "ntiles");

  for (int i = 0; i < 2; ++i) {
    llvm::Value* r = b_.CreateAdd(b_.CreateMul(warp, c32(16)), b_.CreateAdd(group, c32(8 * i)), "row");
    local_row_.push_back(r);
    llvm::Value* abs = b_.CreateAdd(q0_, zext64(r), "row_abs");
    row_abs_.push_back(abs);
    row_f32_.push_back(b_.CreateSIToFP(abs, kb_.f32(), "row_f"));
    row_ok_.push_back(b_.CreateICmpSLT(abs, len_q_, "row_ok"));
  }

  llvm::Value* kv_head = b_.CreateUDiv(head_, c64(spec_.hq / spec_.hkv), "kv_head");
  llvm::Value* bh = b_.CreateAdd(b_.CreateMul(batch_, c64(spec_.hq)), head_);
  llvm::Value* row0 = b_.CreateAdd(b_.CreateMul(bh, len_q_), q0_, "row0");
  llvm::Value* kv_rows = b_.CreateMul(b_.CreateAdd(b_.CreateMul(batch_, c64(spec_.hkv)), kv_head), len_k_);
  q_blk_ = at16(q_, b_.CreateMul(row0, c64(dk_)));
  k_blk_ = at16(k_, b_.CreateMul(kv_rows, c64(dk_)));
  v_blk_ = at16(v_, b_.CreateMul(kv_rows, c64(dv_)));
  o_blk_ = at16(out_, b_.CreateMul(row0, c64(dv_)));

  qs_ = shared16(g_.q_offset);
  ks_ = shared16(g_.k_offset);
  vs_ = shared16(g_.v_offset);
  // ldmatrix row addresses: Q's A fragments (the warp's 16 rows), K's B fragments (S = Q·Kᵀ:
  // K is stored n-major), V's B fragments (O += P·V: V is stored k-major, read .trans).
  ld_q_ = kb_.mma_lane_row(qs_, g_.qk_stride, b_.CreateMul(warp, c32(16)), true);
  ld_k_ = kb_.mma_lane_row(ks_, g_.qk_stride, c32(0), false);
  ld_v_ = kb_.mma_lane_row(vs_, g_.v_stride, c32(0), true);

  AttentionModFrame frame{keep_,  bias_, tensors_, extents_, nbatch_,    len_q_, len_k_,
                          batch_, head_, q0_,      nvalid_,  g_.block_k, KJ_,    row_f32_};
  mod_ = std::make_unique<AttentionModIr>(kb_, spec_, std::move(frame));
}

Values AttentionMmaPtx::visit_tile(llvm::Value* k0, llvm::Value* always, const Values& carried) {
  Values cm(carried.begin(), carried.begin() + 2), cl(carried.begin() + 2, carried.begin() + 4);
  Values co(carried.begin() + 4, carried.end());
  kb_.barrier();  // every warp is done with the previous tile's K, V
  llvm::Value* valid = b_.CreateSub(len_k_, k0);
  stage_rows(at16(k_blk_, b_.CreateMul(k0, c64(dk_))), valid, g_.block_k, dk_, ks_, g_.qk_stride, "stage_k");
  stage_rows(at16(v_blk_, b_.CreateMul(k0, c64(dv_))), valid, g_.block_k, dv_, vs_, g_.v_stride, "stage_v");
  kb_.barrier();

  // S in log2 units, in the mod's R × KJ order (rows g, g + 8; keys tile·8 + 2t + {0,1}).
  Values acc = kb_.mma_a_bt(Values(static_cast<std::size_t>(NT_ * 4), kb_.cf(0.0)), qa_, ld_k_, g_.qk_stride);
  llvm::Value* factor = kb_.cf(spec_.effective_scale() * kLog2e);
  Values s(static_cast<std::size_t>(2 * KJ_)), key;
  llvm::Value* key_t = zext64(b_.CreateMul(lane_t_, c32(2)));
  for (int j = 0; j < KJ_; ++j) key.push_back(b_.CreateAdd(k0, b_.CreateAdd(key_t, c64(8 * (j / 2) + j % 2)), "key"));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < KJ_; ++j) s[static_cast<std::size_t>(i * KJ_ + j)] = b_.CreateFMul(acc[ci(i, j)], factor);
  llvm::Value* partial = b_.CreateNot(always, "partial");
  llvm::Value* past_s = b_.CreateICmpSGT(b_.CreateAdd(k0, c64(g_.block_k)), len_k_, "past_s");
  s = mod_->apply(s, key, b_.CreateOr(partial, past_s, "masked"), partial);

  // Online softmax per row; a row's KJ·4 keys are in the 4 lanes of its group.
  Values p(static_cast<std::size_t>(NT_ * 4));
  Values alpha(2);
  for (int i = 0; i < 2; ++i) {
    llvm::Value* mx = kb_.cf(kNegInf);
    for (int j = 0; j < KJ_; ++j) mx = b_.CreateMaxNum(mx, s[static_cast<std::size_t>(i * KJ_ + j)]);
    mx = kb_.group_max(mx, 4);
    llvm::Value* m_new = b_.CreateMaxNum(cm[i], mx, "m_new");
    llvm::Value* m_use = b_.CreateSelect(b_.CreateFCmpOEQ(m_new, kb_.cf(kNegInf)), kb_.cf(0.0), m_new, "m_use");
    alpha[i] = kb_.ex2(b_.CreateFSub(cm[i], m_use));
    cm[i] = m_new;
    llvm::Value* sum = kb_.cf(0.0);
    for (int j = 0; j < KJ_; ++j) {
      llvm::Value* x = kb_.ex2(b_.CreateFSub(s[static_cast<std::size_t>(i * KJ_ + j)], m_use));
      sum = b_.CreateFAdd(sum, x);
      p[ci(i, j)] = x;
    }
    cl[i] = kb_.fma(cl[i], alpha[i], kb_.group_sum(sum, 4));
  }
  for (int dt = 0; dt < DT_; ++dt)
    for (int e = 0; e < 4; ++e) {
      auto& x = co[static_cast<std::size_t>(dt * 4 + e)];
      x = b_.CreateFMul(x, alpha[static_cast<std::size_t>(e / 2)]);
    }
  co = kb_.mma_c_b(co, p, ld_v_, g_.v_stride);
  Values next = cm;
  next.insert(next.end(), cl.begin(), cl.end());
  next.insert(next.end(), co.begin(), co.end());
  return next;
}

void AttentionMmaPtx::store_output(const Values& o, const Values& inv) {
  // Row g (c0, c1) and g + 8 (c2, c3) of each n8 column tile: columns 2t, 2t + 1 as one bf16 pair.
  for (int i = 0; i < 2; ++i) {
    llvm::Value* orow = at16(o_blk_, b_.CreateMul(zext64(local_row_[i]), c64(dv_)));
    llvm::Value* col0 = zext64(b_.CreateMul(lane_t_, c32(2)));
    kb_.if_then(
        row_ok_[i],
        [&] {
          for (int dt = 0; dt < DT_; ++dt) {
            const auto e = static_cast<std::size_t>(dt * 4 + 2 * i);
            llvm::Value* pair = kb_.pack_bf16x2(b_.CreateFMul(o[e], inv[i]), b_.CreateFMul(o[e + 1], inv[i]));
            b_.CreateAlignedStore(pair, at16(orow, b_.CreateAdd(col0, c64(8 * dt))), llvm::Align(4));
          }
        },
        "store_row");
  }
}

void AttentionMmaPtx::store_lse(const Values& m, const Values& l) {
  // lse[row] = (m + lg2 l)·ln 2, −inf where l = 0; lane t = 0 of the row's group writes.
  if (!spec_.write_lse) return;
  llvm::Value* bh = b_.CreateAdd(b_.CreateMul(batch_, c64(spec_.hq)), head_);
  llvm::Value* base = b_.CreateInBoundsGEP(kb_.f32(), lse_, b_.CreateAdd(b_.CreateMul(bh, len_q_), q0_));
  llvm::Value* writer = b_.CreateICmpEQ(lane_t_, c32(0));
  for (int i = 0; i < 2; ++i) {
    llvm::Value* value =
        b_.CreateSelect(b_.CreateFCmpOGT(l[i], kb_.cf(0.0)),
                        b_.CreateFMul(b_.CreateFAdd(m[i], kb_.lg2(l[i])), kb_.cf(kLn2)), kb_.cf(kNegInf), "lse");
    kb_.if_then(
        b_.CreateAnd(row_ok_[i], writer),
        [&] { b_.CreateStore(value, b_.CreateInBoundsGEP(kb_.f32(), base, zext64(local_row_[i]))); }, "store_lse");
  }
}

}  // namespace

KernelInfo build_attention_mma(llvm::Module& module, const AttentionKernel& request, const HostEmulation* emulation) {
  return AttentionMmaPtx(module, request, emulation).emit(kernel_name(request));
}

}  // namespace qkv::codegen::nvptx::detail
