// KernelBuilder: the NVPTX plumbing shared by the kernel generators.
#include "nvptx/kernel_builder.hpp"

#include <llvm/IR/BasicBlock.h>
#include <llvm/IR/CallingConv.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/Metadata.h>

#include <algorithm>
#include <stdexcept>

#include "llvm/ir_util.hpp"

namespace qkv::codegen::nvptx::detail {

KernelBuilder::KernelBuilder(llvm::Module& module, const HostEmulation* emulation)
    : module_(module), ctx_(module.getContext()), b_(ctx_), emu_(emulation) {}

llvm::Value* KernelBuilder::host_call(const void* fn, llvm::Type* ret, llvm::ArrayRef<llvm::Value*> args) {
  std::vector<llvm::Type*> types;
  for (llvm::Value* a : args) types.push_back(a->getType());
  auto* type = llvm::FunctionType::get(ret, types, false);
  llvm::Value* callee =
      llvm::ConstantExpr::getIntToPtr(b_.getInt64(reinterpret_cast<std::uintptr_t>(fn)), b_.getPtrTy());
  return b_.CreateCall(type, callee, args);
}

llvm::Function* KernelBuilder::declare_kernel(const std::string& name, const std::vector<llvm::Type*>& params,
                                              const std::vector<std::string>& names, int max_threads, int min_blocks) {
  auto* type = llvm::FunctionType::get(b_.getVoidTy(), params, false);
  fn_ = llvm::Function::Create(type, llvm::GlobalValue::ExternalLinkage, name, module_);
  fn_->addFnAttr(llvm::Attribute::NoUnwind);
  for (unsigned i = 0; i < fn_->arg_size() && i < names.size(); ++i) fn_->getArg(i)->setName(names[i]);
  if (emu_) {  // a plain host function
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));
    return fn_;
  }
  fn_->setCallingConv(llvm::CallingConv::PTX_Kernel);
  // LLVM 19's NVPTX backend reads kernels and launch bounds from !nvvm.annotations (the calling
  // convention alone marks a kernel too; both agree here). maxntidx becomes .maxntid, which lets
  // ptxas budget registers for the real block size.
  llvm::NamedMDNode* annotations = module_.getOrInsertNamedMetadata("nvvm.annotations");
  auto entry = [&](const char* key, int value) {
    llvm::Metadata* ops[] = {llvm::ValueAsMetadata::get(fn_), llvm::MDString::get(ctx_, key),
                             llvm::ConstantAsMetadata::get(b_.getInt32(static_cast<std::uint32_t>(value)))};
    annotations->addOperand(llvm::MDNode::get(ctx_, ops));
  };
  entry("kernel", 1);
  entry("maxntidx", max_threads);
  entry("maxntidy", 1);
  entry("maxntidz", 1);
  if (min_blocks > 0) entry("minctasm", min_blocks);
  b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));
  return fn_;
}

llvm::Value* KernelBuilder::sreg(llvm::Intrinsic::ID id, int which) {
  if (emu_) return host_call(reinterpret_cast<const void*>(emu_->sreg), i32(), {c32(which)});
  return b_.CreateIntrinsic(id, {}, {});
}
llvm::Value* KernelBuilder::tid_x() { return sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x, 0); }
llvm::Value* KernelBuilder::ntid_x() { return sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x, 1); }
llvm::Value* KernelBuilder::ctaid_x() { return sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x, 2); }
llvm::Value* KernelBuilder::ctaid_y() { return sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_y, 3); }
llvm::Value* KernelBuilder::ctaid_z() { return sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_z, 4); }
llvm::Value* KernelBuilder::nctaid_x() { return sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x, 5); }

void KernelBuilder::barrier() {
  if (emu_) {
    host_call(reinterpret_cast<const void*>(emu_->barrier), b_.getVoidTy(), {});
    return;
  }
  b_.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
}
void KernelBuilder::warp_sync() {
  if (emu_) {
    host_call(reinterpret_cast<const void*>(emu_->warp_sync), b_.getVoidTy(), {});
    return;
  }
  b_.CreateIntrinsic(llvm::Intrinsic::nvvm_bar_warp_sync, {}, {b_.getInt32(~0u)});
}

llvm::Value* KernelBuilder::shfl_xor(llvm::Value* x, int lane_xor) {
  if (emu_) return host_call(reinterpret_cast<const void*>(emu_->shfl_xor), f32(), {x, c32(lane_xor)});
  return b_.CreateIntrinsic(llvm::Intrinsic::nvvm_shfl_sync_bfly_f32, {},
                            {b_.getInt32(~0u), x, c32(lane_xor), c32(0x1f)});
}

llvm::Value* KernelBuilder::group_sum(llvm::Value* x, int width) {
  for (int m = 1; m < width; m *= 2) x = b_.CreateFAdd(x, shfl_xor(x, m));
  return x;
}

llvm::Value* KernelBuilder::group_max(llvm::Value* x, int width) {
  for (int m = 1; m < width; m *= 2) x = b_.CreateMaxNum(x, shfl_xor(x, m));
  return x;
}

llvm::Value* KernelBuilder::ex2(llvm::Value* x) {
  if (emu_) return host_call(reinterpret_cast<const void*>(emu_->ex2), f32(), {x});
  return b_.CreateIntrinsic(llvm::Intrinsic::nvvm_ex2_approx_ftz_f, {}, {x});
}

llvm::Value* KernelBuilder::lg2(llvm::Value* x) {
  if (emu_) {
    if (!emu_->lg2) throw std::runtime_error("nvptx emulation: no lg2 hook");
    return host_call(reinterpret_cast<const void*>(emu_->lg2), f32(), {x});
  }
  return b_.CreateIntrinsic(llvm::Intrinsic::nvvm_lg2_approx_ftz_f, {}, {x});
}

llvm::Value* KernelBuilder::fma(llvm::Value* a, llvm::Value* x, llvm::Value* c) {
  return b_.CreateIntrinsic(llvm::Intrinsic::fma, {a->getType()}, {a, x, c});
}
llvm::Value* KernelBuilder::smin(llvm::Value* a, llvm::Value* x) {
  return b_.CreateIntrinsic(llvm::Intrinsic::smin, {a->getType()}, {a, x});
}
llvm::Value* KernelBuilder::smax(llvm::Value* a, llvm::Value* x) {
  return b_.CreateIntrinsic(llvm::Intrinsic::smax, {a->getType()}, {a, x});
}

llvm::Value* KernelBuilder::entry_alloca(llvm::Type* type, int n) {
  llvm::BasicBlock& entry = fn_->getEntryBlock();
  llvm::IRBuilder<> at(&entry, entry.getFirstInsertionPt());
  return at.CreateAlloca(type, b_.getInt32(static_cast<std::uint32_t>(n)));
}

std::vector<llvm::Value*> KernelBuilder::ldmatrix_x4(llvm::Value* row, bool trans) {
  std::vector<llvm::Value*> out;
  if (emu_) {
    if (!emu_->ldmatrix_x4) throw std::runtime_error("nvptx emulation: no ldmatrix hook");
    llvm::Value* regs = entry_alloca(i32(), 4);
    host_call(reinterpret_cast<const void*>(emu_->ldmatrix_x4), b_.getVoidTy(), {row, c32(trans ? 1 : 0), regs});
    for (int m = 0; m < 4; ++m)
      out.push_back(b_.CreateLoad(i32(), b_.CreateConstInBoundsGEP1_32(i32(), regs, static_cast<unsigned>(m))));
    return out;
  }
  llvm::Value* r = b_.CreateIntrinsic(trans ? llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_trans_b16
                                            : llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_b16,
                                      {row->getType()}, {row});
  for (unsigned m = 0; m < 4; ++m) out.push_back(b_.CreateExtractValue(r, {m}));
  return out;
}

std::vector<llvm::Value*> KernelBuilder::mma_bf16(const std::vector<llvm::Value*>& a,
                                                  const std::vector<llvm::Value*>& b,
                                                  const std::vector<llvm::Value*>& c) {
  if (a.size() != 4 || b.size() != 2 || c.size() != 4) throw std::logic_error("mma_bf16: 4 + 2 + 4 registers");
  std::vector<llvm::Value*> out;
  if (emu_) {
    if (!emu_->mma_bf16) throw std::runtime_error("nvptx emulation: no mma hook");
    llvm::Value* ra = entry_alloca(i32(), 4);
    llvm::Value* rb = entry_alloca(i32(), 2);
    llvm::Value* rc = entry_alloca(f32(), 4);
    auto slot = [&](llvm::Type* t, llvm::Value* base, int k) {
      return b_.CreateConstInBoundsGEP1_32(t, base, static_cast<unsigned>(k));
    };
    for (int k = 0; k < 4; ++k) b_.CreateStore(a[k], slot(i32(), ra, k));
    for (int k = 0; k < 2; ++k) b_.CreateStore(b[k], slot(i32(), rb, k));
    for (int k = 0; k < 4; ++k) b_.CreateStore(c[k], slot(f32(), rc, k));
    host_call(reinterpret_cast<const void*>(emu_->mma_bf16), b_.getVoidTy(), {ra, rb, rc});
    for (int k = 0; k < 4; ++k) out.push_back(b_.CreateLoad(f32(), slot(f32(), rc, k)));
    return out;
  }
  llvm::Value* r = b_.CreateIntrinsic(llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_bf16, {},
                                      {a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3]});
  for (unsigned k = 0; k < 4; ++k) out.push_back(b_.CreateExtractValue(r, {k}));
  return out;
}

llvm::Value* KernelBuilder::pack_bf16x2(llvm::Value* lo, llvm::Value* hi) {
  if (emu_) {  // the host's round-to-nearest-even bits (no bfloat arithmetic on the host target)
    llvm::Value* l = b_.CreateZExt(cpu::ir::f32_to_half(b_, lo, true), i32());
    llvm::Value* h = b_.CreateZExt(cpu::ir::f32_to_half(b_, hi, true), i32());
    return b_.CreateOr(l, b_.CreateShl(h, c32(16)));
  }
  auto* v2f = llvm::FixedVectorType::get(f32(), 2);
  llvm::Value* v = b_.CreateInsertElement(llvm::PoisonValue::get(v2f), lo, std::uint64_t{0});
  v = b_.CreateInsertElement(v, hi, std::uint64_t{1});
  v = b_.CreateFPTrunc(v, llvm::FixedVectorType::get(b_.getBFloatTy(), 2));  // cvt.rn.bf16(x2).f32
  return b_.CreateBitCast(v, i32());
}

std::vector<llvm::Value*> KernelBuilder::visit_unless(
    llvm::Value* never, const std::vector<llvm::Value*>& carried,
    const std::function<std::vector<llvm::Value*>(const std::vector<llvm::Value*>&)>& visit, const std::string& name) {
  llvm::BasicBlock* from = b_.GetInsertBlock();
  llvm::BasicBlock* body = llvm::BasicBlock::Create(ctx_, name + ".visit", fn_);
  llvm::BasicBlock* join = llvm::BasicBlock::Create(ctx_, name + ".joined", fn_);
  b_.CreateCondBr(never, join, body);
  b_.SetInsertPoint(body);
  std::vector<llvm::Value*> next = visit(carried);
  llvm::BasicBlock* body_end = b_.GetInsertBlock();
  b_.CreateBr(join);
  b_.SetInsertPoint(join);
  std::vector<llvm::Value*> out;
  for (std::size_t k = 0; k < next.size(); ++k) {
    llvm::PHINode* phi = b_.CreatePHI(next[k]->getType(), 2, "carried");
    phi->addIncoming(carried[k], from);
    phi->addIncoming(next[k], body_end);
    out.push_back(phi);
  }
  return out;
}

llvm::Value* KernelBuilder::mma_lane_row(llvm::Value* tile, int stride, llvm::Value* row0, bool rows_first) {
  llvm::Value* lane = b_.CreateAnd(tid_x(), c32(31));
  llvm::Value* r8 = b_.CreateAnd(lane, c32(7));
  llvm::Value* m1 = b_.CreateMul(b_.CreateAnd(b_.CreateLShr(lane, c32(3)), c32(1)), c32(8));  // matrix bit 0 · 8
  llvm::Value* m2 = b_.CreateMul(b_.CreateLShr(lane, c32(4)), c32(8));                        // matrix bit 1 · 8
  llvm::Value* row = b_.CreateAdd(row0, b_.CreateAdd(r8, rows_first ? m1 : m2));
  llvm::Value* col = rows_first ? m2 : m1;
  return b_.CreateInBoundsGEP(b_.getInt16Ty(), tile, b_.CreateAdd(b_.CreateMul(row, c32(stride)), col));
}

std::vector<std::vector<llvm::Value*>> KernelBuilder::mma_a_fragments(llvm::Value* a, int slices) {
  std::vector<std::vector<llvm::Value*>> out;
  for (int s = 0; s < slices; ++s)
    out.push_back(ldmatrix_x4(b_.CreateConstInBoundsGEP1_32(b_.getInt16Ty(), a, static_cast<unsigned>(16 * s)), false));
  return out;
}

namespace {
/// c's n8 tiles 2·pair and 2·pair + 1 += A·(their B fragments in b: b0b1, b2b3 of an ldmatrix.x4).
void mma_pair(KernelBuilder& kb, std::vector<llvm::Value*>& c, int pair, const std::vector<llvm::Value*>& a,
              const std::vector<llvm::Value*>& b) {
  for (int h = 0; h < 2; ++h) {
    const auto at = static_cast<std::ptrdiff_t>(4 * (2 * pair + h));
    std::vector<llvm::Value*> d =
        kb.mma_bf16(a, {b[static_cast<std::size_t>(2 * h)], b[static_cast<std::size_t>(2 * h + 1)]},
                    std::vector<llvm::Value*>(c.begin() + at, c.begin() + at + 4));
    std::copy(d.begin(), d.end(), c.begin() + at);
  }
}
}  // namespace

std::vector<llvm::Value*> KernelBuilder::mma_a_bt(std::vector<llvm::Value*> c,
                                                  const std::vector<std::vector<llvm::Value*>>& a, llvm::Value* b,
                                                  int b_stride) {
  const int pairs = static_cast<int>(c.size() / 8);
  for (std::size_t ks = 0; ks < a.size(); ++ks)
    for (int np = 0; np < pairs; ++np)
      mma_pair(*this, c, np, a[ks],
               ldmatrix_x4(b_.CreateConstInBoundsGEP1_32(b_.getInt16Ty(), b,
                                                         static_cast<unsigned>(16 * np * b_stride + 16 * ks)),
                           false));
  return c;
}

std::vector<llvm::Value*> KernelBuilder::mma_c_b(std::vector<llvm::Value*> c, const std::vector<llvm::Value*>& p,
                                                 llvm::Value* b, int b_stride) {
  const int pairs = static_cast<int>(c.size() / 8);
  for (std::size_t kk = 0; kk < p.size() / 8; ++kk) {
    // slice kk = P's n8 tiles 2kk (a0..a3: its c0c1, c2c3) and 2kk + 1 (a4..a7)
    std::vector<llvm::Value*> a;
    for (std::size_t h = 0; h < 2; ++h)
      for (std::size_t i = 0; i < 2; ++i) {
        const std::size_t base = (2 * kk + h) * 4 + 2 * i;
        a.push_back(pack_bf16x2(p[base], p[base + 1]));
      }
    for (int dp = 0; dp < pairs; ++dp)
      mma_pair(*this, c, dp, a,
               ldmatrix_x4(b_.CreateConstInBoundsGEP1_32(b_.getInt16Ty(), b,
                                                         static_cast<unsigned>(16 * kk * b_stride + 16 * dp)),
                           true));
  }
  return c;
}

void KernelBuilder::stage_bf16_rows(llvm::Value* tid, int threads, llvm::Value* src, llvm::Value* valid, int rows,
                                    std::int64_t width, llvm::Value* tile, int stride, const std::string& name) {
  // chunk idx = row·(width/8) + c walks the rows in order: 8 bf16 (16 bytes) per step, coalesced.
  const std::int64_t per_row = width / 8;
  auto* v4 = llvm::FixedVectorType::get(i32(), 4);
  auto* i16 = b_.getInt16Ty();
  loop(
      tid, c32(rows * per_row), threads,
      [&](llvm::Value* idx) {
        llvm::Value* r = b_.CreateUDiv(idx, c32(per_row));
        llvm::Value* c = b_.CreateSub(idx, b_.CreateMul(r, c32(per_row)));
        llvm::Value* ok = b_.CreateICmpSLT(b_.CreateZExt(r, i64()), valid);
        llvm::Value* from = b_.CreateSelect(ok, b_.CreateZExt(b_.CreateMul(idx, c32(8)), i64()), c64(0));  // in bounds
        llvm::Value* x = b_.CreateAlignedLoad(v4, b_.CreateInBoundsGEP(i16, src, from), llvm::Align(16));
        x = b_.CreateSelect(ok, x, llvm::Constant::getNullValue(v4));
        llvm::Value* to = b_.CreateAdd(b_.CreateMul(r, c32(stride)), b_.CreateMul(c, c32(8)));
        b_.CreateAlignedStore(x, b_.CreateInBoundsGEP(i16, tile, to), llvm::Align(16));
      },
      name);
}

llvm::Value* KernelBuilder::dynamic_shared(const std::string& name) {
  if (emu_) return llvm::ConstantExpr::getIntToPtr(b_.getInt64(reinterpret_cast<std::uintptr_t>(emu_->shared)), ptr());
  auto* type = llvm::ArrayType::get(f32(), 0);
  auto* g = new llvm::GlobalVariable(module_, type, false, llvm::GlobalValue::ExternalLinkage, nullptr, name, nullptr,
                                     llvm::GlobalValue::NotThreadLocal, kShared);
  g->setAlignment(llvm::Align(16));
  return g;
}

llvm::Value* KernelBuilder::static_shared(const std::string& name, std::int64_t floats) {
  if (emu_) return llvm::ConstantExpr::getIntToPtr(b_.getInt64(reinterpret_cast<std::uintptr_t>(emu_->shared)), ptr());
  auto* type = llvm::ArrayType::get(f32(), static_cast<std::uint64_t>(floats));
  auto* g =
      new llvm::GlobalVariable(module_, type, false, llvm::GlobalValue::InternalLinkage, llvm::UndefValue::get(type),
                               name, nullptr, llvm::GlobalValue::NotThreadLocal, kShared);
  g->setAlignment(llvm::Align(16));
  return g;
}

std::vector<llvm::Value*> KernelBuilder::loop(llvm::Value* begin, llvm::Value* end, std::int64_t step,
                                              std::vector<llvm::Value*> init, const LoopBody& body,
                                              const std::string& name, bool unroll) {
  return loop_impl(begin, end, llvm::ConstantInt::get(begin->getType(), static_cast<std::uint64_t>(step)),
                   std::move(init), body, name, unroll);
}

void KernelBuilder::loop(llvm::Value* begin, llvm::Value* end, llvm::Value* step,
                         const std::function<void(llvm::Value* i)>& body, const std::string& name) {
  loop_impl(
      begin, end, b_.CreateSExtOrTrunc(step, begin->getType()), {},
      [&](llvm::Value* i, const std::vector<llvm::Value*>&) {
        body(i);
        return std::vector<llvm::Value*>{};
      },
      name, true);
}

std::vector<llvm::Value*> KernelBuilder::loop_impl(llvm::Value* begin, llvm::Value* end, llvm::Value* step,
                                                   std::vector<llvm::Value*> init, const LoopBody& body,
                                                   const std::string& name, bool unroll) {
  llvm::Type* it = begin->getType();
  end = b_.CreateSExtOrTrunc(end, it);
  llvm::BasicBlock* pre = b_.GetInsertBlock();
  llvm::BasicBlock* head = llvm::BasicBlock::Create(ctx_, name + ".loop", fn_);
  llvm::BasicBlock* exit = llvm::BasicBlock::Create(ctx_, name + ".done", fn_);
  b_.CreateCondBr(b_.CreateICmpSLT(begin, end), head, exit);

  b_.SetInsertPoint(head);
  llvm::PHINode* iv = b_.CreatePHI(it, 2, name + ".i");
  iv->addIncoming(begin, pre);
  std::vector<llvm::PHINode*> phis;
  std::vector<llvm::Value*> current;
  for (llvm::Value* v : init) {
    llvm::PHINode* phi = b_.CreatePHI(v->getType(), 2, name + ".c");
    phi->addIncoming(v, pre);
    phis.push_back(phi);
    current.push_back(phi);
  }
  std::vector<llvm::Value*> next = body(iv, current);
  llvm::Value* iv_next = b_.CreateAdd(iv, step, name + ".next", false, true);
  llvm::BasicBlock* latch = b_.GetInsertBlock();
  llvm::BranchInst* back = b_.CreateCondBr(b_.CreateICmpSLT(iv_next, end), head, exit);
  if (!unroll) {
    llvm::Metadata* no_unroll = llvm::MDNode::get(ctx_, llvm::MDString::get(ctx_, "llvm.loop.unroll.disable"));
    llvm::MDNode* loop_id = llvm::MDNode::getDistinct(ctx_, {nullptr, no_unroll});
    loop_id->replaceOperandWith(0, loop_id);
    back->setMetadata(llvm::LLVMContext::MD_loop, loop_id);
  }
  iv->addIncoming(iv_next, latch);
  for (std::size_t k = 0; k < phis.size(); ++k) phis[k]->addIncoming(next.at(k), latch);

  b_.SetInsertPoint(exit);
  std::vector<llvm::Value*> out;
  for (std::size_t k = 0; k < phis.size(); ++k) {
    llvm::PHINode* phi = b_.CreatePHI(init[k]->getType(), 2, name + ".out");
    phi->addIncoming(init[k], pre);
    phi->addIncoming(next[k], latch);
    out.push_back(phi);
  }
  return out;
}

void KernelBuilder::loop(llvm::Value* begin, llvm::Value* end, std::int64_t step,
                         const std::function<void(llvm::Value* i)>& body, const std::string& name, bool unroll) {
  loop(
      begin, end, step, {},
      [&](llvm::Value* i, const std::vector<llvm::Value*>&) {
        body(i);
        return std::vector<llvm::Value*>{};
      },
      name, unroll);
}

void KernelBuilder::if_then(llvm::Value* cond, const std::function<void()>& then, const std::string& name) {
  llvm::BasicBlock* yes = llvm::BasicBlock::Create(ctx_, name + ".then", fn_);
  llvm::BasicBlock* join = llvm::BasicBlock::Create(ctx_, name + ".end", fn_);
  b_.CreateCondBr(cond, yes, join);
  b_.SetInsertPoint(yes);
  then();
  b_.CreateBr(join);
  b_.SetInsertPoint(join);
}

llvm::Value* KernelBuilder::guarded_load(llvm::Value* cond, llvm::Type* type, llvm::Value* ptr, llvm::Value* fallback,
                                         const std::string& name) {
  llvm::BasicBlock* from = b_.GetInsertBlock();
  llvm::BasicBlock* yes = llvm::BasicBlock::Create(ctx_, name + ".load", fn_);
  llvm::BasicBlock* join = llvm::BasicBlock::Create(ctx_, name + ".end", fn_);
  b_.CreateCondBr(cond, yes, join);
  b_.SetInsertPoint(yes);
  llvm::Value* x = b_.CreateLoad(type, ptr, name);
  b_.CreateBr(join);
  b_.SetInsertPoint(join);
  llvm::PHINode* phi = b_.CreatePHI(type, 2, name);
  phi->addIncoming(fallback, from);
  phi->addIncoming(x, yes);
  return phi;
}

std::vector<llvm::Value*> KernelBuilder::load_shared_f32(llvm::Value* ptr, int width) {
  if (width == 1) return {b_.CreateAlignedLoad(f32(), ptr, llvm::Align(4))};
  auto* vt = llvm::FixedVectorType::get(f32(), static_cast<unsigned>(width));
  llvm::Value* v = b_.CreateAlignedLoad(vt, ptr, llvm::Align(16));
  std::vector<llvm::Value*> out;
  for (int e = 0; e < width; ++e) out.push_back(b_.CreateExtractElement(v, static_cast<std::uint64_t>(e)));
  return out;
}

void KernelBuilder::stage_rows(llvm::Value* tid, int threads, llvm::Value* src, llvm::Value* valid_floats, int rows,
                               std::int64_t width, int stride, llvm::Value* tile, double factor,
                               const std::string& name) {
  loop(
      tid, c32(rows * width), threads,
      [&](llvm::Value* idx) {
        llvm::Value* r = b_.CreateUDiv(idx, c32(width));
        llvm::Value* c = b_.CreateSub(idx, b_.CreateMul(r, c32(width)));
        llvm::Value* idx64 = b_.CreateZExt(idx, i64());
        llvm::Value* ok = b_.CreateICmpSLT(idx64, valid_floats);
        llvm::Value* x = b_.CreateLoad(f32(), b_.CreateInBoundsGEP(f32(), src, b_.CreateSelect(ok, idx64, c64(0))));
        if (factor != 1.0) x = b_.CreateFMul(x, cf(factor));
        b_.CreateStore(b_.CreateSelect(ok, x, cf(0.0)),
                       b_.CreateInBoundsGEP(f32(), tile, b_.CreateAdd(b_.CreateMul(r, c32(stride)), c)));
      },
      name);
}

std::vector<llvm::Value*> KernelBuilder::dot_tile(const std::vector<llvm::Value*>& a_rows,
                                                  const std::vector<llvm::Value*>& b_rows, std::int64_t len, int w) {
  const auto na = static_cast<int>(a_rows.size()), nb = static_cast<int>(b_rows.size());
  std::vector<llvm::Value*> zero(static_cast<std::size_t>(na * nb), cf(0.0));
  return loop(
      c32(0), c32(len), w, zero,
      [&](llvm::Value* d, const std::vector<llvm::Value*>& in) {
        std::vector<llvm::Value*> acc = in;
        std::vector<std::vector<llvm::Value*>> av, bv;
        for (llvm::Value* r : a_rows) av.push_back(load_shared_f32(b_.CreateInBoundsGEP(f32(), r, d), w));
        for (llvm::Value* r : b_rows) bv.push_back(load_shared_f32(b_.CreateInBoundsGEP(f32(), r, d), w));
        for (int e = 0; e < w; ++e)
          for (int i = 0; i < na; ++i)
            for (int j = 0; j < nb; ++j) {
              llvm::Value*& x = acc[static_cast<std::size_t>(i * nb + j)];
              x = fma(av[static_cast<std::size_t>(i)][static_cast<std::size_t>(e)],
                      bv[static_cast<std::size_t>(j)][static_cast<std::size_t>(e)], x);
            }
        return acc;
      },
      "dot");
}

std::vector<llvm::Value*> KernelBuilder::rows_times_tile(std::vector<llvm::Value*> acc,
                                                         const std::vector<llvm::Value*>& a_rows, int n,
                                                         llvm::Value* b_lane, int b_stride, int tc, int w) {
  const auto na = static_cast<int>(a_rows.size());
  auto ai = [&](int i, int t, int e) { return static_cast<std::size_t>((i * tc + t) * w + e); };
  return loop(
      c32(0), c32(n), 4, std::move(acc),
      [&](llvm::Value* c, const std::vector<llvm::Value*>& in) {
        std::vector<llvm::Value*> out = in;
        std::vector<std::vector<llvm::Value*>> av;
        for (llvm::Value* r : a_rows) av.push_back(load_shared_f32(b_.CreateInBoundsGEP(f32(), r, c), 4));
        for (int cc = 0; cc < 4; ++cc) {
          llvm::Value* brow =
              b_.CreateInBoundsGEP(f32(), b_lane, b_.CreateMul(b_.CreateAdd(c, c32(cc)), c32(b_stride)));
          for (int t = 0; t < tc; ++t) {
            const std::vector<llvm::Value*> bv = load_shared_f32(b_.CreateInBoundsGEP(f32(), brow, c32(t * 8 * w)), w);
            for (int i = 0; i < na; ++i)
              for (int e = 0; e < w; ++e)
                out[ai(i, t, e)] = fma(av[static_cast<std::size_t>(i)][static_cast<std::size_t>(cc)],
                                       bv[static_cast<std::size_t>(e)], out[ai(i, t, e)]);
          }
        }
        return out;
      },
      "rows_x_tile");
}

}  // namespace qkv::codegen::nvptx::detail
