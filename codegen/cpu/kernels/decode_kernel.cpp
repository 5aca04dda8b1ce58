// The split-KV decode kernel and its merge (decode_kernel.hpp).
#include "cpu/kernels/decode_kernel.hpp"

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>

#include <qkv/ir/error.hpp>

#include "cpu/kernels/attention_common.hpp"
#include "cpu/schedule.hpp"
#include "llvm/ir_util.hpp"
#include "llvm/mod_ir.hpp"
#include "llvm/vector_math.hpp"

namespace qkv::codegen::cpu {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr std::uint64_t kVectorAlign = 64;

bool power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }

}  // namespace

bool decode_kernel_supported(const AttentionSpec& spec, const KernelConfig& config) {
  return spec.decode_queries >= 0 &&
         (spec.storage == DType::f32 || spec.storage == DType::bf16 || spec.storage == DType::f16) &&
         !spec.write_weights && spec.dropout_p == 0.0 && power_of_two(config.lanes) && spec.dk % config.lanes == 0 &&
         spec.dv % config.lanes == 0 && spec.hkv > 0 && spec.hq % spec.hkv == 0;
}

std::int64_t decode_max_queries(const AttentionSpec& spec, const KernelConfig& config) {
  if (!decode_kernel_supported(spec, config)) return 0;
  return spec.decode_queries > 0 ? spec.decode_queries : kDecodeQueries;
}

DecodeConfig choose_decode_config(const AttentionSpec& spec, const KernelConfig& config) {
  DecodeConfig d;
  d.lanes = config.lanes;
  const std::int64_t group = spec.hq / spec.hkv;
  for (int r = kDecodeMaxRows; r >= 1; --r) {
    if (group % r == 0) {
      d.rows = r;
      break;
    }
  }
  d.nblocks = group / d.rows;
  d.key_tile = 4 * d.lanes;
  // P·V accumulators (rows × pv_vectors) in about half the register file: 32 vector registers
  // with 16 lanes (AVX-512), 16 otherwise.
  const int budget = d.lanes >= 16 ? 16 : 8;
  d.pv_vectors = static_cast<int>(std::clamp<std::int64_t>(budget / d.rows, 1, spec.dv / d.lanes));
  return d;
}

namespace {

class DecodeEmitter {
 public:
  DecodeEmitter(llvm::Module& module, const AttentionSpec& spec, const KernelConfig& config)
      : module_(module),
        ctx_(module.getContext()),
        b_(module.getContext()),
        spec_(spec),
        cfg_(config),
        d_(choose_decode_config(spec, config)),
        lanes_(d_.lanes),
        rows_(d_.rows),
        tile_(d_.key_tile),
        dkv_(spec.dk / d_.lanes),
        dvv_(spec.dv / d_.lanes),
        group_(spec.hq / spec.hkv),
        mod_(effective_mod(spec)),
        half_(spec.storage == DType::bf16 || spec.storage == DType::f16),
        brain_(spec.storage == DType::bf16),
        dot_(brain_ && config.dpbf16 && config.lanes == 16 && spec.dk % (2 * config.lanes) == 0) {
    f32_ = b_.getFloatTy();
    i32_ = b_.getInt32Ty();
    i64_ = b_.getInt64Ty();
    ptr_ = b_.getPtrTy();
    vf_ = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(lanes_));
    st_ = half_ ? b_.getInt16Ty() : f32_;
    vst_ = llvm::FixedVectorType::get(st_, static_cast<unsigned>(lanes_));
    vpair_ = llvm::FixedVectorType::get(b_.getInt16Ty(), static_cast<unsigned>(2 * lanes_));
    vi64_ = llvm::FixedVectorType::get(i64_, static_cast<unsigned>(lanes_));
    info_ = analyse_mod(mod_.expr, mod_.axes.query, mod_.axes.key);
    if (mod_.expr.keep >= 0 && (info_.deps[static_cast<std::size_t>(mod_.expr.keep)] & kDepScore))
      throw std::invalid_argument("codegen: a mask modification may not read the score (use a score modification)");
    for (const ModTensor& t : mod_.tensors) (void)mod_element_type(b_, t.dtype);
  }

  void emit_kernel(const std::string& name);
  void emit_merge(const std::string& name);

 private:
  class Leaves;

  // --- the unit's geometry: shared by both functions
  void load_unit(llvm::Value* args, llvm::Value* unit);
  llvm::Value* row_index(int r);  // flat row (b·Hq + h_r)·L + i of row r, i64

  // --- the kernel
  void pack_queries();
  void emit_tile(llvm::Value* k0);
  std::vector<llvm::Value*> key_scores(llvm::Value* kb);  // per row: <lanes> scores of keys kb + lane
  /// Per row: the scores of keys [lo, lo + n) as ir::transpose_add leaves them (depth first, so
  /// that few partial vectors are live at once).
  std::vector<llvm::Value*> reduce_keys(const std::vector<llvm::Value*>& kptr, int lo, int n);
  llvm::Value* modify(int r, llvm::Value* s, llvm::Value* kidx, llvm::Value* partial);
  void emit_pv(llvm::Value* k0, llvm::Value* nk, const std::vector<llvm::Value*>& alpha);
  void emit_pv_block(llvm::Value* k0, llvm::Value* nk, llvm::Value* dc, int width,
                     const std::vector<llvm::Value*>& alpha);
  void finish(llvm::Value* chunk, llvm::Value* chunks, llvm::Value* partials);
  void store_row(int r, llvm::Value* m, llvm::Value* l, const std::function<llvm::Value*(llvm::Value*)>& column);

  // --- helpers
  llvm::Value* c64(std::int64_t v) { return b_.getInt64(static_cast<std::uint64_t>(v)); }
  llvm::Value* vconst(double v) { return llvm::ConstantFP::get(vf_, v); }
  llvm::Value* fconst(double v) { return llvm::ConstantFP::get(f32_, v); }
  llvm::Value* splat(llvm::Value* x) { return b_.CreateVectorSplat(static_cast<unsigned>(lanes_), x); }
  llvm::Value* fma(llvm::Value* a, llvm::Value* x, llvm::Value* c) {
    return b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {a->getType()}, {a, x, c});
  }
  llvm::Value* smin(llvm::Value* a, llvm::Value* x) {
    return b_.CreateIntrinsic(llvm::Intrinsic::smin, {a->getType()}, {a, x});
  }
  llvm::Value* fptr(llvm::Value* base, llvm::Value* index) { return b_.CreateInBoundsGEP(f32_, base, index); }
  /// q, k, v and out as stored: f32, or the bits of bf16 values (i16), widened as loaded (exact)
  /// and rounded to nearest even as stored; every value in registers is f32.
  llvm::Value* sptr(llvm::Value* base, llvm::Value* index) { return b_.CreateInBoundsGEP(st_, base, index); }
  llvm::Value* sload(llvm::Value* p) {
    llvm::Value* x = b_.CreateAlignedLoad(vst_, p, llvm::Align(half_ ? 2 : 4));
    return half_ ? ir::half_to_f32(b_, x, brain_) : x;
  }
  void sstore(llvm::Value* x, llvm::Value* p) {
    if (half_) x = ir::f32_to_half(b_, x, brain_);
    b_.CreateAlignedStore(x, p, llvm::Align(half_ ? 2 : 4));
  }
  llvm::Value* vload(llvm::Value* p, std::uint64_t align) { return b_.CreateAlignedLoad(vf_, p, llvm::Align(align)); }
  void vstore(llvm::Value* x, llvm::Value* p, std::uint64_t align) { b_.CreateAlignedStore(x, p, llvm::Align(align)); }
  /// Vector v of row r of a stack buffer laid out [rows][width vectors].
  llvm::Value* stack_vec(llvm::AllocaInst* buf, int r, std::int64_t width, llvm::Value* v) {
    return b_.CreateInBoundsGEP(vf_, buf, b_.CreateAdd(c64(r * width), v));
  }
  llvm::Value* hsum(llvm::Value* v) {
    auto* x = llvm::cast<llvm::Instruction>(b_.CreateFAddReduce(fconst(0.0), v));
    x->setHasAllowReassoc(true);
    return x;
  }
  llvm::Value* axis_value(int r, const std::string& axis, llvm::Value* key, bool position);
  llvm::Value* axis_length(const std::string& axis) {
    return mod_axis_length(b_, mod_.axes, axis, len_qf_, len_kf_, nbatch_);
  }
  llvm::Value* load_element(const ModNode& n, const std::vector<llvm::Value*>& at) {
    return load_mod_element(b_, tensors_.at(static_cast<std::size_t>(n.input)),
                            mod_.tensors.at(static_cast<std::size_t>(n.input)).dtype, at, lanes_);
  }

  llvm::Module& module_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const AttentionSpec& spec_;
  KernelConfig cfg_;
  DecodeConfig d_;
  int lanes_, rows_, tile_;
  std::int64_t dkv_, dvv_, group_;  // vectors per key row, per value row; query heads per kv head
  EffectiveMod mod_;
  ModAnalysis info_;
  bool half_;   // bf16 or f16 storage of q, k, v and out
  bool brain_;  // ... bf16
  /// bf16 on a host with AVX512-BF16 and dk a multiple of 2·lanes: Q·K by vdpbf16ps on pairs of
  /// features as stored (each lane sums the exact products of two; q unscaled, the scores scaled
  /// after); else K is widened as loaded. V is widened as loaded either way (P stays f32).
  bool dot_;

  llvm::Type *f32_, *i32_, *i64_, *ptr_, *st_;
  llvm::VectorType *vf_, *vi64_, *vst_, *vpair_;

  // the unit
  llvm::Value *len_q_ = nullptr, *len_k_ = nullptr, *nbatch_ = nullptr, *len_qf_ = nullptr, *len_kf_ = nullptr;
  llvm::Value *unit_ = nullptr, *batch_ = nullptr, *query_ = nullptr, *head0_ = nullptr, *batchf_ = nullptr;
  llvm::Value *q_ = nullptr, *out_ = nullptr, *lse_ = nullptr, *k_base_ = nullptr, *v_base_ = nullptr;
  llvm::Value* c1_ = nullptr;  // end of the chunk
  std::vector<ModTensorIn> tensors_;
  std::vector<std::vector<llvm::Value*>> row_cache_;  // per row: the mod's nodes free of the key
  // the kernel's stack
  llvm::AllocaInst *qs_ = nullptr, *os_ = nullptr, *sp_ = nullptr, *m_ = nullptr, *l_ = nullptr;
};

/// The leaves of row r: the query coordinate and the head are scalars, the key coordinate a
/// vector over the lanes (null outside the key loop), the score a vector in log2 units.
class DecodeEmitter::Leaves final : public Log2ScoreLeaves {
 public:
  Leaves(DecodeEmitter& k, int r, llvm::Value* key, llvm::Value* score_log2)
      : Log2ScoreLeaves(k.b_, score_log2, "decode kernel"), k_(k), r_(r), key_(key) {}
  llvm::Value* index(const std::string& axis) override { return k_.axis_value(r_, axis, key_, false); }
  llvm::Value* position(const std::string& axis) override { return k_.axis_value(r_, axis, key_, true); }
  llvm::Value* length(const std::string& axis) override { return k_.axis_length(axis); }
  llvm::Value* load(const ModNode& n, const std::vector<llvm::Value*>& at) override { return k_.load_element(n, at); }
  llvm::Value* extent(const ModNode& n, std::size_t d) override {
    return k_.tensors_.at(static_cast<std::size_t>(n.input)).extent_f32.at(d);
  }

 private:
  DecodeEmitter& k_;
  int r_;
  llvm::Value* key_;
};

llvm::Value* DecodeEmitter::axis_value(int r, const std::string& axis, llvm::Value* key, bool position) {
  const ModAxes& a = mod_.axes;
  if (axis == a.query) {
    llvm::Value* x = b_.CreateSIToFP(query_, f32_);
    if (position && mod_.expr.shifts(axis)) x = b_.CreateFAdd(x, b_.CreateFSub(len_kf_, len_qf_));
    return x;
  }
  if (axis == a.key) {
    if (!key) internal_error("decode kernel: a key coordinate outside the key loop");
    return key;
  }
  if (axis == a.batch) return batchf_;
  if (llvm::Value* c = mod_head_coordinate(b_, a, axis, b_.CreateAdd(head0_, c64(r)))) return c;
  internal_error("decode kernel: a mod names the axis `" + axis + "`, which the scores do not have");
}

void DecodeEmitter::load_unit(llvm::Value* args, llvm::Value* unit) {
  auto field = [&](std::size_t offset, llvm::Type* t, const char* name) {
    return load_args_field(b_, args, offset, t, name);
  };
  q_ = field(offsetof(AttentionArgs, q), ptr_, "q");
  out_ = field(offsetof(AttentionArgs, out), ptr_, "out");
  if (spec_.write_lse) lse_ = field(offsetof(AttentionArgs, lse), ptr_, "lse");
  len_q_ = field(offsetof(AttentionArgs, len_q), i64_, "L");
  len_k_ = field(offsetof(AttentionArgs, len_k), i64_, "S");
  nbatch_ = field(offsetof(AttentionArgs, batch), i64_, "B");
  len_qf_ = b_.CreateSIToFP(len_q_, f32_, "Lf");
  len_kf_ = b_.CreateSIToFP(len_k_, f32_, "Sf");
  // unit = ((batch · Hkv + kv head) · nblocks + head block) · L + i
  unit_ = unit;
  query_ = b_.CreateURem(unit, len_q_, "i");
  llvm::Value* rest = b_.CreateUDiv(unit, len_q_);
  llvm::Value* block = b_.CreateURem(rest, c64(d_.nblocks), "head_block");
  rest = b_.CreateUDiv(rest, c64(d_.nblocks));
  llvm::Value* kv_head = b_.CreateURem(rest, c64(spec_.hkv), "kv_head");
  batch_ = b_.CreateUDiv(rest, c64(spec_.hkv), "batch");
  batchf_ = b_.CreateSIToFP(batch_, f32_, "bf");
  head0_ = b_.CreateAdd(b_.CreateMul(kv_head, c64(group_)), b_.CreateMul(block, c64(rows_)), "head0");
  llvm::Value* kv_rows =
      b_.CreateMul(b_.CreateAdd(b_.CreateMul(batch_, c64(spec_.hkv)), kv_head), head_rows(b_, args, len_k_));
  k_base_ = sptr(field(offsetof(AttentionArgs, k), ptr_, "k"), b_.CreateMul(kv_rows, c64(spec_.dk)));
  v_base_ = sptr(field(offsetof(AttentionArgs, v), ptr_, "v"), b_.CreateMul(kv_rows, c64(spec_.dv)));
  tensors_ = load_mod_tensors(b_, args, mod_.tensors, nbatch_, len_q_, len_k_);
}

llvm::Value* DecodeEmitter::row_index(int r) {
  llvm::Value* h = b_.CreateAdd(head0_, c64(r));
  return b_.CreateAdd(b_.CreateMul(b_.CreateAdd(b_.CreateMul(batch_, c64(spec_.hq)), h), len_q_), query_);
}

// ------------------------------------------------------------------------------------------------
// the chunk kernel

void DecodeEmitter::emit_kernel(const std::string& name) {
  llvm::Function* fn = declare_attention_function(module_, b_, cfg_, name, {ptr_, i64_, i64_, i64_, i64_, ptr_});
  llvm::Value* args = fn->getArg(0);
  llvm::Value* unit = fn->getArg(1);
  llvm::Value* chunk = fn->getArg(2);
  llvm::Value* chunk_len = fn->getArg(3);
  llvm::Value* chunks = fn->getArg(4);
  llvm::Value* partials = fn->getArg(5);
  args->setName("args");
  unit->setName("unit");
  chunk->setName("chunk");
  chunk_len->setName("chunk_len");
  chunks->setName("chunks");
  partials->setName("partials");
  llvm::Value* saved_csr = flush_denormals(b_, cfg_);
  load_unit(args, unit);

  qs_ = ir::entry_alloca(b_, vf_, static_cast<std::uint64_t>(rows_ * dkv_), kVectorAlign, "qs");    // [rows][dk]
  os_ = ir::entry_alloca(b_, vf_, static_cast<std::uint64_t>(rows_ * dvv_), kVectorAlign, "os");    // [rows][dv]
  sp_ = ir::entry_alloca(b_, f32_, static_cast<std::uint64_t>(rows_ * tile_), kVectorAlign, "sp");  // [rows][T]
  m_ = ir::entry_alloca(b_, f32_, static_cast<std::uint64_t>(rows_), 4, "m");            // running max, log2 units
  l_ = ir::entry_alloca(b_, vf_, static_cast<std::uint64_t>(rows_), kVectorAlign, "l");  // running sums by lane
  pack_queries();
  b_.CreateMemSet(os_, b_.getInt8(0), static_cast<std::uint64_t>(rows_ * spec_.dv * 4), llvm::MaybeAlign(kVectorAlign));
  for (int r = 0; r < rows_; ++r) {
    b_.CreateStore(fconst(kNegInf), b_.CreateConstInBoundsGEP1_64(f32_, m_, static_cast<std::uint64_t>(r)));
    vstore(vconst(0.0), b_.CreateConstInBoundsGEP1_64(vf_, l_, static_cast<std::uint64_t>(r)), kVectorAlign);
  }
  // The mod's nodes that depend on no key: once per row.
  row_cache_.assign(static_cast<std::size_t>(rows_), std::vector<llvm::Value*>(mod_.expr.nodes.size(), nullptr));
  for (int r = 0; r < rows_; ++r) {
    Leaves leaves(*this, r, nullptr, nullptr);
    for (std::size_t n = 0; n < mod_.expr.nodes.size(); ++n)
      if (info_.reach[n] && (info_.deps[n] & (kDepKey | kDepScore)) == 0)
        emit_mod(b_, mod_.expr, static_cast<int>(n), leaves, row_cache_[static_cast<std::size_t>(r)]);
  }

  llvm::Value* c0 = b_.CreateMul(chunk, chunk_len, "c0");
  c1_ = smin(b_.CreateAdd(c0, chunk_len), len_k_);
  ir::emit_loop(b_, c0, c1_, tile_, [&](llvm::Value* k0) { emit_tile(k0); }, "tiles");
  finish(chunk, chunks, partials);
  restore_denormals(b_, saved_csr);
  b_.CreateRetVoid();
}

void DecodeEmitter::pack_queries() {
  // qs[r] = q[row r] · scale · log2 e: the scores come out in log2 units.
  llvm::Value* factor = vconst(spec_.effective_scale() * kLog2e);
  for (int r = 0; r < rows_; ++r) {
    llvm::Value* src = sptr(q_, b_.CreateMul(row_index(r), c64(spec_.dk)));
    if (dot_) {  // qs[r] = q[row r] as stored: 2·lanes bf16 per vector (key_scores scales the scores)
      for (std::int64_t v = 0; v < dkv_ / 2; ++v) {
        llvm::Value* x = b_.CreateAlignedLoad(vpair_, sptr(src, c64(v * 2 * lanes_)), llvm::Align(2));
        vstore(b_.CreateBitCast(x, vf_), stack_vec(qs_, r, dkv_, c64(v)), kVectorAlign);
      }
      continue;
    }
    for (std::int64_t v = 0; v < dkv_; ++v) {
      llvm::Value* x = sload(sptr(src, c64(v * lanes_)));
      vstore(b_.CreateFMul(x, factor), stack_vec(qs_, r, dkv_, c64(v)), kVectorAlign);
    }
  }
}

std::vector<llvm::Value*> DecodeEmitter::reduce_keys(const std::vector<llvm::Value*>& kptr, int lo, int n) {
  if (n == 1 && dot_) {
    // Lane j: the products of features (2j, 2j + 1) of each 2·lanes block, summed over blocks.
    std::vector<llvm::Value*> kv(static_cast<std::size_t>(dkv_ / 2));
    for (std::int64_t v = 0; v < dkv_ / 2; ++v)
      kv[v] = b_.CreateAlignedLoad(vpair_, sptr(kptr[lo], c64(v * 2 * lanes_)), llvm::Align(2));
    std::vector<llvm::Value*> acc(static_cast<std::size_t>(rows_), vconst(0.0));
    for (int r = 0; r < rows_; ++r)
      for (std::int64_t v = 0; v < dkv_ / 2; ++v) {
        llvm::Value* q = vload(stack_vec(qs_, r, dkv_, c64(v)), kVectorAlign);
        acc[r] = ir::dot_bf16_pairs(b_, acc[r], q, kv[v]);
      }
    return acc;
  }
  if (n == 1) {
    // The lane-wise products of key `lo` with every row's query: d in the lanes.
    std::vector<llvm::Value*> kv(static_cast<std::size_t>(dkv_));
    for (std::int64_t v = 0; v < dkv_; ++v) kv[v] = sload(sptr(kptr[lo], c64(v * lanes_)));
    std::vector<llvm::Value*> acc(static_cast<std::size_t>(rows_));
    for (int r = 0; r < rows_; ++r) {
      for (std::int64_t v = 0; v < dkv_; ++v) {
        llvm::Value* q = vload(stack_vec(qs_, r, dkv_, c64(v)), kVectorAlign);
        acc[r] = v == 0 ? b_.CreateFMul(q, kv[v]) : fma(q, kv[v], acc[r]);
      }
    }
    return acc;
  }
  std::vector<llvm::Value*> x = reduce_keys(kptr, lo, n / 2);
  std::vector<llvm::Value*> y = reduce_keys(kptr, lo + n / 2, n / 2);
  for (int r = 0; r < rows_; ++r) x[r] = ir::transpose_add(b_, x[r], y[r], n / 2);
  return x;
}

std::vector<llvm::Value*> DecodeEmitter::key_scores(llvm::Value* kb) {
  // Keys past the chunk (the last group only) read its last row; their scores are masked.
  llvm::Value* last = b_.CreateSub(c1_, c64(1));
  std::vector<llvm::Value*> kptr(static_cast<std::size_t>(lanes_));
  for (int j = 0; j < lanes_; ++j) {
    llvm::Value* key = smin(b_.CreateAdd(kb, c64(j)), last);
    kptr[j] = sptr(k_base_, b_.CreateMul(key, c64(spec_.dk)));
  }
  std::vector<llvm::Value*> s = reduce_keys(kptr, 0, lanes_);
  if (dot_)
    for (auto& x : s) x = b_.CreateFMul(x, vconst(spec_.effective_scale() * kLog2e));
  return s;
}

llvm::Value* DecodeEmitter::modify(int r, llvm::Value* s, llvm::Value* kidx, llvm::Value* partial) {
  const ModExpr& e = mod_.expr;
  llvm::Value* key = b_.CreateSIToFP(kidx, vf_);
  auto value = [&](int root, llvm::Value* score) {
    std::vector<llvm::Value*> cache = row_cache_[static_cast<std::size_t>(r)];
    Leaves leaves(*this, r, key, score);
    llvm::Value* x = emit_mod(b_, e, root, leaves, cache);
    return x->getType()->isVectorTy() ? x : splat(x);
  };
  Leaves leaves(*this, r, key, s);
  s = modified_score_log2(b_, e, info_, s, leaves, value);
  llvm::Value* visible = b_.CreateICmpSLT(kidx, splat(c1_), "inside");
  if (e.keep >= 0) {
    llvm::Value* k = value(e.keep, nullptr);
    if (k->getType()->getScalarType()->isFloatingPointTy()) k = b_.CreateFCmpUNE(k, vconst(0.0));  // a literal
    visible = b_.CreateAnd(visible, b_.CreateOr(k, splat(b_.CreateNot(partial))));
  }
  return b_.CreateSelect(visible, s, vconst(kNegInf));
}

void DecodeEmitter::emit_tile(llvm::Value* k0) {
  llvm::Value* nk = smin(c64(tile_), b_.CreateSub(c1_, k0));
  llvm::Value* always = b_.getTrue();
  llvm::Value* never = b_.getFalse();
  if (mod_.expr.keep >= 0) {
    // Every row's class: a tile none of them sees is skipped, one all see all of needs no mask.
    always = b_.getTrue();
    never = b_.getTrue();
    for (int r = 0; r < rows_; ++r) {
      const TileSpan span{query_, b_.CreateAdd(query_, c64(1)), k0, b_.CreateAdd(k0, nk), len_qf_, len_kf_};
      AttentionBoundsLeaves leaves(
          b_, mod_, info_.deps, tensors_, span,
          [&](const std::string& axis, bool position) { return axis_value(r, axis, nullptr, position); },
          [&](const std::string& axis) { return axis_length(axis); },
          [&](const ModNode& n, const std::vector<llvm::Value*>& idx) { return load_element(n, idx); });
      auto [yes, no] = emit_mod_classify(b_, mod_.expr, leaves);
      always = b_.CreateAnd(always, yes);
      never = b_.CreateAnd(never, no);
    }
  }
  llvm::Function* fn = b_.GetInsertBlock()->getParent();
  llvm::BasicBlock* body = llvm::BasicBlock::Create(ctx_, "tile.body", fn);
  llvm::BasicBlock* done = llvm::BasicBlock::Create(ctx_, "tile.done", fn);
  b_.CreateCondBr(never, done, body);
  b_.SetInsertPoint(body);
  llvm::Value* partial = b_.CreateNot(always, "partial");

  // Scores of the tile, `lanes` keys at a time, and each row's running tile max.
  llvm::Value* groups = b_.CreateUDiv(b_.CreateAdd(nk, c64(lanes_ - 1)), c64(lanes_), "groups");
  std::vector<llvm::Constant*> iota;
  for (int j = 0; j < lanes_; ++j) iota.push_back(b_.getInt64(static_cast<std::uint64_t>(j)));
  llvm::Value* lane_keys = llvm::ConstantVector::get(iota);
  std::vector<llvm::Value*> max_init(static_cast<std::size_t>(rows_), vconst(kNegInf));
  std::vector<llvm::Value*> tile_max = ir::emit_loop(
      b_, c64(0), groups, 1, max_init,
      [&](llvm::Value* g, const std::vector<llvm::Value*>& running) {
        llvm::Value* off = b_.CreateMul(g, c64(lanes_));
        llvm::Value* kb = b_.CreateAdd(k0, off, "kb");
        std::vector<llvm::Value*> s = key_scores(kb);
        llvm::Value* kidx = b_.CreateAdd(splat(kb), lane_keys, "keys");
        std::vector<llvm::Value*> mx = running;
        for (int r = 0; r < rows_; ++r) {
          llvm::Value* x = modify(r, s[r], kidx, partial);
          vstore(x, fptr(sp_, b_.CreateAdd(c64(static_cast<std::int64_t>(r) * tile_), off)), 4);
          mx[r] = b_.CreateMaxNum(mx[r], x);
        }
        return mx;
      },
      "qk");

  // The online softmax step of each row.
  std::vector<llvm::Value*> m_use(static_cast<std::size_t>(rows_)), alpha(m_use.size());
  for (int r = 0; r < rows_; ++r) {
    llvm::Value* mp = b_.CreateConstInBoundsGEP1_64(f32_, m_, static_cast<std::uint64_t>(r));
    llvm::Value* m_old = b_.CreateLoad(f32_, mp);
    llvm::Value* m_new = b_.CreateMaxNum(m_old, b_.CreateFPMaxReduce(tile_max[r]), "m_new");
    m_use[r] = b_.CreateSelect(b_.CreateFCmpOEQ(m_new, fconst(kNegInf)), fconst(0.0), m_new, "m_use");
    alpha[r] = emit_exp2(b_, b_.CreateFSub(m_old, m_use[r]), /*no_overflow=*/true);
    b_.CreateStore(m_new, mp);
  }
  std::vector<llvm::Value*> zero(static_cast<std::size_t>(rows_), vconst(0.0));
  std::vector<llvm::Value*> sums = ir::emit_loop(
      b_, c64(0), groups, 1, zero,
      [&](llvm::Value* g, const std::vector<llvm::Value*>& in) {
        std::vector<llvm::Value*> out = in;
        llvm::Value* off = b_.CreateMul(g, c64(lanes_));
        for (int r = 0; r < rows_; ++r) {
          llvm::Value* p = fptr(sp_, b_.CreateAdd(c64(static_cast<std::int64_t>(r) * tile_), off));
          llvm::Value* x = emit_exp2(b_, b_.CreateFSub(vload(p, 4), splat(m_use[r])), /*no_overflow=*/true);
          vstore(x, p, 4);
          out[r] = b_.CreateFAdd(out[r], x);
        }
        return out;
      },
      "softmax");
  for (int r = 0; r < rows_; ++r) {
    llvm::Value* lp = b_.CreateConstInBoundsGEP1_64(vf_, l_, static_cast<std::uint64_t>(r));
    vstore(fma(vload(lp, kVectorAlign), splat(alpha[r]), sums[r]), lp, kVectorAlign);
  }
  emit_pv(k0, nk, alpha);
  b_.CreateBr(done);
  b_.SetInsertPoint(done);
}

void DecodeEmitter::emit_pv(llvm::Value* k0, llvm::Value* nk, const std::vector<llvm::Value*>& alpha) {
  const int pv = d_.pv_vectors;
  const std::int64_t full = dvv_ / pv * pv;
  if (full > 0)
    ir::emit_loop(b_, c64(0), c64(full), pv, [&](llvm::Value* dc) { emit_pv_block(k0, nk, dc, pv, alpha); }, "pv");
  if (full < dvv_) emit_pv_block(k0, nk, c64(full), static_cast<int>(dvv_ - full), alpha);
}

void DecodeEmitter::emit_pv_block(llvm::Value* k0, llvm::Value* nk, llvm::Value* dc, int width,
                                  const std::vector<llvm::Value*>& alpha) {
  // acc[r·width + c] = Σ P_r[j] · V[k0 + j][dc + c] over the tile's keys, from zero; then
  // O_r = α_r · O_r + acc: one rounded term per tile (the fused kernel's emit_pv_block says why).
  std::vector<llvm::Value*> init(static_cast<std::size_t>(rows_ * width), vconst(0.0));
  llvm::Value* vbase = sptr(v_base_, b_.CreateAdd(b_.CreateMul(k0, c64(spec_.dv)), b_.CreateMul(dc, c64(lanes_))));
  std::vector<llvm::Value*> acc = ir::emit_loop(
      b_, c64(0), nk, 1, init,
      [&](llvm::Value* j, const std::vector<llvm::Value*>& in) {
        std::vector<llvm::Value*> a = in;
        llvm::Value* vrow = sptr(vbase, b_.CreateMul(j, c64(spec_.dv)));
        std::vector<llvm::Value*> vv(static_cast<std::size_t>(width));
        for (int c = 0; c < width; ++c) vv[c] = sload(sptr(vrow, c64(static_cast<std::int64_t>(c) * lanes_)));
        for (int r = 0; r < rows_; ++r) {
          llvm::Value* p =
              splat(b_.CreateLoad(f32_, fptr(sp_, b_.CreateAdd(c64(static_cast<std::int64_t>(r) * tile_), j))));
          for (int c = 0; c < width; ++c) a[r * width + c] = fma(p, vv[c], a[r * width + c]);
        }
        return a;
      },
      "pv.key", ir::Unroll::allowed);
  for (int r = 0; r < rows_; ++r)
    for (int c = 0; c < width; ++c) {
      llvm::Value* at = stack_vec(os_, r, dvv_, b_.CreateAdd(dc, c64(c)));
      vstore(fma(vload(at, kVectorAlign), splat(alpha[r]), acc[r * width + c]), at, kVectorAlign);
    }
}

void DecodeEmitter::store_row(int r, llvm::Value* m, llvm::Value* l,
                              const std::function<llvm::Value*(llvm::Value*)>& column) {
  // out[row] = column(v) / l (zeros for a row that saw no key); lse = (m + log2 l)·ln 2 or −inf.
  llvm::Value* row = row_index(r);
  llvm::Value* seen = b_.CreateFCmpOGT(l, fconst(0.0));
  llvm::Value* inv = splat(b_.CreateSelect(seen, b_.CreateFDiv(fconst(1.0), l), fconst(0.0)));
  llvm::Value* dst = sptr(out_, b_.CreateMul(row, c64(spec_.dv)));
  ir::emit_loop(
      b_, c64(0), c64(dvv_), 1,
      [&](llvm::Value* v) { sstore(b_.CreateFMul(column(v), inv), sptr(dst, b_.CreateMul(v, c64(lanes_)))); }, "store");
  if (spec_.write_lse) {
    llvm::Value* value =
        b_.CreateSelect(seen, b_.CreateFMul(b_.CreateFAdd(m, emit_log2(b_, l)), fconst(kLn2)), fconst(kNegInf), "lse");
    b_.CreateStore(value, fptr(lse_, row));
  }
}

void DecodeEmitter::finish(llvm::Value* chunk, llvm::Value* chunks, llvm::Value* partials) {
  llvm::Function* fn = b_.GetInsertBlock()->getParent();
  llvm::BasicBlock* direct = llvm::BasicBlock::Create(ctx_, "direct", fn);
  llvm::BasicBlock* record = llvm::BasicBlock::Create(ctx_, "record", fn);
  llvm::BasicBlock* done = llvm::BasicBlock::Create(ctx_, "done", fn);
  std::vector<llvm::Value*> m(static_cast<std::size_t>(rows_)), l(m.size());
  for (int r = 0; r < rows_; ++r) {
    m[r] = b_.CreateLoad(f32_, b_.CreateConstInBoundsGEP1_64(f32_, m_, static_cast<std::uint64_t>(r)));
    l[r] = hsum(vload(b_.CreateConstInBoundsGEP1_64(vf_, l_, static_cast<std::uint64_t>(r)), kVectorAlign));
  }
  b_.CreateCondBr(b_.CreateIsNull(partials), direct, record);

  // The unit's only chunk: finished rows.
  b_.SetInsertPoint(direct);
  for (int r = 0; r < rows_; ++r)
    store_row(r, m[r], l[r], [&](llvm::Value* v) { return vload(stack_vec(os_, r, dvv_, v), kVectorAlign); });
  b_.CreateBr(done);

  // One of several: the record [m, l, O] of every row.
  b_.SetInsertPoint(record);
  const std::int64_t rec = decode_record_floats(spec_);
  for (int r = 0; r < rows_; ++r) {
    llvm::Value* index =
        b_.CreateAdd(b_.CreateMul(b_.CreateAdd(b_.CreateMul(unit_, c64(rows_)), c64(r)), chunks), chunk);
    llvm::Value* dst = fptr(partials, b_.CreateMul(index, c64(rec)));
    b_.CreateStore(m[r], dst);
    b_.CreateStore(l[r], fptr(dst, c64(1)));
    llvm::Value* o = fptr(dst, c64(2));
    ir::emit_loop(
        b_, c64(0), c64(dvv_), 1,
        [&](llvm::Value* v) {
          vstore(vload(stack_vec(os_, r, dvv_, v), kVectorAlign), fptr(o, b_.CreateMul(v, c64(lanes_))), 4);
        },
        "record.o");
  }
  b_.CreateBr(done);
  b_.SetInsertPoint(done);
}

// ------------------------------------------------------------------------------------------------
// the merge

void DecodeEmitter::emit_merge(const std::string& name) {
  llvm::Function* fn = declare_attention_function(module_, b_, cfg_, name, {ptr_, i64_, i64_, ptr_});
  llvm::Value* args = fn->getArg(0);
  llvm::Value* unit = fn->getArg(1);
  llvm::Value* chunks = fn->getArg(2);
  llvm::Value* partials = fn->getArg(3);
  args->setName("args");
  unit->setName("unit");
  chunks->setName("chunks");
  partials->setName("partials");
  llvm::Value* saved_csr = flush_denormals(b_, cfg_);
  load_unit(args, unit);
  llvm::AllocaInst* weight = ir::entry_alloca(b_, f32_, static_cast<std::uint64_t>(kDecodeMaxChunks), 4, "w");
  const std::int64_t rec = decode_record_floats(spec_);
  for (int r = 0; r < rows_; ++r) {
    llvm::Value* index = b_.CreateMul(b_.CreateAdd(b_.CreateMul(unit, c64(rows_)), c64(r)), chunks);
    llvm::Value* base = fptr(partials, b_.CreateMul(index, c64(rec)));
    auto at = [&](llvm::Value* c, std::int64_t offset) {
      return fptr(base, b_.CreateAdd(b_.CreateMul(c, c64(rec)), c64(offset)));
    };
    // M = max_c m_c; w_c = 2^(m_c − M) (0 for an empty chunk); L = Σ_c w_c · l_c.
    llvm::Value* big = ir::emit_loop(
        b_, c64(0), chunks, 1, {fconst(kNegInf)},
        [&](llvm::Value* c, const std::vector<llvm::Value*>& in) -> std::vector<llvm::Value*> {
          return {b_.CreateMaxNum(in[0], b_.CreateLoad(f32_, at(c, 0)))};
        },
        "merge.max")[0];
    llvm::Value* m_use = b_.CreateSelect(b_.CreateFCmpOEQ(big, fconst(kNegInf)), fconst(0.0), big);
    llvm::Value* sum = ir::emit_loop(
        b_, c64(0), chunks, 1, {fconst(0.0)},
        [&](llvm::Value* c, const std::vector<llvm::Value*>& in) -> std::vector<llvm::Value*> {
          llvm::Value* w = emit_exp2(b_, b_.CreateFSub(b_.CreateLoad(f32_, at(c, 0)), m_use), /*no_overflow=*/true);
          b_.CreateStore(w, fptr(weight, c));
          return {fma(w, b_.CreateLoad(f32_, at(c, 1)), in[0])};
        },
        "merge.sum")[0];
    store_row(r, m_use, sum, [&](llvm::Value* v) {
      return ir::emit_loop(
          b_, c64(0), chunks, 1, {vconst(0.0)},
          [&](llvm::Value* c, const std::vector<llvm::Value*>& in) -> std::vector<llvm::Value*> {
            llvm::Value* o = vload(fptr(at(c, 2), b_.CreateMul(v, c64(lanes_))), 4);
            return {fma(splat(b_.CreateLoad(f32_, fptr(weight, c))), o, in[0])};
          },
          "merge.o")[0];
    });
  }
  restore_denormals(b_, saved_csr);
  b_.CreateRetVoid();
}

}  // namespace

void emit_decode_kernels(llvm::Module& module, const AttentionSpec& spec, const KernelConfig& config,
                         const std::string& name) {
  if (!decode_kernel_supported(spec, config)) internal_error("decode kernel: emitted for a spec it does not support");
  DecodeEmitter(module, spec, config).emit_kernel(name);
  DecodeEmitter(module, spec, config).emit_merge(name + "_merge");
}

}  // namespace qkv::codegen::cpu
