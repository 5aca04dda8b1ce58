// The fused attention kernel, part 1: choosing the blocking, the function and its arguments, the
// geometry of a task (which tiles to visit, which need masks), the stack state, the sweeps over
// the K/V tiles and the epilogue. The tile body is in attention_tile.cpp.
#include "cpu/kernels/attention_kernel.hpp"

#include <qkv/codegen/cpu/tuning.hpp>
#include "llvm/vector_math.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>

#include "cpu/kernels/attention_common.hpp"
#include "cpu/kernels/attention_emitter.hpp"
#include "llvm/ir_util.hpp"

namespace qkv::codegen::cpu {

namespace {
constexpr std::uint64_t kVectorAlign = 64;  // a cache line; >= any vector's natural alignment
}  // namespace

// ------------------------------------------------------------------------------------------------
// configuration

KernelConfig choose_kernel_config(const AttentionSpec& spec, const HostTarget& host) {
  KernelConfig c;
  c.lanes = spec.vector_floats > 0 ? spec.vector_floats : std::max(host.vector_floats, 4);
  // Register budget: accumulators R·Ck (scores) and R·Dc (P·V) plus R operand vectors must fit
  // the register file with room for the broadcasts: 32 registers with AVX-512, 16 with AVX2/SSE.
  // The blocking per target is the table's (tuning.hpp).
  // bf16 pairs on vdpbf16ps (else bf16 is widened as loaded and computed like f32).
  const bool bf16 =
      spec.storage == DType::bf16 && bf16_dot_products(host, c.lanes) && spec.dk % 2 == 0 && spec.dv % 16 == 0;
  const KernelTuning t = kernel_tuning(host, c.lanes);
  c.query_vectors = bf16 ? t.bf16_query_vectors : t.query_vectors;
  c.qk_keys = bf16 ? t.bf16_qk_keys : t.qk_keys;
  c.pv_dims = bf16 ? t.bf16_pv_dims : t.pv_dims;
  c.key_tile = bf16 ? t.bf16_key_tile : t.key_tile;
  if (spec.query_vectors > 0) c.query_vectors = spec.query_vectors;
  if (spec.qk_keys > 0) c.qk_keys = spec.qk_keys;
  if (spec.pv_dims > 0) c.pv_dims = spec.pv_dims;
  if (spec.key_tile > 0) c.key_tile = spec.key_tile;
  c.key_tile = (c.key_tile + c.qk_keys - 1) / c.qk_keys * c.qk_keys;  // whole Q·Kᵀ blocks per tile
  c.flush_denormals = host.triple.starts_with("x86_64");
  c.dpbf16 = bf16 && c.key_tile % 2 == 0;
  c.scalef_exp2 = c.lanes == 16 && has_feature(host, "+avx512f") && c.flush_denormals;
  c.cpu = host.cpu;
  c.features = joined_features(host);
  return c;
}

std::unique_ptr<llvm::Module> build_attention_module(llvm::LLVMContext& context, const AttentionSpec& spec,
                                                     const KernelConfig& config, const std::string& name) {
  auto module = std::make_unique<llvm::Module>(name, context);
  emit_attention_kernel(*module, spec, config, name);
  return module;
}

void emit_attention_kernel(llvm::Module& module, const AttentionSpec& spec, const KernelConfig& config,
                           const std::string& name) {
  AttentionEmitter(module, spec, config).emit(name);
}

// ------------------------------------------------------------------------------------------------
// emitter: setup

AttentionEmitter::AttentionEmitter(llvm::Module& module, const AttentionSpec& spec, const KernelConfig& config)
    : module_(module),
      ctx_(module.getContext()),
      b_(module.getContext()),
      spec_(spec),
      cfg_(config),
      lanes_(config.lanes),
      qv_(config.query_vectors),
      tile_(config.key_tile),
      qk_keys_(config.qk_keys),
      pv_dims_(config.pv_dims),
      rows_(config.query_rows()),
      dk_(spec.dk),
      dv_(spec.dv),
      mod_(effective_mod(spec)) {
  f32_ = b_.getFloatTy();
  i8_ = b_.getInt8Ty();
  i32_ = b_.getInt32Ty();
  i64_ = b_.getInt64Ty();
  ptr_ = b_.getPtrTy();
  vf_ = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(lanes_));
  vi32_ = llvm::FixedVectorType::get(i32_, static_cast<unsigned>(lanes_));
  vi64_ = llvm::FixedVectorType::get(i64_, static_cast<unsigned>(lanes_));
  vec_bytes_ = static_cast<std::uint64_t>(lanes_) * 4;
  half_ = spec.storage == DType::bf16 || spec.storage == DType::f16;
  brain_ = spec.storage == DType::bf16;
  compensated_ = !half_;
  bf16_exp_ = config.dpbf16 && config.scalef_exp2 && !spec.write_lse && !spec.write_weights;
  st_ = half_ ? b_.getInt16Ty() : f32_;
}

llvm::Function* AttentionEmitter::emit(const std::string& name) {
  declare(name);
  llvm::Value* saved_csr = flush_denormals(b_, cfg_);
  load_arguments();
  compute_geometry();
  allocate_state();
  pack_queries();
  init_state();
  if (!spec_.write_weights) {
    emit_tiles(Pass::online);
    store_output(Pass::online);
    store_lse();
  } else {
    // The weights need the final max and sum before any of them is written: one sweep for the
    // statistics, a second that recomputes the scores and writes exact probabilities.
    emit_tiles(Pass::stats);
    finish_stats();
    store_lse();
    emit_tiles(Pass::normalized);
    store_output(Pass::normalized);
  }
  restore_denormals(b_, saved_csr);
  b_.CreateRetVoid();
  return fn_;
}

void AttentionEmitter::declare(const std::string& name) {
  fn_ = declare_attention_function(module_, b_, cfg_, name, {ptr_, i64_, i64_, i64_});
  args_ = fn_->getArg(0);
  batch_ = fn_->getArg(1);
  head_ = fn_->getArg(2);
  q0_ = fn_->getArg(3);
  args_->setName("args");
  batch_->setName("batch");
  head_->setName("head");
  q0_->setName("q_begin");
}

void AttentionEmitter::load_arguments() {
  auto field = [&](std::size_t offset, llvm::Type* t, const char* name) {
    return load_args_field(b_, args_, offset, t, name);
  };
  llvm::Value* q = field(offsetof(AttentionArgs, q), ptr_, "q");
  llvm::Value* k = field(offsetof(AttentionArgs, k), ptr_, "k");
  llvm::Value* v = field(offsetof(AttentionArgs, v), ptr_, "v");
  llvm::Value* out = field(offsetof(AttentionArgs, out), ptr_, "out");
  len_q_ = field(offsetof(AttentionArgs, len_q), i64_, "L");
  len_k_ = field(offsetof(AttentionArgs, len_k), i64_, "S");
  nbatch_ = field(offsetof(AttentionArgs, batch), i64_, "B");

  // Base pointers of this task: query head h reads key/value head h / (hq / hkv).
  const std::int64_t group = spec_.hq / spec_.hkv;
  llvm::Value* kv_head = b_.CreateUDiv(head_, c64(group), "kv_head");
  llvm::Value* bh = b_.CreateAdd(b_.CreateMul(batch_, c64(spec_.hq)), head_, "bh");
  llvm::Value* row0 = b_.CreateAdd(b_.CreateMul(bh, len_q_), q0_, "row0");  // first row in [B·Hq·L]
  llvm::Value* kv_rows =
      b_.CreateMul(b_.CreateAdd(b_.CreateMul(batch_, c64(spec_.hkv)), kv_head), head_rows(b_, args_, len_k_));
  q_base_ = b_.CreateInBoundsGEP(st_, q, b_.CreateMul(row0, c64(dk_)), "q_base");
  k_base_ = b_.CreateInBoundsGEP(st_, k, b_.CreateMul(kv_rows, c64(dk_)), "k_base");
  v_base_ = b_.CreateInBoundsGEP(st_, v, b_.CreateMul(kv_rows, c64(dv_)), "v_base");
  o_base_ = b_.CreateInBoundsGEP(st_, out, b_.CreateMul(row0, c64(dv_)), "o_base");
  if (spec_.write_weights) {
    llvm::Value* w = field(offsetof(AttentionArgs, weights), ptr_, "weights");
    w_base_ = b_.CreateInBoundsGEP(f32_, w, b_.CreateMul(row0, len_k_), "w_base");
  }
  if (spec_.write_lse) lse_base_ = float_ptr(field(offsetof(AttentionArgs, lse), ptr_, "lse"), row0);

  // The mod's tensors: base pointers, extents and row-major strides.
  tensors_ = load_mod_tensors(b_, args_, mod_.tensors, nbatch_, len_q_, len_k_);
  if (spec_.dropout_p > 0) {
    seed_ = field(offsetof(AttentionArgs, seed), i64_, "seed");
    batch32_ = b_.CreateTrunc(batch_, i32_, "batch32");
    head32_ = b_.CreateTrunc(head_, i32_, "head32");
  }
}

void AttentionEmitter::compute_geometry() {
  nvalid_ = smin(c64(rows_), b_.CreateSub(len_q_, q0_));
  llvm::Value* tile = c64(tile_);
  ntiles_ = b_.CreateSDiv(b_.CreateAdd(len_k_, c64(tile_ - 1)), tile, "ntiles");
  nclean_ = b_.CreateSDiv(len_k_, tile, "nclean");  // tiles with no key past S
  len_qf_ = b_.CreateSIToFP(len_q_, f32_, "Lf");
  len_kf_ = b_.CreateSIToFP(len_k_, f32_, "Sf");
  batchf_ = b_.CreateSIToFP(batch_, f32_, "bf");

  for (int v = 0; v < qv_; ++v) {
    std::vector<llvm::Constant*> offsets;
    for (int lane = 0; lane < lanes_; ++lane)
      offsets.push_back(b_.getInt32(static_cast<std::uint32_t>(v * lanes_ + lane)));
    llvm::Value* rel = llvm::ConstantVector::get(offsets);
    lane_rows_.push_back(rel);
    valid_.push_back(b_.CreateICmpSLT(rel, splat(b_.CreateTrunc(nvalid_, i32_)), "valid"));
    if (spec_.write_weights) w_rows_.push_back(b_.CreateMul(b_.CreateZExt(rel, vi64_), splat(len_k_), "w_rows"));
    if (spec_.dropout_p > 0) abs_rows_.push_back(b_.CreateAdd(splat(b_.CreateTrunc(q0_, i32_)), rel, "rows32"));
    rows_f32_.push_back(b_.CreateSIToFP(b_.CreateAdd(splat(b_.CreateTrunc(q0_, i32_)), rel), vf_, "rows_f"));
  }
  prepare_mod();
}

void AttentionEmitter::allocate_state() {
  qt_ = ir::entry_alloca(b_, vf_, static_cast<std::uint64_t>(dk_ * qv_), kVectorAlign, "qt");  // [dk][R] Qᵀ
  ot_ = ir::entry_alloca(b_, vf_, static_cast<std::uint64_t>(dv_ * qv_), kVectorAlign, "ot");  // [dv][R] Oᵀ
  if (compensated_)
    ct_ = ir::entry_alloca(b_, vf_, static_cast<std::uint64_t>(dv_ * qv_), kVectorAlign, "ct");  // its rounding errors
  sp_ = ir::entry_alloca(b_, vf_, static_cast<std::uint64_t>(tile_ * qv_), kVectorAlign, "sp");  // [T][R] S, then P
  m_ = ir::entry_alloca(b_, vf_, static_cast<std::uint64_t>(qv_), kVectorAlign, "m");  // running max (log2 units)
  l_ = ir::entry_alloca(b_, vf_, static_cast<std::uint64_t>(qv_), kVectorAlign, "l");  // running sum
  m_use_ = ir::entry_alloca(b_, vf_, static_cast<std::uint64_t>(qv_), kVectorAlign, "m_use");  // final max, 0 if −inf
  inv_l_ = ir::entry_alloca(b_, vf_, static_cast<std::uint64_t>(qv_), kVectorAlign, "inv_l");  // 1/sum, 0 if sum == 0
  if (cfg_.dpbf16) {
    const auto pairs = static_cast<std::uint64_t>(tile_ / 2);
    spb_ = ir::entry_alloca(b_, vf_, pairs * static_cast<std::uint64_t>(qv_), kVectorAlign, "spb");  // [T/2][R]
    vp_ = ir::entry_alloca(b_, i32_, pairs * static_cast<std::uint64_t>(dv_), kVectorAlign, "vp");   // [T/2][dv]
  }
}

void AttentionEmitter::pack_queries() {
  // Qᵀ[d][v] = q[rows of vector v][d] · scale · log2 e; rows past L are 0 (their results are
  // never stored). With dpbf16: Qᵀ[p][v] = the bf16 pairs (d, d+1) = (2p, 2p+1) of the rows,
  // interleaved, unscaled (the scores are scaled after the dot products, so q is used exactly as
  // stored) — a pair is one 32-bit element of q's row.
  llvm::Value* factor = llvm::ConstantFP::get(vf_, spec_.effective_scale() * kLog2e);
  const bool pairs = cfg_.dpbf16;
  const std::int64_t columns = pairs ? dk_ / 2 : dk_;  // Qᵀ's rows: features, or pairs of them
  auto to_qt = [&](llvm::Value* x) {                   // a column of q (lanes = rows) as Qᵀ holds it
    if (pairs) return b_.CreateBitCast(x, vf_);
    if (half_) x = ir::half_to_f32(b_, x, brain_);
    return b_.CreateFMul(x, factor);
  };
  // Every row real: lanes_ × lanes_ blocks, each row's columns one contiguous load, transposed in
  // registers — strided gathers (and the scatters of store_output) are slow on AMD's cores: the
  // two transposes together gave fp32 +1.4 % on one core at N = 2 048, D = 64, bf16 +4-5 %.
  auto by_transpose = [&] {
    llvm::Type* elem = pairs ? i32_ : st_;
    llvm::Type* row_t = llvm::FixedVectorType::get(elem, static_cast<unsigned>(lanes_));
    ir::emit_loop(
        b_, c64(0), c64(columns), lanes_,
        [&](llvm::Value* c0) {
          for (int v = 0; v < qv_; ++v) {
            std::vector<llvm::Value*> rows;
            for (int r = 0; r < lanes_; ++r) {
              llvm::Value* at = b_.CreateInBoundsGEP(elem, q_base_, b_.CreateAdd(c0, c64((v * lanes_ + r) * columns)));
              rows.push_back(b_.CreateAlignedLoad(row_t, at, st_align()));
            }
            rows = ir::transpose_square(b_, std::move(rows));
            for (int j = 0; j < lanes_; ++j) store_at(vec_row(qt_, b_.CreateAdd(c0, c64(j))), v, to_qt(rows[j]));
          }
        },
        "pack");
  };
  // The task's last rows past L (or a width the blocks do not divide): a masked strided gather
  // per vector. Not inbounds: the lanes of rows past L point past the tensor.
  auto by_gather = [&] {
    llvm::Type* lane_t = llvm::FixedVectorType::get(st_, static_cast<unsigned>(lanes_));
    llvm::Value* zero = llvm::Constant::getNullValue(lane_t);
    auto gather = [&](llvm::Value* column, int v) {
      llvm::Value* ptrs = b_.CreateGEP(st_, column, lane_offsets(v, dk_));
      return b_.CreateMaskedGather(lane_t, ptrs, st_align(), valid_[v], zero);
    };
    const std::vector<int> interleave = ir::interleave_halves(lanes_);
    ir::emit_loop(
        b_, c64(0), c64(columns), 1,
        [&](llvm::Value* c) {
          llvm::Value* column = b_.CreateInBoundsGEP(st_, q_base_, pairs ? b_.CreateMul(c, c64(2)) : c);
          llvm::Value* row = vec_row(qt_, c);
          for (int v = 0; v < qv_; ++v) {
            llvm::Value* x = gather(column, v);
            if (pairs)
              x = b_.CreateShuffleVector(x, gather(b_.CreateConstInBoundsGEP1_64(st_, column, 1), v), interleave);
            store_at(row, v, to_qt(x));
          }
        },
        "pack");
  };
  if (columns % lanes_ == 0)
    if_every_row(by_transpose, by_gather);
  else
    by_gather();
}

void AttentionEmitter::if_every_row(const std::function<void()>& every, const std::function<void()>& some) {
  llvm::BasicBlock* every_bb = llvm::BasicBlock::Create(ctx_, "every_row", fn_);
  llvm::BasicBlock* some_bb = llvm::BasicBlock::Create(ctx_, "some_rows", fn_);
  llvm::BasicBlock* done = llvm::BasicBlock::Create(ctx_, "rows_done", fn_);
  b_.CreateCondBr(b_.CreateICmpEQ(nvalid_, c64(rows_)), every_bb, some_bb);
  b_.SetInsertPoint(every_bb);
  every();
  b_.CreateBr(done);
  b_.SetInsertPoint(some_bb);
  some();
  b_.CreateBr(done);
  b_.SetInsertPoint(done);
}

void AttentionEmitter::init_state() {
  b_.CreateMemSet(ot_, b_.getInt8(0), static_cast<std::uint64_t>(dv_ * rows_ * 4), llvm::MaybeAlign(kVectorAlign));
  if (compensated_)
    b_.CreateMemSet(ct_, b_.getInt8(0), static_cast<std::uint64_t>(dv_ * rows_ * 4), llvm::MaybeAlign(kVectorAlign));
  for (int v = 0; v < qv_; ++v) {
    store_vec(m_, c64(v), vconst(-std::numeric_limits<double>::infinity()));
    store_vec(l_, c64(v), vconst(0.0));
  }
}

void AttentionEmitter::emit_tiles(Pass pass) {
  const char* name = pass == Pass::online ? "tiles" : pass == Pass::stats ? "stats" : "exact";
  ir::emit_loop(b_, c64(0), ntiles_, 1, [&](llvm::Value* kt) { emit_tile(kt, pass); }, name);
}

void AttentionEmitter::finish_stats() {
  for (int v = 0; v < qv_; ++v) {
    llvm::Value* m = load_vec(m_, c64(v));
    llvm::Value* l = load_vec(l_, c64(v));
    store_vec(m_use_, c64(v),
              b_.CreateSelect(b_.CreateFCmpOEQ(m, vconst(-std::numeric_limits<double>::infinity())), vconst(0.0), m));
    store_vec(inv_l_, c64(v),
              b_.CreateSelect(b_.CreateFCmpOGT(l, vconst(0.0)), b_.CreateFDiv(vconst(1.0), l), vconst(0.0)));
  }
}

void AttentionEmitter::store_lse() {
  // lse[row] = (m + log2 l)·ln 2 (m is in log2 units, l = Σ 2^(s − m)); −inf where l = 0. The
  // rows of a task are contiguous: a masked vector store per vector of rows.
  if (!spec_.write_lse) return;
  for (int v = 0; v < qv_; ++v) {
    llvm::Value* m = load_vec(m_, c64(v));
    llvm::Value* l = load_vec(l_, c64(v));
    llvm::Value* log2l = emit_log2(b_, l);
    llvm::Value* value =
        b_.CreateSelect(b_.CreateFCmpOGT(l, vconst(0.0)), b_.CreateFMul(b_.CreateFAdd(m, log2l), vconst(kLn2)),
                        vconst(-std::numeric_limits<double>::infinity()), "lse");
    b_.CreateMaskedStore(value, float_ptr(lse_base_, c64(static_cast<std::int64_t>(v) * lanes_)), llvm::Align(4),
                         valid_[v]);
  }
}

void AttentionEmitter::zero_weights(llvm::Value* k0, llvm::Value* nk) {
  // An empty tile's keys get weight 0 in every valid row.
  llvm::Value* bytes = b_.CreateMul(nk, c64(4));
  ir::emit_loop(
      b_, c64(0), nvalid_, 1,
      [&](llvm::Value* r) {
        llvm::Value* row = b_.CreateInBoundsGEP(f32_, w_base_, b_.CreateAdd(b_.CreateMul(r, len_k_), k0));
        b_.CreateMemSet(row, b_.getInt8(0), bytes, llvm::MaybeAlign(4));
      },
      "weights.zero");
}

void AttentionEmitter::store_output(Pass pass) {
  // out[row][d] = Oᵀ[d][row] / l[row]; a row that saw no key (l = 0) gets zeros. After a
  // normalized sweep Oᵀ is already divided.
  std::vector<llvm::Value*> inv(static_cast<std::size_t>(qv_), nullptr);
  if (pass == Pass::online) {
    for (int v = 0; v < qv_; ++v) {
      llvm::Value* l = load_vec(l_, c64(v));
      inv[v] = b_.CreateSelect(b_.CreateFCmpOGT(l, vconst(0.0)), b_.CreateFDiv(vconst(1.0), l), vconst(0.0), "inv_l");
    }
  }
  auto finished = [&](llvm::Value* d, int v) {  // Oᵀ[d] of vector v's rows, as stored
    llvm::Value* x = load_at(vec_row(ot_, d), v);
    if (compensated_) x = b_.CreateFAdd(x, load_at(vec_row(ct_, d), v));  // the sum and what it lost
    if (inv[v]) x = b_.CreateFMul(x, inv[v]);
    return half_ ? ir::f32_to_half(b_, x, brain_) : x;
  };
  // Every row real: lanes_ × lanes_ blocks transposed in registers, a contiguous store per row
  // (as pack_queries loads them).
  auto by_transpose = [&] {
    ir::emit_loop(
        b_, c64(0), c64(dv_), lanes_,
        [&](llvm::Value* d0) {
          for (int v = 0; v < qv_; ++v) {
            std::vector<llvm::Value*> columns;
            for (int j = 0; j < lanes_; ++j) columns.push_back(finished(b_.CreateAdd(d0, c64(j)), v));
            columns = ir::transpose_square(b_, std::move(columns));
            for (int r = 0; r < lanes_; ++r)
              b_.CreateAlignedStore(columns[static_cast<std::size_t>(r)],
                                    b_.CreateInBoundsGEP(st_, o_base_, b_.CreateAdd(d0, c64((v * lanes_ + r) * dv_))),
                                    st_align());
          }
        },
        "store");
  };
  // The task's last rows past L (or a width the blocks do not divide): a masked strided scatter.
  auto by_scatter = [&] {
    ir::emit_loop(
        b_, c64(0), c64(dv_), 1,
        [&](llvm::Value* d) {
          llvm::Value* column = b_.CreateInBoundsGEP(st_, o_base_, d);
          for (int v = 0; v < qv_; ++v)
            b_.CreateMaskedScatter(finished(d, v), b_.CreateGEP(st_, column, lane_offsets(v, dv_)), st_align(),
                                   valid_[v]);
        },
        "store");
  };
  if (dv_ % lanes_ == 0)
    if_every_row(by_transpose, by_scatter);
  else
    by_scatter();
}

// ------------------------------------------------------------------------------------------------
// helpers

llvm::Value* AttentionEmitter::fma(llvm::Value* a, llvm::Value* x, llvm::Value* c) {
  return b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {a->getType()}, {a, x, c});
}
llvm::Value* AttentionEmitter::smin(llvm::Value* a, llvm::Value* x, const llvm::Twine& name) {
  return b_.CreateIntrinsic(llvm::Intrinsic::smin, {a->getType()}, {a, x}, nullptr, name);
}
llvm::Value* AttentionEmitter::smax(llvm::Value* a, llvm::Value* x, const llvm::Twine& name) {
  return b_.CreateIntrinsic(llvm::Intrinsic::smax, {a->getType()}, {a, x}, nullptr, name);
}

llvm::Value* AttentionEmitter::vec_ptr(llvm::AllocaInst* buffer, llvm::Value* index) {
  return b_.CreateInBoundsGEP(vf_, buffer, index);
}
llvm::Value* AttentionEmitter::load_vec(llvm::AllocaInst* buffer, llvm::Value* index) {
  return b_.CreateAlignedLoad(vf_, vec_ptr(buffer, index), llvm::Align(vec_bytes_));
}
void AttentionEmitter::store_vec(llvm::AllocaInst* buffer, llvm::Value* index, llvm::Value* value) {
  b_.CreateAlignedStore(value, vec_ptr(buffer, index), llvm::Align(vec_bytes_));
}
llvm::Value* AttentionEmitter::vec_row(llvm::AllocaInst* buffer, llvm::Value* row) {
  return b_.CreateInBoundsGEP(vf_, buffer, b_.CreateMul(row, c64(qv_), "", true, true));
}
llvm::Value* AttentionEmitter::load_at(llvm::Value* row, int v) {
  return b_.CreateAlignedLoad(vf_, b_.CreateConstInBoundsGEP1_64(vf_, row, static_cast<std::uint64_t>(v)),
                              llvm::Align(vec_bytes_));
}
void AttentionEmitter::store_at(llvm::Value* row, int v, llvm::Value* value) {
  b_.CreateAlignedStore(value, b_.CreateConstInBoundsGEP1_64(vf_, row, static_cast<std::uint64_t>(v)),
                        llvm::Align(vec_bytes_));
}
llvm::Value* AttentionEmitter::lane_offsets(int v, std::int64_t stride) {
  std::vector<llvm::Constant*> offsets;
  for (int lane = 0; lane < lanes_; ++lane)
    offsets.push_back(b_.getInt32(static_cast<std::uint32_t>((v * lanes_ + lane) * stride)));
  return llvm::ConstantVector::get(offsets);
}
llvm::Value* AttentionEmitter::float_ptr(llvm::Value* base, llvm::Value* index) {
  return b_.CreateInBoundsGEP(f32_, base, index);
}
llvm::Value* AttentionEmitter::load_float(llvm::Value* base, llvm::Value* index) {
  return b_.CreateLoad(f32_, float_ptr(base, index));
}
llvm::Value* AttentionEmitter::load_stored(llvm::Value* base, llvm::Value* index) {
  llvm::Value* x = b_.CreateLoad(st_, b_.CreateInBoundsGEP(st_, base, index));
  return half_ ? ir::half_to_f32(b_, x, brain_) : x;
}
llvm::Value* AttentionEmitter::dot_pairs(llvm::Value* acc, llvm::Value* a, llvm::Value* b) {
  return ir::dot_bf16_pairs(b_, acc, a, b);
}

}  // namespace qkv::codegen::cpu
