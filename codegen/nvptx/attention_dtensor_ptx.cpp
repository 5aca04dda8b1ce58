// The gradients of the tensors a mod reads in the NVPTX attention backward
// (attention_dtensor_ptx.hpp).
#include "nvptx/attention_dtensor_ptx.hpp"

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>

#include "llvm/mod_ir.hpp"
#include "nvptx/attention_mod_ptx.hpp"

namespace qkv::codegen::nvptx::detail {

namespace {

using Values = std::vector<llvm::Value*>;

/// Each spec.tensor_grads entry's partial buffer (from the tensor table, after the extents) and
/// its tensor's element count (i64).
struct GradTable {
  Values partial, numel;
};

GradTable grad_table(KernelBuilder& kb, const cpu::AttentionSpec& spec, llvm::Value* keep, llvm::Value* bias,
                     llvm::Value* tensors, llvm::Value* extents, llvm::Value* nbatch, llvm::Value* len_q,
                     llvm::Value* len_k) {
  auto& b = kb.b();
  const cpu::EffectiveMod mod = cpu::effective_mod(spec);
  const std::vector<ModTensorIn> in = mod_tensors(b, mod.tensors, keep, bias, tensors, extents, nbatch, len_q, len_k);
  const auto base = mod.tensors.size() - spec.tensors.size();  // the flags' tensors come first
  std::int64_t ranks = 0;
  for (const auto& t : spec.tensors) ranks += t.rank;
  GradTable out;
  for (std::size_t t = 0; t < spec.tensor_grads.size(); ++t) {
    llvm::Value* word = b.CreateConstInBoundsGEP1_64(kb.i64(), extents, static_cast<std::uint64_t>(ranks) + t);
    out.partial.push_back(b.CreateLoad(kb.ptr(), word, "partial"));
    llvm::Value* numel = kb.c64(1);
    for (llvm::Value* e : in.at(base + static_cast<std::size_t>(spec.tensor_grads[t].tensor)).extent)
      numel = b.CreateMul(numel, e);
    out.numel.push_back(numel);
  }
  return out;
}

}  // namespace

TensorGradsPtx::TensorGradsPtx(KernelBuilder& kb, const cpu::AttentionSpec& spec, const BackwardGeometry& g,
                               llvm::Value* keep, llvm::Value* bias, llvm::Value* tensors, llvm::Value* extents,
                               llvm::Value* nbatch, llvm::Value* len_q, llvm::Value* len_k, llvm::Value* block,
                               llvm::Value* tid, llvm::Value* scratch)
    : kb_(kb), g_(g), tid_(tid) {
  auto& b = kb.b();
  values_ = scratch;
  offsets_ = b.CreateConstInBoundsGEP1_64(kb.f32(), scratch, static_cast<std::uint64_t>(g.grad_entries));
  warp_sums_ = b.CreateConstInBoundsGEP1_64(kb.f32(), scratch, static_cast<std::uint64_t>(3 * g.grad_entries));
  const GradTable table = grad_table(kb, spec, keep, bias, tensors, extents, nbatch, len_q, len_k);
  for (std::size_t t = 0; t < table.partial.size(); ++t) {
    llvm::Value* slot =
        b.CreateInBoundsGEP(kb.f32(), table.partial[t], b.CreateMul(block, table.numel[t]), "tensor_grad_slot");
    slot_.push_back(slot);
    kb.loop(
        b.CreateZExt(tid, kb.i64()), table.numel[t], g.threads,
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
  llvm::Function* fn = declare_attention_backward_entry(kb, name, g);
  auto arg = [&](unsigned i) { return fn->getArg(i); };
  llvm::Value *nbatch = arg(14), *len_q = arg(15), *len_k = arg(16);
  // The dkdv grid's blocks: (ceil(S / block_k), Hkv, B), in slot order.
  llvm::Value* slots = b.CreateMul(
      b.CreateMul(b.CreateSDiv(b.CreateAdd(len_k, kb.c64(g.block_k - 1)), kb.c64(g.block_k)), kb.c64(spec.hkv)), nbatch,
      "slots");
  const GradTable table = grad_table(kb, spec, arg(10), arg(11), arg(12), arg(13), nbatch, len_q, len_k);
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
