// What the NVPTX attention backward kernels share (attention_backward_common.hpp).
#include "nvptx/attention_backward_common.hpp"

#include <iterator>
#include <limits>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>

#include "llvm/mod_ir.hpp"
#include "llvm/philox_ir.hpp"
#include "llvm/vector_math.hpp"

namespace qkv::codegen::nvptx::detail {

namespace {

using Values = std::vector<llvm::Value*>;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// Each spec.tensor_grads entry's partial buffer (from the tensor table, after the extents) and
/// its tensor's element count (i64).
struct GradTable {
  Values partial, numel;
};

GradTable grad_table(KernelBuilder& kb, const cpu::AttentionSpec& spec, const BackwardParams& a) {
  auto& b = kb.b();
  const cpu::EffectiveMod mod = cpu::effective_mod(spec);
  const std::vector<ModTensorIn> in =
      mod_tensors(b, mod.tensors, a.keep, a.bias, a.tensors, a.extents, a.nbatch, a.len_q, a.len_k);
  const auto base = mod.tensors.size() - spec.tensors.size();  // the flags' tensors come first
  std::int64_t ranks = 0;
  for (const auto& t : spec.tensors) ranks += t.rank;
  GradTable out;
  for (std::size_t t = 0; t < spec.tensor_grads.size(); ++t) {
    llvm::Value* word = b.CreateConstInBoundsGEP1_64(kb.i64(), a.extents, static_cast<std::uint64_t>(ranks) + t);
    out.partial.push_back(b.CreateLoad(kb.ptr(), word, "partial"));
    llvm::Value* numel = kb.c64(1);
    for (llvm::Value* e : in.at(base + static_cast<std::size_t>(spec.tensor_grads[t].tensor)).extent)
      numel = b.CreateMul(numel, e);
    out.numel.push_back(numel);
  }
  return out;
}

}  // namespace

BackwardParams declare_attention_backward(KernelBuilder& kb, const std::string& name, const BackwardGeometry& g) {
  llvm::Type *p = kb.ptr(), *i64 = kb.i64();
  llvm::Function* fn = kb.declare_kernel(name, {p, p, p, p, p, p, p, p, p, p, p, p, p, p, i64, i64, i64, i64},
                                         {"q", "k", "v", "out", "d_out", "lse", "delta", "dq", "dk", "dv", "key_keep",
                                          "bias", "tensors", "extents", "batch", "len_q", "len_k", "seed"},
                                         g.threads, /*min_blocks=*/1);
  const bool dq = !g.dkdv && !g.dtensor;
  for (unsigned i = 0; i < 14; ++i) {
    fn->addParamAttr(i, llvm::Attribute::NoAlias);
    fn->addParamAttr(i, llvm::Attribute::NoCapture);
    const bool written = i == 7 || i == 8 || i == 9 || (i == 6 && dq);
    fn->addParamAttr(i, written ? llvm::Attribute::WriteOnly : llvm::Attribute::ReadOnly);
  }
  BackwardParams a;
  llvm::Value** params[] = {&a.q,  &a.k,    &a.v,    &a.out,     &a.d_out,   &a.lse,    &a.delta, &a.dq,    &a.dk,
                            &a.dv, &a.keep, &a.bias, &a.tensors, &a.extents, &a.nbatch, &a.len_q, &a.len_k, &a.seed};
  for (unsigned i = 0; i < std::size(params); ++i) *params[i] = fn->getArg(i);
  return a;
}

KernelInfo attention_backward_info(const std::string& name, const BackwardGeometry& g, const cpu::AttentionSpec& spec) {
  KernelInfo info;
  info.name = name;
  info.signature = attention_backward_params();
  info.grid_rule = g.dtensor ? "(" + std::to_string(kDtensorBlocks) + ", 1, 1)"
                   : g.dkdv
                       ? "(ceil(len_k / " + std::to_string(g.block_k) + "), " + std::to_string(spec.hkv) + ", batch)"
                       : "(ceil(len_q / " + std::to_string(g.block_q) + "), " + std::to_string(spec.hq) + ", batch)";
  info.block_x = g.threads;
  info.shared_bytes = g.shared_bytes();
  return info;
}

BackwardQueryTile backward_query_tile(KernelBuilder& kb, const cpu::AttentionSpec& spec, const BackwardGeometry& g,
                                      const BackwardParams& a, llvm::Value* batch, llvm::Value* head, llvm::Value* q0,
                                      const Values& local, int keys_per_thread, bool load_delta) {
  auto& b = kb.b();
  BackwardQueryTile t;
  t.q0 = q0;
  t.nvalid = kb.smin(kb.c64(g.block_q), b.CreateSub(a.len_q, q0));
  t.bh = b.CreateAdd(b.CreateMul(batch, kb.c64(spec.hq)), head, "bh");
  Values row_f32;
  llvm::Value* row_base = b.CreateMul(t.bh, a.len_q);
  for (llvm::Value* r : local) {
    llvm::Value* abs = b.CreateAdd(q0, b.CreateZExt(r, kb.i64()), "row_abs");
    t.abs.push_back(abs);
    row_f32.push_back(b.CreateSIToFP(abs, kb.f32(), "row_f"));
    llvm::Value* ok = b.CreateICmpSLT(abs, a.len_q, "row_ok");
    t.ok.push_back(ok);
    llvm::Value* at = b.CreateAdd(row_base, abs);
    // lse in log2 units; −inf for rows past L (so their P is 0)
    llvm::Value* lse = kb.guarded_load(ok, kb.f32(), b.CreateInBoundsGEP(kb.f32(), a.lse, at), kb.cf(kNegInf), "lse");
    t.lse2.push_back(b.CreateFMul(lse, kb.cf(kLog2e), "lse2"));
    if (load_delta)
      t.delta.push_back(kb.guarded_load(ok, kb.f32(), b.CreateInBoundsGEP(kb.f32(), a.delta, at), kb.cf(0.0), "delta"));
  }
  AttentionModFrame frame{a.keep, a.bias, a.tensors, a.extents, a.nbatch,  a.len_q,         a.len_k,
                          batch,  head,   q0,        t.nvalid,  g.block_k, keys_per_thread, std::move(row_f32)};
  t.mod = std::make_unique<AttentionModIr>(kb, spec, std::move(frame), /*derivative=*/true, g.dkdv);
  return t;
}

BackwardEntries backward_entries(KernelBuilder& kb, const cpu::AttentionSpec& spec, const BackwardGeometry& g,
                                 const BackwardParams& a, BackwardQueryTile& t, Values s, const Values& dp,
                                 const Values& key, llvm::Value* k0, llvm::Value* always, llvm::Value* batch32,
                                 llvm::Value* head32, TensorGradsPtx* grads, const std::function<Values()>& position) {
  auto& b = kb.b();
  AttentionModIr& mod = *t.mod;
  Values fprime;
  if (mod.has_score()) fprime = mod.derivative(s, key);
  const Values raw = s;
  llvm::Value* partial = b.CreateNot(always, "partial");
  llvm::Value* past_s = b.CreateICmpSGT(b.CreateAdd(k0, kb.c64(g.block_k)), a.len_k, "past_s");
  s = mod.apply(s, key, b.CreateOr(partial, past_s, "masked"), partial);

  const std::size_t R = t.abs.size(), KJ = key.size();
  BackwardEntries out{Values(s.size()), Values(s.size())};
  Values probs(s.size()), ds_raw(s.size());  // the tensor gradients' share: P and dS before f'
  const bool dropout = spec.dropout_p > 0;
  llvm::Value* f0 = kb.cf(0.0);
  for (std::size_t i = 0; i < R; ++i) {
    llvm::Value* visible_row = b.CreateFCmpONE(t.lse2[i], kb.cf(kNegInf));
    llvm::Value* row32 = b.CreateTrunc(t.abs[i], kb.i32());
    for (std::size_t j = 0; j < KJ; ++j) {
      const std::size_t e = i * KJ + j;
      llvm::Value* p = b.CreateSelect(visible_row, kb.ex2(b.CreateFSub(s[e], t.lse2[i])), f0, "p");
      llvm::Value* dpz = dp[e];
      llvm::Value* pz = p;
      if (dropout) {  // the forward's mask for (batch, head, row, key): Z = keep / (1 − p)
        llvm::Value* keep =
            cpu::emit_dropout_keep(b, spec.dropout_p, a.seed, batch32, head32, row32, b.CreateTrunc(key[j], kb.i32()));
        llvm::Value* z = b.CreateSelect(keep, kb.cf(1.0 / (1.0 - spec.dropout_p)), f0, "z");
        dpz = b.CreateFMul(dpz, z);
        pz = b.CreateFMul(p, z, "p_drop");
      }
      llvm::Value* ds = b.CreateFMul(p, b.CreateFSub(dpz, t.delta[i]), "ds");
      probs[e] = p;
      ds_raw[e] = ds;
      // f' only where P is not 0 (masked entries and keys past S have some f' of no meaning)
      if (!fprime.empty()) ds = b.CreateSelect(b.CreateFCmpUNE(p, f0), b.CreateFMul(ds, fprime[e]), f0, "ds_f");
      out.pz[e] = pz;
      out.ds[e] = ds;
    }
  }
  if (grads) grads->add(mod, probs, ds_raw, raw, key, position());
  return out;
}

TensorGradsPtx::TensorGradsPtx(KernelBuilder& kb, const cpu::AttentionSpec& spec, const BackwardGeometry& g,
                               const BackwardParams& a, llvm::Value* batch, llvm::Value* tid, llvm::Value* scratch)
    : kb_(kb), g_(g), tid_(tid) {
  auto& b = kb.b();
  auto zext = [&](llvm::Value* x) { return b.CreateZExt(x, kb.i64()); };
  // This block's slot: (batch, kv head, key tile) in the dkdv grid's order.
  llvm::Value* block = b.CreateAdd(
      b.CreateMul(b.CreateAdd(b.CreateMul(batch, kb.c64(spec.hkv)), zext(kb.ctaid_y())), zext(kb.nctaid_x())),
      zext(kb.ctaid_x()), "block");
  values_ = scratch;
  offsets_ = b.CreateConstInBoundsGEP1_64(kb.f32(), scratch, static_cast<std::uint64_t>(g.grad_entries));
  warp_sums_ = b.CreateConstInBoundsGEP1_64(kb.f32(), scratch, static_cast<std::uint64_t>(3 * g.grad_entries));
  const GradTable table = grad_table(kb, spec, a);
  for (std::size_t t = 0; t < table.partial.size(); ++t) {
    llvm::Value* slot =
        b.CreateInBoundsGEP(kb.f32(), table.partial[t], b.CreateMul(block, table.numel[t]), "tensor_grad_slot");
    slot_.push_back(slot);
    kb.loop(
        zext(tid), table.numel[t], g.threads,
        [&](llvm::Value* e) { b.CreateStore(kb.cf(0.0), b.CreateInBoundsGEP(kb.f32(), slot, e)); }, "zero_slot");
  }
}

void TensorGradsPtx::add(AttentionModIr& mod, const Values& p, const Values& ds, const Values& s, const Values& key,
                         const Values& position) {
  auto& b = kb_.b();
  llvm::Value* f0 = kb_.cf(0.0);
  llvm::Value* first = b.CreateICmpEQ(tid_, kb_.c32(0));
  for (std::size_t k = 0; k < mod.grad_loads().size(); ++k) {
    const AttentionModIr::GradLoad& load = mod.grad_loads()[k];
    const Values d = mod.load_derivative(k, s, key);
    const Values offset = mod.load_offsets(k, key);
    Values value(p.size());
    // Only where P is not 0 (masked entries and keys past S have derivatives of no meaning).
    for (std::size_t e = 0; e < p.size(); ++e)
      value[e] = b.CreateSelect(b.CreateFCmpUNE(p[e], f0), b.CreateFMul(ds[e], d[e]), f0, "dtensor");
    llvm::Value* slot = slot_.at(load.grad);
    auto add_at = [&](llvm::Value* at, llvm::Value* x) {
      llvm::Value* ptr = b.CreateInBoundsGEP(kb_.f32(), slot, at);
      b.CreateStore(b.CreateFAdd(b.CreateLoad(kb_.f32(), ptr), x), ptr);
    };
    if (load.uniform) {
      // The tile's sum: the thread's entries in order, the warp's butterfly, the warps in order.
      llvm::Value* sum = f0;
      for (llvm::Value* x : value) sum = b.CreateFAdd(sum, x);
      sum = kb_.group_sum(sum, 32);
      llvm::Value* warp = b.CreateLShr(tid_, kb_.c32(5));
      kb_.if_then(
          b.CreateICmpEQ(b.CreateAnd(tid_, kb_.c32(31)), kb_.c32(0)),
          [&] { b.CreateStore(sum, b.CreateInBoundsGEP(kb_.f32(), warp_sums_, warp)); }, "warp_sum");
      kb_.barrier();
      kb_.if_then(
          first,
          [&] {
            llvm::Value* total = f0;
            for (int w = 0; w < g_.warps; ++w)
              total = b.CreateFAdd(
                  total, b.CreateLoad(kb_.f32(),
                                      b.CreateConstInBoundsGEP1_32(kb_.f32(), warp_sums_, static_cast<unsigned>(w))));
            add_at(offset[0], total);
          },
          "tile_sum");
    } else {
      // Entry by entry, in the tile's row-major order, by thread 0.
      for (std::size_t e = 0; e < value.size(); ++e) {
        b.CreateStore(value[e], b.CreateInBoundsGEP(kb_.f32(), values_, position[e]));
        b.CreateStore(offset[e], b.CreateInBoundsGEP(kb_.i64(), offsets_, position[e]));
      }
      kb_.barrier();
      kb_.if_then(
          first,
          [&] {
            kb_.loop(
                kb_.c32(0), kb_.c32(g_.grad_entries), 1,
                [&](llvm::Value* at) {
                  add_at(b.CreateLoad(kb_.i64(), b.CreateInBoundsGEP(kb_.i64(), offsets_, at)),
                         b.CreateLoad(kb_.f32(), b.CreateInBoundsGEP(kb_.f32(), values_, at)));
                },
                "tile_entries", /*unroll=*/false);
          },
          "tile_add");
    }
    kb_.barrier();  // the scratch is free again
  }
}

KernelInfo build_attention_dtensor(llvm::Module& module, const AttentionBackwardKernel& request,
                                   const HostEmulation* emulation) {
  KernelBuilder kb(module, emulation);
  auto& b = kb.b();
  const cpu::AttentionSpec& spec = request.spec;
  const BackwardGeometry g = attention_backward_geometry(request);
  const std::string name = kernel_name(request);
  const BackwardParams a = declare_attention_backward(kb, name, g);
  // The dkdv grid's blocks: (ceil(S / block_k), Hkv, B), in slot order.
  llvm::Value* slots = b.CreateMul(
      b.CreateMul(b.CreateSDiv(b.CreateAdd(a.len_k, kb.c64(g.block_k - 1)), kb.c64(g.block_k)), kb.c64(spec.hkv)),
      a.nbatch, "slots");
  const GradTable table = grad_table(kb, spec, a);
  llvm::Value* threads = b.CreateZExt(kb.tid_x(), kb.i64());
  llvm::Value* start = b.CreateAdd(b.CreateMul(b.CreateZExt(kb.ctaid_x(), kb.i64()), kb.c64(g.threads)), threads);
  llvm::Value* stride = b.CreateMul(b.CreateZExt(kb.nctaid_x(), kb.i64()), kb.c64(g.threads));
  for (std::size_t t = 0; t < table.partial.size(); ++t) {
    llvm::Value *partial = table.partial[t], *numel = table.numel[t];
    kb.loop(
        start, numel, stride,
        [&](llvm::Value* e) {
          const Values sum = kb.loop(
              kb.c64(0), slots, 1, {kb.cf(0.0)},
              [&](llvm::Value* slot, const Values& acc) {
                llvm::Value* x = b.CreateLoad(
                    kb.f32(), b.CreateInBoundsGEP(kb.f32(), partial, b.CreateAdd(b.CreateMul(slot, numel), e)));
                return Values{b.CreateFAdd(acc[0], x)};
              },
              "slots", /*unroll=*/false);
          b.CreateStore(sum[0], b.CreateInBoundsGEP(kb.f32(), partial, e));
        },
        "entries");
  }
  b.CreateRetVoid();
  return attention_backward_info(name, g, spec);
}

}  // namespace qkv::codegen::nvptx::detail
