// The split-KV decode attention and its merge for NVPTX (nvptx.hpp: DecodeAttentionKernel,
// DecodeMergeKernel) — the GPU counterpart of codegen/cpu/kernels/decode_kernel.cpp.
//
// Block (chunk, unit) = (ctaid.x, ctaid.y), unit = (batch · Hkv + kv head) · L + i. Warp w takes
// keys c0 + w, c0 + w + W, … of the chunk; lane ℓ holds the head dimensions ℓ, ℓ + 32, … of the
// block's G query rows (pre-scaled by scale · log2 e: scores in log2 units) and of their output
// accumulators. Per key: the K row and the V row (coalesced: 32 consecutive floats per load), for
// each head r the dot product as a butterfly sum over the warp, the mod (the key coordinate and
// everything else scalars), then the online step m' = max(m, s), α = 2^(m − m'), p = 2^(s − m'),
// l' = α·l + p, O' = α·O + p·V — warp-uniform, no barrier inside the key loop. The warps' (m, l,
// O) go to shared memory and are combined like chunks: M = max m_w, weights 2^(m_w − M).
#include <limits>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>

#include <qkv/ir/error.hpp>

#include "llvm/mod_ir.hpp"
#include "llvm/vector_math.hpp"
#include "nvptx/geometry.hpp"
#include "nvptx/kernel_builder.hpp"

namespace qkv::codegen::nvptx::detail {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
using Values = std::vector<llvm::Value*>;

std::int64_t slots(std::int64_t width) { return (width + 31) / 32; }  // per lane

/// What both kernels compute from (batch, kv head, i): the rows' flat indices and the finishing
/// of a row from its (max, sum, output) — the chunk kernel's single-chunk path and the merge.
class DecodeCommon {
 public:
  DecodeCommon(KernelBuilder& kb, const cpu::AttentionSpec& spec) : kb_(kb), b_(kb.b()), spec_(spec) {}

  /// unit → i, batch, kv head (i64), with L = len_q.
  void decode_unit(llvm::Value* unit, llvm::Value* len_q) {
    len_q_ = len_q;
    query_ = b_.CreateURem(unit, len_q, "i");
    llvm::Value* rest = b_.CreateUDiv(unit, len_q);
    kv_head_ = b_.CreateURem(rest, kb_.c64(spec_.hkv), "kv_head");
    batch_ = b_.CreateUDiv(rest, kb_.c64(spec_.hkv), "batch");
  }
  /// The flat query head of row r (i64 value r).
  llvm::Value* head(llvm::Value* r) { return b_.CreateAdd(b_.CreateMul(kv_head_, kb_.c64(group())), r); }
  /// Row r's index (b·Hq + h)·L + i into [B, Hq, L].
  llvm::Value* row(llvm::Value* r) {
    return b_.CreateAdd(b_.CreateMul(b_.CreateAdd(b_.CreateMul(batch_, kb_.c64(spec_.hq)), head(r)), len_q_), query_);
  }
  std::int64_t group() const { return spec_.hq / spec_.hkv; }

  /// out[row(r)][d] = o / l (0 when l = 0); with d == 0 and write_lse, lse = (m + lg2 l)·ln 2 or −inf.
  void finish(llvm::Value* out, llvm::Value* lse, llvm::Value* r, llvm::Value* d, llvm::Value* m, llvm::Value* l,
              llvm::Value* o) {
    llvm::Value* seen = b_.CreateFCmpOGT(l, kb_.cf(0.0));
    llvm::Value* inv = b_.CreateSelect(seen, b_.CreateFDiv(kb_.cf(1.0), l), kb_.cf(0.0));
    llvm::Value* rw = row(r);
    b_.CreateStore(b_.CreateFMul(o, inv),
                   b_.CreateInBoundsGEP(kb_.f32(), out, b_.CreateAdd(b_.CreateMul(rw, kb_.c64(spec_.dv)), d)));
    if (!spec_.write_lse) return;
    kb_.if_then(
        b_.CreateICmpEQ(d, kb_.c64(0)),
        [&] {
          llvm::Value* v =
              b_.CreateSelect(seen, b_.CreateFMul(b_.CreateFAdd(m, kb_.lg2(l)), kb_.cf(kLn2)), kb_.cf(kNegInf));
          b_.CreateStore(v, b_.CreateInBoundsGEP(kb_.f32(), lse, rw));
        },
        "lse");
  }

  llvm::Value *query_ = nullptr, *kv_head_ = nullptr, *batch_ = nullptr, *len_q_ = nullptr;

 private:
  KernelBuilder& kb_;
  llvm::IRBuilder<>& b_;
  const cpu::AttentionSpec& spec_;
};

class DecodePtx {
 public:
  DecodePtx(llvm::Module& module, const DecodeAttentionKernel& request, const HostEmulation* emulation)
      : kb_(module, emulation),
        b_(kb_.b()),
        spec_(request.spec),
        threads_(request.threads),
        warps_(request.threads / 32),
        common_(kb_, spec_),
        G_(spec_.hq / spec_.hkv),
        DK_(slots(spec_.dk)),
        DV_(slots(spec_.dv)),
        mod_(cpu::effective_mod(spec_)) {
    info_ = analyse_mod(mod_.expr, mod_.axes.query, mod_.axes.key);
  }

  KernelInfo emit(const std::string& name);

 private:
  class Leaves;
  llvm::Value* axis_value(int r, const std::string& axis, llvm::Value* key, bool position);
  llvm::Value* score(int r, llvm::Value* s, llvm::Value* key);  // mods, then −inf where not kept
  llvm::Value* c64(std::int64_t v) { return kb_.c64(v); }
  llvm::Value* at(llvm::Value* base, llvm::Value* index) { return b_.CreateInBoundsGEP(kb_.f32(), base, index); }

  KernelBuilder kb_;
  llvm::IRBuilder<>& b_;
  const cpu::AttentionSpec& spec_;
  int threads_, warps_;
  DecodeCommon common_;
  std::int64_t G_, DK_, DV_;
  cpu::EffectiveMod mod_;
  ModAnalysis info_;
  std::vector<ModTensorIn> tensors_;
  llvm::Value *len_qf_ = nullptr, *len_kf_ = nullptr, *nbatch_ = nullptr, *batchf_ = nullptr;
};

class DecodePtx::Leaves final : public Log2ScoreLeaves {
 public:
  Leaves(DecodePtx& k, int r, llvm::Value* key, llvm::Value* score_log2)
      : Log2ScoreLeaves(k.b_, score_log2, "nvptx decode attention"), k_(k), r_(r), key_(key) {}
  llvm::Value* exp2(llvm::Value* x) override { return k_.kb_.ex2(x); }
  llvm::Value* exp(llvm::Value* x) override { return k_.kb_.ex2(k_.b_.CreateFMul(x, k_.kb_.cf(kLog2e))); }
  llvm::Value* log(llvm::Value* x) override { return k_.b_.CreateFMul(k_.kb_.lg2(x), k_.kb_.cf(kLn2)); }
  llvm::Value* index(const std::string& axis) override { return k_.axis_value(r_, axis, key_, false); }
  llvm::Value* position(const std::string& axis) override { return k_.axis_value(r_, axis, key_, true); }
  llvm::Value* length(const std::string& axis) override {
    return mod_axis_length(k_.b_, k_.mod_.axes, axis, k_.len_qf_, k_.len_kf_, k_.nbatch_);
  }
  llvm::Value* load(const ModNode& n, const std::vector<llvm::Value*>& at) override {
    return load_mod_element(k_.b_, k_.tensors_.at(static_cast<std::size_t>(n.input)),
                            k_.mod_.tensors.at(static_cast<std::size_t>(n.input)).dtype, at, 1);
  }
  llvm::Value* extent(const ModNode& n, std::size_t d) override {
    return k_.tensors_.at(static_cast<std::size_t>(n.input)).extent_f32.at(d);
  }

 private:
  DecodePtx& k_;
  int r_;
  llvm::Value* key_;
};

llvm::Value* DecodePtx::axis_value(int r, const std::string& axis, llvm::Value* key, bool position) {
  const cpu::ModAxes& a = mod_.axes;
  if (axis == a.query) {
    llvm::Value* x = b_.CreateSIToFP(common_.query_, kb_.f32());
    if (position && mod_.expr.shifts(axis)) x = b_.CreateFAdd(x, b_.CreateFSub(len_kf_, len_qf_));
    return x;
  }
  if (axis == a.key) {
    if (!key) internal_error("nvptx decode attention: a key coordinate outside the key loop");
    return b_.CreateSIToFP(key, kb_.f32());
  }
  if (axis == a.batch) return batchf_;
  if (llvm::Value* c = mod_head_coordinate(b_, a, axis, common_.head(c64(r)))) return c;
  internal_error("nvptx decode attention: a mod names the axis `" + axis + "`, which the scores do not have");
}

llvm::Value* DecodePtx::score(int r, llvm::Value* s, llvm::Value* key) {
  const ModExpr& e = mod_.expr;
  if (e.empty()) return s;
  auto value = [&](int root, llvm::Value* sc) {
    std::vector<llvm::Value*> cache(e.nodes.size(), nullptr);
    Leaves leaves(*this, r, key, sc);
    return emit_mod(b_, e, root, leaves, cache);
  };
  Leaves leaves(*this, r, key, s);
  s = modified_score_log2(b_, e, info_, s, leaves, value);
  if (e.keep < 0) return s;
  llvm::Value* k = value(e.keep, nullptr);
  if (k->getType()->isFloatingPointTy()) k = b_.CreateFCmpUNE(k, kb_.cf(0.0));  // a literal
  return b_.CreateSelect(k, s, kb_.cf(kNegInf));
}

KernelInfo DecodePtx::emit(const std::string& name) {
  llvm::Type *p = kb_.ptr(), *i64 = kb_.i64();
  llvm::Function* fn = kb_.declare_kernel(name, {p, p, p, p, p, p, p, p, i64, i64, i64, p, i64, p},
                                          {"q", "k", "v", "out", "key_keep", "bias", "tensors", "extents", "batch",
                                           "len_q", "len_k", "lse", "chunk_len", "partials"},
                                          threads_, /*min_blocks=*/1);
  llvm::Value *q = fn->getArg(0), *k = fn->getArg(1), *v = fn->getArg(2), *out = fn->getArg(3);
  llvm::Value *keep = fn->getArg(4), *bias = fn->getArg(5), *table = fn->getArg(6), *extents = fn->getArg(7);
  nbatch_ = fn->getArg(8);
  llvm::Value *len_q = fn->getArg(9), *len_k = fn->getArg(10), *lse = fn->getArg(11);
  llvm::Value *chunk_len = fn->getArg(12), *partials = fn->getArg(13);
  llvm::Value* smem = kb_.dynamic_shared("qkv_decode_smem");

  llvm::Value* tid = b_.CreateZExt(kb_.tid_x(), i64);
  llvm::Value* warp = b_.CreateLShr(tid, c64(5), "warp");
  llvm::Value* lane = b_.CreateAnd(tid, c64(31), "lane");
  llvm::Value* chunk = b_.CreateZExt(kb_.ctaid_x(), i64, "chunk");
  llvm::Value* chunks = b_.CreateZExt(kb_.nctaid_x(), i64, "chunks");
  llvm::Value* unit = b_.CreateZExt(kb_.ctaid_y(), i64, "unit");
  common_.decode_unit(unit, len_q);
  len_qf_ = b_.CreateSIToFP(len_q, kb_.f32());
  len_kf_ = b_.CreateSIToFP(len_k, kb_.f32());
  batchf_ = b_.CreateSIToFP(common_.batch_, kb_.f32());
  tensors_ = mod_tensors(b_, mod_.tensors, keep, bias, table, extents, nbatch_, len_q, len_k);

  // The lane's slots of the rows' queries (· scale · log2 e; 0 past dk).
  llvm::Value* factor = kb_.cf(spec_.effective_scale() * kLog2e);
  Values qr;
  for (std::int64_t r = 0; r < G_; ++r) {
    llvm::Value* base = at(q, b_.CreateMul(common_.row(c64(r)), c64(spec_.dk)));
    for (std::int64_t t = 0; t < DK_; ++t) {
      llvm::Value* d = b_.CreateAdd(lane, c64(32 * t));
      llvm::Value* x = kb_.guarded_load(b_.CreateICmpSLT(d, c64(spec_.dk)), kb_.f32(), at(base, d), kb_.cf(0.0), "q");
      qr.push_back(b_.CreateFMul(x, factor));
    }
  }
  llvm::Value* kv_rows =
      b_.CreateMul(b_.CreateAdd(b_.CreateMul(common_.batch_, c64(spec_.hkv)), common_.kv_head_), len_k, "kv_rows");
  llvm::Value* k_base = at(k, b_.CreateMul(kv_rows, c64(spec_.dk)));
  llvm::Value* v_base = at(v, b_.CreateMul(kv_rows, c64(spec_.dv)));
  llvm::Value* c0 = b_.CreateMul(chunk, chunk_len, "c0");
  llvm::Value* c1 = kb_.smin(b_.CreateAdd(c0, chunk_len), len_k);

  // Carried per warp: m[G], l[G], then O[G][DV] (this lane's slots).
  Values init(static_cast<std::size_t>(G_), kb_.cf(kNegInf));
  init.insert(init.end(), static_cast<std::size_t>(G_), kb_.cf(0.0));
  init.insert(init.end(), static_cast<std::size_t>(G_ * DV_), kb_.cf(0.0));
  Values acc = kb_.loop(
      b_.CreateAdd(c0, warp), c1, warps_, init,
      [&](llvm::Value* key, const Values& in) {
        Values nx = in;
        llvm::Value* krow = at(k_base, b_.CreateMul(key, c64(spec_.dk)));
        llvm::Value* vrow = at(v_base, b_.CreateMul(key, c64(spec_.dv)));
        Values kv, vv;
        for (std::int64_t t = 0; t < DK_; ++t) {
          llvm::Value* d = b_.CreateAdd(lane, c64(32 * t));
          kv.push_back(kb_.guarded_load(b_.CreateICmpSLT(d, c64(spec_.dk)), kb_.f32(), at(krow, d), kb_.cf(0.0), "k"));
        }
        for (std::int64_t t = 0; t < DV_; ++t) {
          llvm::Value* d = b_.CreateAdd(lane, c64(32 * t));
          vv.push_back(kb_.guarded_load(b_.CreateICmpSLT(d, c64(spec_.dv)), kb_.f32(), at(vrow, d), kb_.cf(0.0), "v"));
        }
        for (std::int64_t r = 0; r < G_; ++r) {
          llvm::Value* s = kb_.cf(0.0);
          for (std::int64_t t = 0; t < DK_; ++t) s = kb_.fma(qr[static_cast<std::size_t>(r * DK_ + t)], kv[t], s);
          s = score(static_cast<int>(r), kb_.group_sum(s, 32), key);
          llvm::Value*& m = nx[static_cast<std::size_t>(r)];
          llvm::Value*& l = nx[static_cast<std::size_t>(G_ + r)];
          llvm::Value* m_new = b_.CreateMaxNum(m, s, "m_new");
          llvm::Value* m_use = b_.CreateSelect(b_.CreateFCmpOEQ(m_new, kb_.cf(kNegInf)), kb_.cf(0.0), m_new);
          llvm::Value* alpha = kb_.ex2(b_.CreateFSub(m, m_use));
          llvm::Value* pr = kb_.ex2(b_.CreateFSub(s, m_use));
          l = kb_.fma(l, alpha, pr);
          m = m_new;
          for (std::int64_t t = 0; t < DV_; ++t) {
            llvm::Value*& o = nx[static_cast<std::size_t>(2 * G_ + r * DV_ + t)];
            o = kb_.fma(o, alpha, b_.CreateFMul(pr, vv[t]));
          }
        }
        return nx;
      },
      "keys", /*unroll=*/false);

  // Shared memory: per warp and row, [m, l, O[dv]].
  const std::int64_t rec = cpu::decode_record_floats(spec_);
  for (std::int64_t r = 0; r < G_; ++r) {
    llvm::Value* slot = at(smem, b_.CreateMul(b_.CreateAdd(b_.CreateMul(warp, c64(G_)), c64(r)), c64(rec)));
    kb_.if_then(
        b_.CreateICmpEQ(lane, c64(0)),
        [&] {
          b_.CreateStore(acc[static_cast<std::size_t>(r)], slot);
          b_.CreateStore(acc[static_cast<std::size_t>(G_ + r)], at(slot, c64(1)));
        },
        "stats");
    for (std::int64_t t = 0; t < DV_; ++t) {
      llvm::Value* d = b_.CreateAdd(lane, c64(32 * t));
      kb_.if_then(
          b_.CreateICmpSLT(d, c64(spec_.dv)),
          [&] {
            b_.CreateStore(acc[static_cast<std::size_t>(2 * G_ + r * DV_ + t)], at(slot, b_.CreateAdd(d, c64(2))));
          },
          "o");
    }
  }
  kb_.barrier();

  // The warps combined, one (row, column) per thread in turn.
  llvm::Value* is_direct = b_.CreateIsNull(partials);
  kb_.loop(
      tid, c64(G_ * spec_.dv), threads_,
      [&](llvm::Value* idx) {
        llvm::Value* r = b_.CreateUDiv(idx, c64(spec_.dv), "r");
        llvm::Value* d = b_.CreateURem(idx, c64(spec_.dv), "d");
        auto slot = [&](std::int64_t w) { return at(smem, b_.CreateMul(b_.CreateAdd(c64(w * G_), r), c64(rec))); };
        llvm::Value* big = kb_.cf(kNegInf);
        for (int w = 0; w < warps_; ++w) big = b_.CreateMaxNum(big, b_.CreateLoad(kb_.f32(), slot(w)));
        llvm::Value* m_use = b_.CreateSelect(b_.CreateFCmpOEQ(big, kb_.cf(kNegInf)), kb_.cf(0.0), big);
        llvm::Value* l = kb_.cf(0.0);
        llvm::Value* o = kb_.cf(0.0);
        for (int w = 0; w < warps_; ++w) {
          llvm::Value* sw = slot(w);
          llvm::Value* wt = kb_.ex2(b_.CreateFSub(b_.CreateLoad(kb_.f32(), sw), m_use));
          l = kb_.fma(wt, b_.CreateLoad(kb_.f32(), at(sw, c64(1))), l);
          o = kb_.fma(wt, b_.CreateLoad(kb_.f32(), at(sw, b_.CreateAdd(d, c64(2)))), o);
        }
        llvm::BasicBlock* direct = llvm::BasicBlock::Create(kb_.ctx(), "direct", kb_.fn());
        llvm::BasicBlock* record = llvm::BasicBlock::Create(kb_.ctx(), "record", kb_.fn());
        llvm::BasicBlock* done = llvm::BasicBlock::Create(kb_.ctx(), "stored", kb_.fn());
        b_.CreateCondBr(is_direct, direct, record);
        b_.SetInsertPoint(direct);
        common_.finish(out, lse, r, d, m_use, l, o);
        b_.CreateBr(done);
        b_.SetInsertPoint(record);
        llvm::Value* index =
            b_.CreateAdd(b_.CreateMul(b_.CreateAdd(b_.CreateMul(unit, c64(G_)), r), chunks), chunk, "record");
        llvm::Value* dst = at(partials, b_.CreateMul(index, c64(rec)));
        b_.CreateStore(o, at(dst, b_.CreateAdd(d, c64(2))));
        kb_.if_then(
            b_.CreateICmpEQ(d, c64(0)),
            [&] {
              b_.CreateStore(big, dst);
              b_.CreateStore(l, at(dst, c64(1)));
            },
            "record.stats");
        b_.CreateBr(done);
        b_.SetInsertPoint(done);
      },
      "combine");
  b_.CreateRetVoid();

  KernelInfo info;
  info.name = name;
  info.signature = decode_attention_params();
  info.grid_rule = "(chunks, batch * " + std::to_string(spec_.hkv) + " * len_q, 1) from decode_split";
  info.block_x = threads_;
  info.shared_bytes = static_cast<int>(warps_ * G_ * rec * 4);
  return info;
}

}  // namespace

KernelInfo build_decode_attention(llvm::Module& module, const DecodeAttentionKernel& request,
                                  const HostEmulation* emulation) {
  std::string why;
  if (!decode_attention_supported(request.spec, &why)) throw std::runtime_error("nvptx decode attention: " + why);
  check_threads(request.threads, 512, "decode attention");
  return DecodePtx(module, request, emulation).emit(kernel_name(request));
}

KernelInfo build_decode_merge(llvm::Module& module, const DecodeMergeKernel& request, const HostEmulation* emulation) {
  std::string why;
  if (!decode_attention_supported(request.spec, &why)) throw std::runtime_error("nvptx decode merge: " + why);
  check_threads(request.threads, 1024, "decode merge");
  KernelBuilder kb(module, emulation);
  llvm::IRBuilder<>& b = kb.b();
  const cpu::AttentionSpec& spec = request.spec;
  llvm::Type *p = kb.ptr(), *i64 = kb.i64();
  llvm::Function* fn = kb.declare_kernel(kernel_name(request), {p, p, p, i64, i64, i64},
                                         {"out", "lse", "partials", "batch", "len_q", "chunks"}, request.threads);
  llvm::Value *out = fn->getArg(0), *lse = fn->getArg(1), *partials = fn->getArg(2), *len_q = fn->getArg(4),
              *chunks = fn->getArg(5);
  DecodeCommon common(kb, spec);
  llvm::Value* unit = b.CreateZExt(kb.ctaid_x(), i64, "unit");
  common.decode_unit(unit, len_q);
  const std::int64_t G = common.group(), rec = cpu::decode_record_floats(spec);
  auto at = [&](llvm::Value* base, llvm::Value* index) { return b.CreateInBoundsGEP(kb.f32(), base, index); };
  kb.loop(
      b.CreateZExt(kb.tid_x(), i64), kb.c64(G * spec.dv), request.threads,
      [&](llvm::Value* idx) {
        llvm::Value* r = b.CreateUDiv(idx, kb.c64(spec.dv), "r");
        llvm::Value* d = b.CreateURem(idx, kb.c64(spec.dv), "d");
        llvm::Value* base =
            at(partials, b.CreateMul(b.CreateMul(b.CreateAdd(b.CreateMul(unit, kb.c64(G)), r), chunks), kb.c64(rec)));
        auto field = [&](llvm::Value* c, llvm::Value* offset) {
          return b.CreateLoad(kb.f32(), at(base, b.CreateAdd(b.CreateMul(c, kb.c64(rec)), offset)));
        };
        llvm::Value* big = kb.loop(
            kb.c64(0), chunks, 1, {kb.cf(kNegInf)},
            [&](llvm::Value* c, const Values& in) -> Values { return {b.CreateMaxNum(in[0], field(c, kb.c64(0)))}; },
            "merge.max")[0];
        llvm::Value* m_use = b.CreateSelect(b.CreateFCmpOEQ(big, kb.cf(kNegInf)), kb.cf(0.0), big);
        Values lo = kb.loop(
            kb.c64(0), chunks, 1, {kb.cf(0.0), kb.cf(0.0)},
            [&](llvm::Value* c, const Values& in) -> Values {
              llvm::Value* w = kb.ex2(b.CreateFSub(field(c, kb.c64(0)), m_use));
              return {kb.fma(w, field(c, kb.c64(1)), in[0]), kb.fma(w, field(c, b.CreateAdd(d, kb.c64(2))), in[1])};
            },
            "merge.sum");
        common.finish(out, lse, r, d, m_use, lo[0], lo[1]);
      },
      "rows");
  b.CreateRetVoid();
  KernelInfo info;
  info.name = kernel_name(request);
  info.signature = decode_merge_params();
  info.grid_rule = "(batch * " + std::to_string(spec.hkv) + " * len_q, 1, 1)";
  info.block_x = request.threads;
  return info;
}

}  // namespace qkv::codegen::nvptx::detail
