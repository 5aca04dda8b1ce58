// The fused attention backward (FlashAttention-2's algorithm) as LLVM IR, lanes over keys.
//
// A task (batch, kv head, chunk) walks its chunk's key blocks of Bc keys. Per key block it packs
// Kᵀ [dk][Bc], K [Bc][dk] and Vᵀ [dv][Bc] (zero past S and past the head width), zeroes its dK and
// dV accumulators [Bc][d], and then, for every query head of the group and every block of Br query
// rows the mask does not rule out (the forward's tile classification: emit_mod_classify):
//   S  = (scale·Q) Kᵀ                      [Br][Bc]   Q packed pre-scaled, rows past L zero
//   P  = exp(f(S) − lse), 0 where masked / past S / in an empty row
//   dP = dO Vᵀ;  dS = P ∘ (dP − D) ∘ f'(S) [Br][Bc]
//   dV += Pᵀ dO;  dK += dSᵀ (scale·Q)      [Bc][d]    (the task owns these rows)
//   dQpart[chunk] += dS K                  [Br][dk]   (this chunk's own partial sums)
// then stores its dK and dV rows. f is the score modification, evaluated per entry with its
// derivatives (mod_with_derivatives); for a tensor T the mod loads that needs a gradient
// (spec.tensor_grads), P ∘ (dP − D) ∘ ∂f/∂T[at] is added into the task's own slot of T's partial
// sums at the coordinates `at` each load reads. Dropout is replayed from the forward's Philox
// counters (seed, batch, head, row, key): Pd = P ∘ Z (Z = keep / (1 − p)), dV = Pdᵀ dO and
// dS = (Pd ∘ dP − P ∘ D) ∘ f'(S) (D is unchanged: O is the dropped output). The driver adds the
// dQ partials of the chunks in chunk order, multiplied by the scale, and the slots in slot
// order: no atomics, the same sums in the same order for any thread count.
//
// Every matrix product is one register-blocked micro-kernel (gemm below): C[M][N] (+)= Σ_k
// A(m, k) · B[k][N], A read by broadcasts at any strides (so Pᵀ and dSᵀ need no transposes), B and
// C by whole vectors; M, N, K are compile-time constants, N a multiple of the lanes.
//
// bf16 storage on vdpbf16ps (config.dpbf16): k runs over pairs — A's broadcast and B's lanes each
// hold two bf16 — so every operand is laid out with its summed axis in pairs (FlashAttention's
// bf16 backward: q, k, v, dO as stored, P and dS rounded to bf16, the sums in f32):
//   S  = Q Kᵀ      A: Q's rows [Br][dk/2]          B: Kᵀ pairs of features [dk/2][Bc]
//   dP = dO Vᵀ     A: dO's rows [Br][dv/2]         B: Vᵀ pairs of features [dv/2][Bc]
//   dVᵀ += dOᵀ P   A: dO's pairs of rows [Br/2][dv] B: P's pairs of rows [Br/2][Bc]
//   dKᵀ += Qᵀ dS   A: Q's pairs of rows [Br/2][dk]  B: dS's pairs of rows [Br/2][Bc]
//   dQ += dS K     A: dS's rows [Br][Bc/2]         B: K's pairs of keys [Bc/2][dk]
// dK and dV are kept transposed ([d][Bc], so that P and dS pair rows, not columns), Q unscaled (S
// and dK are scaled as f32).
#include "cpu/kernels/attention_backward.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <qkv/codegen/cpu/tuning.hpp>
#include <qkv/ir/attention_graph.hpp>
#include <qkv/ir/error.hpp>

#include "cpu/kernels/attention_common.hpp"
#include "llvm/ir_util.hpp"
#include "llvm/mod_ir.hpp"
#include "llvm/philox_ir.hpp"
#include "llvm/vector_math.hpp"

namespace qkv::codegen::cpu {

BackwardConfig choose_backward_config(const AttentionSpec& spec, const HostTarget& host) {
  BackwardConfig c;
  c.base = choose_kernel_config(spec, host);
  const int lanes = c.base.lanes;
  // Accumulators mr·nr, nr operand vectors and a broadcast within the register file (16
  // registers with AVX2 / SSE, 32 with AVX-512).
  c.mr = lanes >= 16 ? 8 : 6;
  c.nr = lanes >= 16 ? 3 : 2;
  c.keys = std::max(64, lanes * 4);
  c.rows = 32;
  c.dkp = (spec.dk + lanes - 1) / lanes * lanes;
  c.dvp = (spec.dv + lanes - 1) / lanes * lanes;
  c.dpbf16 =
      spec.storage == DType::bf16 && bf16_dot_products(host, lanes) && spec.dk % lanes == 0 && spec.dv % lanes == 0;
  // Pairs: 4 rows × 4 vectors, so that the products' 64 keys (or 64 features) are one block of
  // columns — 8 × 3 left a one-vector remainder block: 497–503 GFLOP/s against 537–582 at
  // N = 2048 on Zen 5 (6 × 4, 5 × 4 and 8 × 2 in between).
  if (c.dpbf16) c.mr = c.nr = 4;
  return c;
}

namespace {

constexpr std::uint64_t kAlign = 64;

class BackwardEmitter {
 public:
  BackwardEmitter(llvm::Module& module, const AttentionSpec& spec, const BackwardConfig& config)
      : module_(module),
        b_(module.getContext()),
        spec_(spec),
        cfg_(config),
        lanes_(config.base.lanes),
        br_(config.rows),
        bc_(config.keys),
        dkp_(config.dkp),
        dvp_(config.dvp),
        mod_(effective_mod(spec)),
        grad_inputs_(grad_inputs(spec, mod_)),
        dmod_(mod_with_derivatives(mod_.expr, grad_inputs_)) {
    f32_ = b_.getFloatTy();
    i64_ = b_.getInt64Ty();
    ptr_ = b_.getPtrTy();
    vf_ = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(lanes_));
  }

  void emit(const std::string& name) {
    fn_ = declare_attention_function(module_, b_, cfg_.base, name, {ptr_, i64_, i64_, i64_});
    args_ = fn_->getArg(0);
    batch_ = fn_->getArg(1);
    kvh_ = fn_->getArg(2);
    chunk_ = fn_->getArg(3);
    llvm::Value* saved = flush_denormals(b_, cfg_.base);
    load_arguments();
    allocate();
    const ModAnalysis info = analyse_mod(mod_.expr, mod_.axes.query, mod_.axes.key);
    deps_ = info.deps;
    if (mod_.expr.keep >= 0 && (deps_[static_cast<std::size_t>(mod_.expr.keep)] & kDepScore))
      throw std::invalid_argument("codegen: a mask modification may not read the score");
    for (const ModTensor& t : mod_.tensors) (void)mod_element_type(b_, t.dtype);  // refuses what it cannot load

    llvm::Value* nkb = b_.CreateSDiv(b_.CreateAdd(len_k_, c64(bc_ - 1)), c64(bc_), "nkb");
    llvm::Value* kb0 = b_.CreateMul(chunk_, chunk_blocks_, "kb0");
    llvm::Value* kb1 = smin(b_.CreateAdd(kb0, chunk_blocks_), nkb);
    const std::int64_t group = spec_.hq / spec_.hkv;
    llvm::Value* nqb = b_.CreateSDiv(b_.CreateAdd(len_q_, c64(br_ - 1)), c64(br_), "nqb");
    ir::emit_loop(
        b_, kb0, kb1, 1,
        [&](llvm::Value* kb) {
          k0_ = b_.CreateMul(kb, c64(bc_), "k0");
          nk_ = smin(c64(bc_), b_.CreateSub(len_k_, k0_), "nk");
          pack_keys();
          zero(dkacc_, bc_ * dkp_);
          zero(dvacc_, bc_ * dvp_);
          ir::emit_loop(
              b_, c64(0), c64(group), 1,
              [&](llvm::Value* g) {
                head_ = b_.CreateAdd(b_.CreateMul(kvh_, c64(group)), g, "head");
                bh_ = b_.CreateAdd(b_.CreateMul(batch_, c64(spec_.hq)), head_, "bh");
                ir::emit_loop(b_, c64(0), nqb, 1, [&](llvm::Value* qb) { query_block(qb); }, "bwd.qblocks");
              },
              "bwd.group");
          store_key_grads();
        },
        "bwd.kblocks");
    restore_denormals(b_, saved);
    b_.CreateRetVoid();
  }

 private:
  /// The effective mod's load inputs of spec.tensor_grads (spec.tensors follow the flags' tensors).
  static std::vector<int> grad_inputs(const AttentionSpec& spec, const EffectiveMod& mod) {
    const auto base = static_cast<int>(mod.tensors.size() - spec.tensors.size());
    std::vector<int> out;
    for (const auto& t : spec.tensor_grads) out.push_back(base + t.tensor);
    return out;
  }

  // --- helpers
  llvm::Value* c64(std::int64_t v) { return b_.getInt64(static_cast<std::uint64_t>(v)); }
  llvm::IntegerType* i32() { return b_.getInt32Ty(); }
  llvm::Value* vconst(double v) { return llvm::ConstantFP::get(vf_, v); }
  llvm::Value* splat(llvm::Value* s) { return b_.CreateVectorSplat(static_cast<unsigned>(lanes_), s); }
  llvm::Value* smin(llvm::Value* a, llvm::Value* x, const llvm::Twine& name = "") {
    return b_.CreateIntrinsic(llvm::Intrinsic::smin, {a->getType()}, {a, x}, nullptr, name);
  }
  llvm::Value* fma(llvm::Value* a, llvm::Value* x, llvm::Value* c) {
    return b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {a->getType()}, {a, x, c});
  }
  llvm::Value* at(llvm::Value* base, llvm::Value* index) { return b_.CreateInBoundsGEP(f32_, base, index); }
  llvm::Value* at(llvm::Value* base, std::int64_t index) { return at(base, c64(index)); }
  llvm::Value* at16(llvm::Value* base, llvm::Value* index) {
    return b_.CreateInBoundsGEP(b_.getInt16Ty(), base, index);
  }
  llvm::Value* at32(llvm::Value* base, llvm::Value* index) { return b_.CreateInBoundsGEP(i32(), base, index); }
  llvm::Value* load_vec(llvm::Value* p) { return b_.CreateAlignedLoad(vf_, p, llvm::Align(4)); }
  /// Element `index` of q, k, v or dO as f32 (bf16 storage widened), and an f32 stored into dK or
  /// dV as the spec stores them (rounded to bf16).
  llvm::Value* load_stored(llvm::Value* base, llvm::Value* index) {
    if (spec_.storage != DType::bf16) return b_.CreateLoad(f32_, at(base, index));
    llvm::Type* i16 = b_.getInt16Ty();
    return ir::half_to_f32(b_, b_.CreateLoad(i16, b_.CreateInBoundsGEP(i16, base, index)), true);
  }
  void store_stored(llvm::Value* f, llvm::Value* base, llvm::Value* index) {
    if (spec_.storage != DType::bf16) {
      b_.CreateStore(f, at(base, index));
      return;
    }
    b_.CreateStore(ir::f32_to_half(b_, f, true), b_.CreateInBoundsGEP(b_.getInt16Ty(), base, index));
  }
  void store_vec(llvm::Value* v, llvm::Value* p) { b_.CreateAlignedStore(v, p, llvm::Align(4)); }
  void zero(llvm::Value* buffer, std::int64_t floats) {
    b_.CreateMemSet(buffer, b_.getInt8(0), static_cast<std::uint64_t>(floats * 4), llvm::MaybeAlign(kAlign));
  }
  llvm::Value* field(std::size_t offset, llvm::Type* t, const char* name) {
    return load_args_field(b_, args_, offset, t, name);
  }

  void load_arguments() {
    constexpr std::size_t fwd = offsetof(AttentionBackwardArgs, forward);
    q_ = field(fwd + offsetof(AttentionArgs, q), ptr_, "q");
    k_ = field(fwd + offsetof(AttentionArgs, k), ptr_, "k");
    v_ = field(fwd + offsetof(AttentionArgs, v), ptr_, "v");
    lse_ = field(fwd + offsetof(AttentionArgs, lse), ptr_, "lse");
    len_q_ = field(fwd + offsetof(AttentionArgs, len_q), i64_, "L");
    len_k_ = field(fwd + offsetof(AttentionArgs, len_k), i64_, "S");
    nbatch_ = field(fwd + offsetof(AttentionArgs, batch), i64_, "B");
    dout_ = field(offsetof(AttentionBackwardArgs, d_out), ptr_, "d_out");
    dk_out_ = field(offsetof(AttentionBackwardArgs, dk), ptr_, "dk");
    dv_out_ = field(offsetof(AttentionBackwardArgs, dv), ptr_, "dv");
    delta_ = field(offsetof(AttentionBackwardArgs, delta), ptr_, "delta");
    dq_part_ = field(offsetof(AttentionBackwardArgs, dq_partial), ptr_, "dq_partial");
    chunk_blocks_ = field(offsetof(AttentionBackwardArgs, chunk_blocks), i64_, "chunk_blocks");
    padded_rows_ = field(offsetof(AttentionBackwardArgs, padded_rows), i64_, "padded_rows");
    tensors_ = load_mod_tensors(b_, args_, mod_.tensors, nbatch_, len_q_, len_k_);
    if (spec_.dropout_p > 0) seed_ = field(fwd + offsetof(AttentionArgs, seed), i64_, "seed");
    // Each differentiated tensor's slot of partial sums for this task.
    llvm::Value* chunks = field(offsetof(AttentionBackwardArgs, chunks), i64_, "chunks");
    llvm::Value* partials = field(offsetof(AttentionBackwardArgs, tensor_partials), ptr_, "tensor_partials");
    for (std::size_t t = 0; t < spec_.tensor_grads.size(); ++t) {
      const AttentionSpec::TensorGrad& tg = spec_.tensor_grads[t];
      const ModTensorIn& in = tensors_.at(static_cast<std::size_t>(grad_inputs_[t]));
      llvm::Value* slot = tg.per_batch ? batch_ : c64(0);
      if (tg.per_kv_head) slot = b_.CreateAdd(b_.CreateMul(slot, c64(spec_.hkv)), kvh_);
      if (tg.per_chunk) slot = b_.CreateAdd(b_.CreateMul(slot, chunks), chunk_);
      llvm::Value* numel = c64(1);
      for (llvm::Value* e : in.extent) numel = b_.CreateMul(numel, e);
      llvm::Value* buffer = b_.CreateLoad(ptr_, b_.CreateConstInBoundsGEP1_64(ptr_, partials, t), "partial");
      grad_slot_.push_back(at(buffer, b_.CreateMul(slot, numel)));
    }
    len_qf_ = b_.CreateSIToFP(len_q_, f32_, "Lf");
    len_kf_ = b_.CreateSIToFP(len_k_, f32_, "Sf");
    batchf_ = b_.CreateSIToFP(batch_, f32_, "bf");
    // The first row of this (batch, kv head)'s keys.
    kv_row0_ = b_.CreateMul(b_.CreateAdd(b_.CreateMul(batch_, c64(spec_.hkv)), kvh_), len_k_, "kv_row0");
  }

  void allocate() {
    auto buf = [&](std::int64_t floats, const char* name) {
      return ir::entry_alloca(b_, f32_, static_cast<std::uint64_t>(floats), kAlign, name);
    };
    // With dpbf16 these hold bf16 pairs, 32 bits each: kt_ [dk/2][Bc], kr_ [Bc/2][dk], vt_ [dv/2][Bc],
    // qb_ Q's rows [Br][dk/2] and qp_ their pairs [Br/2][dk], dob_ / dop_ likewise for dO, pp_ P's
    // (P ∘ Z's) pairs of rows and dsp_ dS's [Br/2][Bc], dsr_ dS's rows [Br][Bc/2] (half the floats).
    kt_ = buf(dkp_ * bc_, "kt");
    kr_ = buf(bc_ * dkp_, "kr");
    vt_ = buf(dvp_ * bc_, "vt");
    dkacc_ = buf(bc_ * dkp_, "dk_acc");
    dvacc_ = buf(bc_ * dvp_, "dv_acc");
    qb_ = buf(br_ * dkp_, "qb");
    dob_ = buf(br_ * dvp_, "dob");
    if (cfg_.dpbf16) {
      qp_ = buf(br_ * dkp_ / 2, "q_pairs");
      dop_ = buf(br_ * dvp_ / 2, "do_pairs");
      pp_ = buf(br_ * bc_ / 2, "p_pairs");
      dsp_ = buf(br_ * bc_ / 2, "ds_pairs");
      dsr_ = buf(br_ * bc_ / 2, "ds_rows");
    }
    p_ = buf(br_ * bc_, "p");
    s_ = buf(br_ * bc_, "s");
    if (mod_.expr.score >= 0) dm_ = buf(br_ * bc_, "dmod");
    if (spec_.dropout_p > 0) pd_ = buf(br_ * bc_, "p_dropped");
    for (std::size_t i = 0; i < dmod_.loads.size(); ++i) dl_.push_back(buf(br_ * bc_, "dload"));
    lseb_ = buf(br_, "lse_b");
    deltab_ = buf(br_, "delta_b");
  }

  /// Kᵀ, K and Vᵀ of the key block [k0, k0 + nk), zero elsewhere.
  void pack_keys() {
    if (cfg_.dpbf16) return pack_key_pairs();
    zero(kt_, dkp_ * bc_);
    zero(kr_, bc_ * dkp_);
    zero(vt_, dvp_ * bc_);
    ir::emit_loop(
        b_, c64(0), nk_, 1,
        [&](llvm::Value* j) {
          llvm::Value* row = b_.CreateAdd(kv_row0_, b_.CreateAdd(k0_, j));
          ir::emit_loop(
              b_, c64(0), c64(spec_.dk), 1,
              [&](llvm::Value* d) {
                llvm::Value* x = load_stored(k_, b_.CreateAdd(b_.CreateMul(row, c64(spec_.dk)), d));
                b_.CreateStore(x, at(kr_, b_.CreateAdd(b_.CreateMul(j, c64(dkp_)), d)));
                b_.CreateStore(x, at(kt_, b_.CreateAdd(b_.CreateMul(d, c64(bc_)), j)));
              },
              "pack.k", ir::Unroll::allowed);
          ir::emit_loop(
              b_, c64(0), c64(spec_.dv), 1,
              [&](llvm::Value* d) {
                llvm::Value* x = load_stored(v_, b_.CreateAdd(b_.CreateMul(row, c64(spec_.dv)), d));
                b_.CreateStore(x, at(vt_, b_.CreateAdd(b_.CreateMul(d, c64(bc_)), j)));
              },
              "pack.v", ir::Unroll::allowed);
        },
        "pack.keys");
  }

  /// dpbf16: Kᵀ's and Vᵀ's pairs of features (a key's pairs as stored, one column each) and K's
  /// pairs of keys (two rows interleaved), zero past the block's keys.
  void pack_key_pairs() {
    zero(kt_, dkp_ * bc_);
    zero(vt_, dvp_ * bc_);
    auto columns = [&](llvm::Value* from, llvm::Value* to, std::int64_t width, const char* name) {
      ir::emit_loop(
          b_, c64(0), nk_, 1,
          [&](llvm::Value* j) {
            llvm::Value* row = b_.CreateMul(b_.CreateAdd(kv_row0_, b_.CreateAdd(k0_, j)), c64(width));
            for (std::int64_t p = 0; p < width / 2; ++p) {
              llvm::Value* pair =
                  b_.CreateAlignedLoad(i32(), at16(from, b_.CreateAdd(row, c64(2 * p))), llvm::Align(2));
              b_.CreateStore(pair, at32(to, b_.CreateAdd(c64(p * bc_), j)));
            }
          },
          name);
    };
    columns(k_, kt_, spec_.dk, "pack.kt");
    columns(v_, vt_, spec_.dv, "pack.vt");
    interleave_rows(k_, kv_row0_, k0_, nk_, spec_.dk, kr_, bc_ / 2, "pack.kr");
  }

  /// to[t][d] = the bf16 pair (x[r0 + 2t][d], x[r0 + 2t + 1][d]) of the rows of `from` (bf16,
  /// `width` a row) from first + r0 on, for t < `pairs`; a row at or past r0 + n reads as zero.
  void interleave_rows(llvm::Value* from, llvm::Value* first, llvm::Value* r0, llvm::Value* n, std::int64_t width,
                       llvm::Value* to, std::int64_t pairs, const char* name) {
    auto* half = llvm::FixedVectorType::get(b_.getInt16Ty(), static_cast<unsigned>(lanes_));
    ir::emit_loop(
        b_, c64(0), c64(pairs), 1,
        [&](llvm::Value* t) {
          llvm::Value* r = b_.CreateMul(t, c64(2));
          llvm::Value* rows[2];
          llvm::Value* real[2];
          for (int i = 0; i < 2; ++i) {
            llvm::Value* ri = b_.CreateAdd(r, c64(i));
            real[i] = b_.CreateICmpSLT(ri, n);
            // A row past n is read as the last real one (in bounds) and then replaced by zeros.
            llvm::Value* row = b_.CreateAdd(first, b_.CreateAdd(r0, smin(ri, b_.CreateSub(n, c64(1)))));
            rows[i] = b_.CreateMul(row, c64(width));
          }
          for (std::int64_t c = 0; c < width; c += lanes_) {
            llvm::Value* x[2];
            for (int i = 0; i < 2; ++i) {
              llvm::Value* v = b_.CreateAlignedLoad(half, at16(from, b_.CreateAdd(rows[i], c64(c))), llvm::Align(2));
              x[i] = b_.CreateSelect(real[i], v, llvm::Constant::getNullValue(half));
            }
            llvm::Value* pair = b_.CreateShuffleVector(x[0], x[1], ir::interleave_halves(lanes_));
            b_.CreateAlignedStore(pair, at32(to, b_.CreateAdd(b_.CreateMul(t, c64(width)), c64(c))), llvm::Align(4));
          }
        },
        name);
  }

  /// The task's dK and dV rows as the spec stores them: the accumulators are [Bc][d] (row stride
  /// the padded width), or with dpbf16 transposed, [d][Bc], dK's scale not yet applied.
  void store_key_grads() {
    auto store = [&](llvm::Value* acc, llvm::Value* out, std::int64_t width, std::int64_t padded, double scale,
                     const char* name) {
      const std::int64_t key_stride = cfg_.dpbf16 ? 1 : padded, dim_stride = cfg_.dpbf16 ? bc_ : 1;
      ir::emit_loop(
          b_, c64(0), nk_, 1,
          [&](llvm::Value* j) {
            llvm::Value* row = b_.CreateAdd(kv_row0_, b_.CreateAdd(k0_, j));
            ir::emit_loop(
                b_, c64(0), c64(width), 1,
                [&](llvm::Value* d) {
                  llvm::Value* x = b_.CreateLoad(
                      f32_, at(acc, b_.CreateAdd(b_.CreateMul(j, c64(key_stride)), b_.CreateMul(d, c64(dim_stride)))));
                  if (scale != 1.0) x = b_.CreateFMul(x, llvm::ConstantFP::get(f32_, scale));
                  store_stored(x, out, b_.CreateAdd(b_.CreateMul(row, c64(width)), d));
                },
                name, ir::Unroll::allowed);
          },
          name);
    };
    store(dkacc_, dk_out_, spec_.dk, dkp_, cfg_.dpbf16 ? spec_.effective_scale() : 1.0, "store.dk");
    store(dvacc_, dv_out_, spec_.dv, dvp_, 1.0, "store.dv");
  }

  /// (scale·Q), dO, lse and D of the rows [q0, q0 + nq) of head bh; zero / +inf past them.
  void pack_queries(llvm::Value* q0, llvm::Value* nq) {
    llvm::Value* row0 = b_.CreateAdd(b_.CreateMul(bh_, len_q_), q0, "row0");
    if (cfg_.dpbf16) {  // Q (unscaled) and dO as stored, as rows and as pairs of rows
      auto* half = llvm::FixedVectorType::get(b_.getInt16Ty(), static_cast<unsigned>(lanes_));
      auto rows = [&](llvm::Value* from, llvm::Value* to, std::int64_t width, const char* name) {
        zero(to, br_ * width / 2);
        ir::emit_loop(
            b_, c64(0), nq, 1,
            [&](llvm::Value* r) {
              llvm::Value* src = b_.CreateMul(b_.CreateAdd(row0, r), c64(width));
              for (std::int64_t c = 0; c < width; c += lanes_) {
                llvm::Value* x = b_.CreateAlignedLoad(half, at16(from, b_.CreateAdd(src, c64(c))), llvm::Align(2));
                b_.CreateAlignedStore(x, at16(to, b_.CreateAdd(b_.CreateMul(r, c64(width)), c64(c))), llvm::Align(2));
              }
            },
            name);
      };
      llvm::Value* head_row0 = b_.CreateMul(bh_, len_q_);  // (dpbf16: the widths are whole vectors)
      rows(q_, qb_, spec_.dk, "pack.q");
      rows(dout_, dob_, spec_.dv, "pack.do");
      interleave_rows(q_, head_row0, q0, nq, spec_.dk, qp_, br_ / 2, "pack.qp");
      interleave_rows(dout_, head_row0, q0, nq, spec_.dv, dop_, br_ / 2, "pack.dop");
    } else {
      pack_query_floats(row0, nq);
    }
    pack_stats(row0, nq);
  }

  /// (scale·Q) and dO as f32 rows, zero past nq.
  void pack_query_floats(llvm::Value* row0, llvm::Value* nq) {
    zero(qb_, br_ * dkp_);
    zero(dob_, br_ * dvp_);
    llvm::Value* scale = llvm::ConstantFP::get(f32_, spec_.effective_scale());
    ir::emit_loop(
        b_, c64(0), nq, 1,
        [&](llvm::Value* r) {
          llvm::Value* row = b_.CreateAdd(row0, r);
          ir::emit_loop(
              b_, c64(0), c64(spec_.dk), 1,
              [&](llvm::Value* d) {
                llvm::Value* x = load_stored(q_, b_.CreateAdd(b_.CreateMul(row, c64(spec_.dk)), d));
                b_.CreateStore(b_.CreateFMul(x, scale), at(qb_, b_.CreateAdd(b_.CreateMul(r, c64(dkp_)), d)));
              },
              "pack.q", ir::Unroll::allowed);
          ir::emit_loop(
              b_, c64(0), c64(spec_.dv), 1,
              [&](llvm::Value* d) {
                llvm::Value* x = load_stored(dout_, b_.CreateAdd(b_.CreateMul(row, c64(spec_.dv)), d));
                b_.CreateStore(x, at(dob_, b_.CreateAdd(b_.CreateMul(r, c64(dvp_)), d)));
              },
              "pack.do", ir::Unroll::allowed);
        },
        "pack.rows");
  }

  /// lse and D of the rows, +inf / 0 past nq.
  void pack_stats(llvm::Value* row0, llvm::Value* nq) {
    const double inf = std::numeric_limits<double>::infinity();
    ir::emit_loop(
        b_, c64(0), c64(br_), 1,
        [&](llvm::Value* r) {
          llvm::Value* valid = b_.CreateICmpSLT(r, nq);
          llvm::Value* row = b_.CreateAdd(row0, smin(r, b_.CreateSub(nq, c64(1))));
          llvm::Value* l = b_.CreateLoad(f32_, at(lse_, row));
          // lse = −inf (a row that sees no key) and rows past L: +inf, so that exp(s − lse) = 0.
          llvm::Value* usable = b_.CreateAnd(valid, b_.CreateFCmpONE(l, llvm::ConstantFP::get(f32_, -inf)));
          b_.CreateStore(b_.CreateSelect(usable, l, llvm::ConstantFP::get(f32_, inf)), at(lseb_, r));
          llvm::Value* dl = b_.CreateLoad(f32_, at(delta_, row));
          b_.CreateStore(b_.CreateSelect(valid, dl, llvm::ConstantFP::get(f32_, 0.0)), at(deltab_, r));
        },
        "pack.stats", ir::Unroll::allowed);
  }

  /// C[M][N] (+)= Σ_{k<K} A[m·sam + k·sak] · B[k·ldb + n]; N a multiple of the lanes. `pairs`: A and
  /// B hold bf16 pairs (32 bits an element, strides in pairs) multiplied on vdpbf16ps.
  void gemm(llvm::Value* c, std::int64_t ldc, llvm::Value* a, std::int64_t sam, std::int64_t sak, llvm::Value* bm,
            std::int64_t ldb, std::int64_t m_total, std::int64_t n_total, std::int64_t k_total, bool accumulate,
            const char* name, bool pairs = false) {
    llvm::Type* elem = pairs ? static_cast<llvm::Type*>(i32()) : f32_;
    auto* vec = llvm::FixedVectorType::get(elem, static_cast<unsigned>(lanes_));
    auto ab = [&](llvm::Value* base, llvm::Value* index) { return b_.CreateInBoundsGEP(elem, base, index); };
    const std::int64_t nv = n_total / lanes_;
    auto block = [&](llvm::Value* m0, int mr, std::int64_t v0, int nr) {
      std::vector<llvm::Value*> acc;
      for (int i = 0; i < mr; ++i)
        for (int j = 0; j < nr; ++j) {
          llvm::Value* p =
              at(c, b_.CreateAdd(b_.CreateMul(b_.CreateAdd(m0, c64(i)), c64(ldc)), c64((v0 + j) * lanes_)));
          acc.push_back(accumulate ? load_vec(p) : vconst(0.0));
        }
      acc = ir::emit_loop(
          b_, c64(0), c64(k_total), 1, acc,
          [&](llvm::Value* k, const std::vector<llvm::Value*>& cur) {
            std::vector<llvm::Value*> next = cur;
            std::vector<llvm::Value*> bv;
            llvm::Value* brow = b_.CreateMul(k, c64(ldb));
            for (int j = 0; j < nr; ++j)
              bv.push_back(
                  b_.CreateAlignedLoad(vec, ab(bm, b_.CreateAdd(brow, c64((v0 + j) * lanes_))), llvm::Align(4)));
            llvm::Value* ak = b_.CreateMul(k, c64(sak));
            for (int i = 0; i < mr; ++i) {
              llvm::Value* ai =
                  b_.CreateLoad(elem, ab(a, b_.CreateAdd(b_.CreateMul(b_.CreateAdd(m0, c64(i)), c64(sam)), ak)));
              llvm::Value* as = b_.CreateVectorSplat(static_cast<unsigned>(lanes_), ai);
              for (int j = 0; j < nr; ++j) {
                llvm::Value* acc_ij = cur[static_cast<std::size_t>(i * nr + j)];
                next[static_cast<std::size_t>(i * nr + j)] =
                    pairs ? ir::dot_bf16_pairs(b_, acc_ij, as, bv[j]) : fma(as, bv[j], acc_ij);
              }
            }
            return next;
          },
          name, ir::Unroll::allowed);
      for (int i = 0; i < mr; ++i)
        for (int j = 0; j < nr; ++j)
          store_vec(acc[static_cast<std::size_t>(i * nr + j)],
                    at(c, b_.CreateAdd(b_.CreateMul(b_.CreateAdd(m0, c64(i)), c64(ldc)), c64((v0 + j) * lanes_))));
    };
    auto row_blocks = [&](llvm::Value* m0, int mr) {
      for (std::int64_t v0 = 0; v0 < nv; v0 += cfg_.nr)
        block(m0, mr, v0, static_cast<int>(std::min<std::int64_t>(cfg_.nr, nv - v0)));
    };
    const std::int64_t full = m_total / cfg_.mr * cfg_.mr;
    if (full > 0)
      ir::emit_loop(b_, c64(0), c64(full), cfg_.mr, [&](llvm::Value* m0) { row_blocks(m0, cfg_.mr); }, name);
    if (m_total > full) row_blocks(c64(full), static_cast<int>(m_total - full));
  }

  /// The leaves of an entry: row `row` (f32), the keys of vector `keys` (f32) and their raw
  /// scores `score` (scale · q·k; null for the keep predicate, which may not read it).
  class Leaves final : public ModLeaves {
   public:
    Leaves(BackwardEmitter& e, llvm::Value* row, llvm::Value* keys, llvm::Value* score)
        : e_(e), row_(row), keys_(keys), score_(score) {}
    llvm::Value* score() override {
      if (!score_) internal_error("attention backward: a mask that reads the score");
      return score_;
    }
    llvm::Value* index(const std::string& axis) override { return value(axis, false); }
    llvm::Value* position(const std::string& axis) override { return value(axis, true); }
    llvm::Value* length(const std::string& axis) override {
      return mod_axis_length(e_.b_, e_.mod_.axes, axis, e_.len_qf_, e_.len_kf_, e_.nbatch_);
    }
    llvm::Value* load(const ModNode& n, const std::vector<llvm::Value*>& idx) override {
      return load_mod_element(e_.b_, e_.tensors_.at(static_cast<std::size_t>(n.input)),
                              e_.mod_.tensors.at(static_cast<std::size_t>(n.input)).dtype, idx, e_.lanes_);
    }
    llvm::Value* extent(const ModNode& n, std::size_t d) override {
      return e_.tensors_.at(static_cast<std::size_t>(n.input)).extent_f32.at(d);
    }

   private:
    llvm::Value* value(const std::string& axis, bool position) {
      const ModAxes& a = e_.mod_.axes;
      if (axis == a.query) {
        if (position && e_.mod_.expr.shifts(axis))
          return e_.b_.CreateFAdd(row_, e_.b_.CreateFSub(e_.len_kf_, e_.len_qf_));
        return row_;
      }
      if (axis == a.key) return keys_;
      return e_.point(axis);
    }
    BackwardEmitter& e_;
    llvm::Value* row_;
    llvm::Value* keys_;
    llvm::Value* score_;
  };

  llvm::Value* point(const std::string& axis) {
    if (axis == mod_.axes.batch) return batchf_;
    if (llvm::Value* c = mod_head_coordinate(b_, mod_.axes, axis, head_)) return c;
    internal_error("attention backward: a mod names the axis `" + axis + "`, which the scores do not have");
  }

  void query_block(llvm::Value* qb) {
    llvm::Value* q0 = b_.CreateMul(qb, c64(br_), "q0");
    llvm::Value* nq = smin(c64(br_), b_.CreateSub(len_q_, q0), "nq");
    llvm::Value* all = b_.getTrue();
    llvm::Value* none = b_.getFalse();
    if (mod_.expr.keep >= 0) {
      const TileSpan span{q0, b_.CreateAdd(q0, nq), k0_, b_.CreateAdd(k0_, nk_), len_qf_, len_kf_};
      AttentionBoundsLeaves leaves(
          b_, mod_, deps_, tensors_, span, [&](const std::string& axis, bool) { return point(axis); },
          [&](const std::string& axis) { return mod_axis_length(b_, mod_.axes, axis, len_qf_, len_kf_, nbatch_); },
          [&](const ModNode& n, const std::vector<llvm::Value*>& idx) {
            return load_mod_element(b_, tensors_.at(static_cast<std::size_t>(n.input)),
                                    mod_.tensors.at(static_cast<std::size_t>(n.input)).dtype, idx, lanes_);
          });
      std::tie(all, none) = emit_mod_classify(b_, mod_.expr, leaves);
    }
    llvm::LLVMContext& ctx = module_.getContext();
    llvm::BasicBlock* work = llvm::BasicBlock::Create(ctx, "bwd.work", fn_);
    llvm::BasicBlock* done = llvm::BasicBlock::Create(ctx, "bwd.skip", fn_);
    b_.CreateCondBr(none, done, work);
    b_.SetInsertPoint(work);

    pack_queries(q0, nq);
    const bool pairs = cfg_.dpbf16;
    const std::int64_t per = pairs ? 2 : 1;  // entries of the summed axis per element
    // S = (scale·Q) Kᵀ (dpbf16: Q Kᵀ, scaled as P is computed)
    gemm(s_, bc_, qb_, dkp_ / per, 1, kt_, bc_, br_, bc_, dkp_ / per, false, "gemm.s", pairs);
    // P = exp(S − lse), masked where the tile is not wholly kept or runs past S.
    llvm::Value* masked = b_.CreateOr(b_.CreateNot(all), b_.CreateICmpSLT(nk_, c64(bc_)));
    llvm::BasicBlock* with_mask = llvm::BasicBlock::Create(ctx, "p.masked", fn_);
    llvm::BasicBlock* plain = llvm::BasicBlock::Create(ctx, "p.plain", fn_);
    llvm::BasicBlock* p_done = llvm::BasicBlock::Create(ctx, "p.done", fn_);
    b_.CreateCondBr(masked, with_mask, plain);
    b_.SetInsertPoint(with_mask);
    probabilities(q0, true);
    b_.CreateBr(p_done);
    b_.SetInsertPoint(plain);
    probabilities(q0, false);
    b_.CreateBr(p_done);
    b_.SetInsertPoint(p_done);
    // dP = dO Vᵀ (into s_), then dS = P ∘ (dP − D) in place.
    gemm(s_, bc_, dob_, dvp_ / per, 1, vt_, bc_, br_, bc_, dvp_ / per, false, "gemm.dp", pairs);
    ir::emit_loop(
        b_, c64(0), c64(br_), 1,
        [&](llvm::Value* r) {
          llvm::Value* dl = splat(b_.CreateLoad(f32_, at(deltab_, r)));
          llvm::Value* rowf = b_.CreateSIToFP(b_.CreateAdd(q0, r), f32_);
          for (std::int64_t v = 0; v < bc_ / lanes_; ++v) {
            llvm::Value* off = b_.CreateAdd(b_.CreateMul(r, c64(bc_)), c64(v * lanes_));
            llvm::Value* p = load_vec(at(p_, off));
            llvm::Value* dp = load_vec(at(s_, off));
            // By the modified score: P ∘ (dP − D), or Pd ∘ dP − P ∘ D with dropout.
            llvm::Value* ds = pd_ ? b_.CreateFSub(b_.CreateFMul(load_vec(at(pd_, off)), dp), b_.CreateFMul(p, dl))
                                  : b_.CreateFMul(p, b_.CreateFSub(dp, dl));
            if (!dmod_.loads.empty()) scatter_tensor_grads(rowf, v, off, ds);
            if (dm_) ds = b_.CreateFMul(ds, load_vec(at(dm_, off)));
            store_vec(ds, at(s_, off));
          }
        },
        "ds");
    llvm::Value* part_row = b_.CreateAdd(
        b_.CreateMul(b_.CreateAdd(b_.CreateMul(chunk_, b_.CreateMul(nbatch_, c64(spec_.hq))), bh_), padded_rows_), q0);
    llvm::Value* dq = at(dq_part_, b_.CreateMul(part_row, c64(dkp_)));
    if (pairs) {
      round_pairs();
      // dVᵀ += dOᵀ (P ∘ Z);  dKᵀ += Qᵀ dS;  dQpart[chunk][bh][q0..] += dS K
      gemm(dvacc_, bc_, dop_, 1, dvp_, pp_, bc_, dvp_, bc_, br_ / 2, true, "gemm.dv", true);
      gemm(dkacc_, bc_, qp_, 1, dkp_, dsp_, bc_, dkp_, bc_, br_ / 2, true, "gemm.dk", true);
      gemm(dq, dkp_, dsr_, bc_ / 2, 1, kr_, dkp_, br_, dkp_, bc_ / 2, true, "gemm.dq", true);
    } else {
      // dV += Pᵀ dO;  dK += dSᵀ (scale·Q);  dQpart[chunk][bh][q0..] += dS K
      gemm(dvacc_, dvp_, pd_ ? pd_ : p_, 1, bc_, dob_, dvp_, bc_, dvp_, br_, true, "gemm.dv");
      gemm(dkacc_, dkp_, s_, 1, bc_, qb_, dkp_, bc_, dkp_, br_, true, "gemm.dk");
      gemm(dq, dkp_, s_, bc_, 1, kr_, dkp_, br_, dkp_, bc_, true, "gemm.dq");
    }
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }

  /// dpbf16: P ∘ Z (or P) and dS (in s_) rounded to bf16 — P's and dS's pairs of rows, dS's rows.
  void round_pairs() {
    llvm::Value* p = pd_ ? pd_ : p_;
    ir::emit_loop(
        b_, c64(0), c64(br_ / 2), 1,
        [&](llvm::Value* t) {
          llvm::Value* r = b_.CreateMul(t, c64(2));
          for (std::int64_t v = 0; v < bc_ / lanes_; ++v) {
            llvm::Value* off0 = b_.CreateAdd(b_.CreateMul(r, c64(bc_)), c64(v * lanes_));
            llvm::Value* off1 = b_.CreateAdd(off0, c64(bc_));
            llvm::Value* pair = b_.CreateAdd(b_.CreateMul(t, c64(bc_)), c64(v * lanes_));
            store_vec(ir::bf16_pairs(b_, load_vec(at(p, off0)), load_vec(at(p, off1))), at(pp_, pair));
            store_vec(ir::bf16_pairs(b_, load_vec(at(s_, off0)), load_vec(at(s_, off1))), at(dsp_, pair));
          }
          // dS's rows: two vectors of keys rounded into one of pairs, in order (no interleave).
          for (std::int64_t i = 0; i < 2; ++i)
            for (std::int64_t v = 0; v < bc_ / lanes_; v += 2) {
              llvm::Value* off = b_.CreateAdd(b_.CreateMul(b_.CreateAdd(r, c64(i)), c64(bc_)), c64(v * lanes_));
              llvm::Value* both =
                  ir::bf16_concat(b_, load_vec(at(s_, off)), load_vec(at(s_, b_.CreateAdd(off, c64(lanes_)))));
              llvm::Value* dst = b_.CreateAdd(b_.CreateMul(b_.CreateAdd(r, c64(i)), c64(bc_ / 2)), c64(v * lanes_ / 2));
              store_vec(both, at(dsr_, dst));
            }
        },
        "round.pairs");
  }

  /// The keys of vector v of the block, as i64 lanes.
  llvm::Value* key_lanes(std::int64_t v) {
    std::vector<llvm::Constant*> iota;
    for (int l = 0; l < lanes_; ++l) iota.push_back(b_.getInt64(static_cast<std::uint64_t>(l)));
    return b_.CreateAdd(splat(b_.CreateAdd(k0_, c64(v * lanes_))), llvm::ConstantVector::get(iota));
  }

  /// Adds ds ∘ ∂f/∂load (dl_, from probabilities) into each differentiated load's element of this
  /// task's slot, at the coordinates the load reads for row `rowf` and key vector v: one scalar
  /// add of the lanes' sum when the coordinates do not vary over the keys, else lane by lane.
  void scatter_tensor_grads(llvm::Value* rowf, std::int64_t v, llvm::Value* off, llvm::Value* ds) {
    const ModExpr& e = dmod_.expr;
    Leaves leaves(*this, rowf, b_.CreateSIToFP(key_lanes(v), vf_), nullptr);
    std::vector<llvm::Value*> cache(e.nodes.size(), nullptr);
    for (std::size_t i = 0; i < dmod_.loads.size(); ++i) {
      const ModNode& load = e.nodes[static_cast<std::size_t>(dmod_.loads[i].load)];
      const auto t = static_cast<std::size_t>(std::find(grad_inputs_.begin(), grad_inputs_.end(), load.input) -
                                              grad_inputs_.begin());
      const ModTensorIn& in = tensors_.at(static_cast<std::size_t>(load.input));
      llvm::Value* g = b_.CreateFMul(ds, load_vec(at(dl_[i], off)));
      std::vector<llvm::Value*> coords;  // clamped as the load clamps them
      for (std::size_t d = 0; d < load.at.size(); ++d)
        coords.push_back(mod_clamp_index(b_, emit_mod(b_, e, load.at[d], leaves, cache), in.extent_f32.at(d)));
      llvm::Value* index = mod_element_offset(b_, in, coords, lanes_);
      auto add = [&](llvm::Value* j, llvm::Value* value) {
        llvm::Value* p = at(grad_slot_[t], j);
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(f32_, p), value), p);
      };
      if (!index->getType()->isVectorTy()) {
        add(index, b_.CreateFAddReduce(llvm::ConstantFP::get(f32_, 0.0), g));
        continue;
      }
      for (int l = 0; l < lanes_; ++l)
        add(b_.CreateExtractElement(index, static_cast<std::uint64_t>(l)),
            b_.CreateExtractElement(g, static_cast<std::uint64_t>(l)));
    }
  }

  /// p_[r][j] = exp(f(s_[r][j]) − lse[r]) (0 where the mask or the key range excludes the
  /// entry) and, with a score modification, dm_[r][j] = f'(s_[r][j]) (0 where p is masked).
  void probabilities(llvm::Value* q0, bool masked) {
    const ModExpr& e = dmod_.expr;
    auto vec = [&](llvm::Value* x) { return x->getType()->isVectorTy() ? x : splat(x); };
    ir::emit_loop(
        b_, c64(0), c64(br_), 1,
        [&](llvm::Value* r) {
          llvm::Value* l = splat(b_.CreateLoad(f32_, at(lseb_, r)));
          llvm::Value* rowf = b_.CreateSIToFP(b_.CreateAdd(q0, r), f32_);
          for (std::int64_t v = 0; v < bc_ / lanes_; ++v) {
            llvm::Value* off = b_.CreateAdd(b_.CreateMul(r, c64(bc_)), c64(v * lanes_));
            llvm::Value* s = load_vec(at(s_, off));
            if (cfg_.dpbf16) s = b_.CreateFMul(s, vconst(spec_.effective_scale()));
            llvm::Value* keys = key_lanes(v);
            Leaves leaves(*this, rowf, b_.CreateSIToFP(keys, vf_), s);
            std::vector<llvm::Value*> cache(e.nodes.size(), nullptr);
            llvm::Value* d = nullptr;
            std::vector<llvm::Value*> dload;  // ∂f/∂load per differentiated load
            if (dm_) {
              s = vec(emit_mod(b_, e, e.score, leaves, cache));
              d = vec(emit_mod(b_, e, dmod_.dscore, leaves, cache));
              for (const ModLoadDerivative& ld : dmod_.loads)
                dload.push_back(vec(emit_mod(b_, e, ld.d, leaves, cache)));
            }
            llvm::Value* p = emit_exp(b_, b_.CreateFSub(s, l));
            if (masked) {
              llvm::Value* keep = b_.CreateICmpSLT(keys, splat(len_k_));
              if (e.keep >= 0) keep = b_.CreateAnd(keep, vec(emit_mod(b_, e, e.keep, leaves, cache)));
              p = b_.CreateSelect(keep, p, vconst(0.0));
              if (d) d = b_.CreateSelect(keep, d, vconst(0.0));
              for (llvm::Value*& x : dload) x = b_.CreateSelect(keep, x, vconst(0.0));
            }
            store_vec(p, at(p_, off));
            if (pd_) {  // the forward's dropout mask for (batch, head, row, these keys)
              llvm::Value* keep = emit_dropout_keep(
                  b_, spec_.dropout_p, seed_, b_.CreateTrunc(batch_, i32()), b_.CreateTrunc(head_, i32()),
                  b_.CreateTrunc(b_.CreateAdd(q0, r), i32()),
                  b_.CreateTrunc(keys, llvm::FixedVectorType::get(i32(), static_cast<unsigned>(lanes_))));
              llvm::Value* scaled = b_.CreateFMul(p, vconst(1.0 / (1.0 - spec_.dropout_p)));
              store_vec(b_.CreateSelect(keep, scaled, vconst(0.0)), at(pd_, off));
            }
            if (d) store_vec(d, at(dm_, off));
            for (std::size_t i = 0; i < dload.size(); ++i) store_vec(dload[i], at(dl_[i], off));
          }
        },
        masked ? "p.mask" : "p");
  }

  llvm::Module& module_;
  llvm::IRBuilder<> b_;
  const AttentionSpec& spec_;
  const BackwardConfig& cfg_;
  int lanes_;
  std::int64_t br_, bc_, dkp_, dvp_;
  EffectiveMod mod_;
  std::vector<int> grad_inputs_;  // per spec.tensor_grads entry: the effective mod's load input
  ModDerivative dmod_;            // mod_.expr with its derivatives appended
  std::vector<unsigned> deps_;
  std::vector<ModTensorIn> tensors_;
  llvm::Type *f32_ = nullptr, *i64_ = nullptr, *ptr_ = nullptr;
  llvm::FixedVectorType* vf_ = nullptr;
  llvm::Function* fn_ = nullptr;
  llvm::Value *args_ = nullptr, *batch_ = nullptr, *kvh_ = nullptr, *chunk_ = nullptr;
  llvm::Value *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *lse_ = nullptr, *dout_ = nullptr, *dk_out_ = nullptr,
              *dv_out_ = nullptr, *delta_ = nullptr, *dq_part_ = nullptr;
  llvm::Value *len_q_ = nullptr, *len_k_ = nullptr, *nbatch_ = nullptr, *chunk_blocks_ = nullptr,
              *padded_rows_ = nullptr;
  llvm::Value *len_qf_ = nullptr, *len_kf_ = nullptr, *batchf_ = nullptr, *kv_row0_ = nullptr;
  llvm::Value *k0_ = nullptr, *nk_ = nullptr, *head_ = nullptr, *bh_ = nullptr, *seed_ = nullptr;
  llvm::AllocaInst *kt_ = nullptr, *kr_ = nullptr, *vt_ = nullptr, *dkacc_ = nullptr, *dvacc_ = nullptr, *qb_ = nullptr,
                   *dob_ = nullptr, *p_ = nullptr, *s_ = nullptr, *lseb_ = nullptr, *deltab_ = nullptr, *dm_ = nullptr,
                   *pd_ = nullptr, *qp_ = nullptr, *dop_ = nullptr, *pp_ = nullptr, *dsp_ = nullptr, *dsr_ = nullptr;
  std::vector<llvm::AllocaInst*> dl_;    // per differentiated load: ∂f/∂load [Br][Bc]
  std::vector<llvm::Value*> grad_slot_;  // per spec.tensor_grads entry: this task's partial sums
};

}  // namespace

void emit_attention_backward(llvm::Module& module, const AttentionSpec& spec, const BackwardConfig& config,
                             const std::string& name) {
  BackwardEmitter(module, spec, config).emit(name);
}

}  // namespace qkv::codegen::cpu
