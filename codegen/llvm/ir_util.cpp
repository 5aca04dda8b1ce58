#include "llvm/ir_util.hpp"

#include <qkv/ir/quant.hpp>

#include <llvm/IR/BasicBlock.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsX86.h>
#include <llvm/IR/Metadata.h>
#include <llvm/IR/Module.h>

namespace qkv::codegen::cpu::ir {

std::vector<llvm::Value*> emit_loop(llvm::IRBuilder<>& b, llvm::Value* begin, llvm::Value* end, std::int64_t step,
                                    std::vector<llvm::Value*> init, const LoopBody& body, const llvm::Twine& name,
                                    Unroll unroll) {
  llvm::LLVMContext& ctx = b.getContext();
  llvm::Function* fn = b.GetInsertBlock()->getParent();
  llvm::BasicBlock* pre = b.GetInsertBlock();
  llvm::BasicBlock* head = llvm::BasicBlock::Create(ctx, name + ".loop", fn);
  llvm::BasicBlock* exit = llvm::BasicBlock::Create(ctx, name + ".done", fn);
  b.CreateCondBr(b.CreateICmpSLT(begin, end), head, exit);

  b.SetInsertPoint(head);
  llvm::PHINode* iv = b.CreatePHI(b.getInt64Ty(), 2, name + ".i");
  iv->addIncoming(begin, pre);
  std::vector<llvm::PHINode*> phis;
  std::vector<llvm::Value*> current;
  for (llvm::Value* v : init) {
    llvm::PHINode* phi = b.CreatePHI(v->getType(), 2, name + ".c");
    phi->addIncoming(v, pre);
    phis.push_back(phi);
    current.push_back(phi);
  }
  std::vector<llvm::Value*> next = body(iv, current);
  llvm::Value* iv_next = b.CreateAdd(iv, b.getInt64(static_cast<std::uint64_t>(step)), name + ".next", false, true);
  llvm::BasicBlock* latch = b.GetInsertBlock();
  llvm::BranchInst* back = b.CreateCondBr(b.CreateICmpSLT(iv_next, end), head, exit);
  if (unroll == Unroll::as_written) {
    // !llvm.loop !{self, !{"llvm.loop.unroll.disable"}, !{"llvm.loop.vectorize.enable", false}}
    llvm::LLVMContext& c = b.getContext();
    llvm::Metadata* no_unroll = llvm::MDNode::get(c, llvm::MDString::get(c, "llvm.loop.unroll.disable"));
    llvm::Metadata* no_vectorize = llvm::MDNode::get(
        c, {llvm::MDString::get(c, "llvm.loop.vectorize.enable"), llvm::ConstantAsMetadata::get(b.getFalse())});
    llvm::MDNode* loop_id = llvm::MDNode::getDistinct(c, {nullptr, no_unroll, no_vectorize});
    loop_id->replaceOperandWith(0, loop_id);
    back->setMetadata(llvm::LLVMContext::MD_loop, loop_id);
  }
  iv->addIncoming(iv_next, latch);
  for (std::size_t k = 0; k < phis.size(); ++k) phis[k]->addIncoming(next.at(k), latch);

  b.SetInsertPoint(exit);
  std::vector<llvm::Value*> out;
  for (std::size_t k = 0; k < phis.size(); ++k) {
    llvm::PHINode* phi = b.CreatePHI(init[k]->getType(), 2, name + ".out");
    phi->addIncoming(init[k], pre);
    phi->addIncoming(next[k], latch);
    out.push_back(phi);
  }
  return out;
}

void emit_loop(llvm::IRBuilder<>& b, llvm::Value* begin, llvm::Value* end, std::int64_t step,
               const std::function<void(llvm::Value* i)>& body, const llvm::Twine& name, Unroll unroll) {
  emit_loop(
      b, begin, end, step, {},
      [&](llvm::Value* i, const std::vector<llvm::Value*>&) {
        body(i);
        return std::vector<llvm::Value*>{};
      },
      name, unroll);
}

llvm::AllocaInst* entry_alloca(llvm::IRBuilder<>& b, llvm::Type* type, std::uint64_t count, std::uint64_t align,
                               const llvm::Twine& name) {
  llvm::Function* fn = b.GetInsertBlock()->getParent();
  llvm::IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin());
  llvm::AllocaInst* a = entry.CreateAlloca(llvm::ArrayType::get(type, count), nullptr, name);
  a->setAlignment(llvm::Align(align));
  return a;
}

llvm::Function* declare_kernel(llvm::Module& module, llvm::IRBuilder<>& b, const std::string& name,
                               const std::vector<llvm::Type*>& params, const std::string& cpu,
                               const std::string& features, int lanes, bool args_param) {
  auto* type = llvm::FunctionType::get(b.getVoidTy(), params, false);
  llvm::Function* fn = llvm::Function::Create(type, llvm::GlobalValue::ExternalLinkage, name, module);
  fn->addFnAttr(llvm::Attribute::NoUnwind);
  fn->addFnAttr("target-cpu", cpu);
  fn->addFnAttr("target-features", features);
  const std::string width = std::to_string(32 * lanes);
  fn->addFnAttr("min-legal-vector-width", width);
  fn->addFnAttr("prefer-vector-width", width);
  if (args_param) {
    fn->addParamAttr(0, llvm::Attribute::NoAlias);
    fn->addParamAttr(0, llvm::Attribute::NoCapture);
    fn->addParamAttr(0, llvm::Attribute::ReadOnly);
  }
  b.SetInsertPoint(llvm::BasicBlock::Create(module.getContext(), "entry", fn));
  return fn;
}

llvm::Value* transpose_add(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y, int keys) {
  const int lanes = static_cast<int>(llvm::cast<llvm::FixedVectorType>(x->getType())->getNumElements());
  const int bs = lanes / keys, half = bs / 2;
  std::vector<int> lo, hi;
  for (int src = 0; src < 2; ++src) {
    for (int k = 0; k < keys; ++k) {
      for (int e = 0; e < half; ++e) {
        lo.push_back(src * lanes + k * bs + e);
        hi.push_back(src * lanes + k * bs + half + e);
      }
    }
  }
  return b.CreateFAdd(b.CreateShuffleVector(x, y, lo), b.CreateShuffleVector(x, y, hi));
}

llvm::Value* transpose_sum(llvm::IRBuilder<>& b, const std::vector<llvm::Value*>& parts) {
  std::vector<llvm::Value*> level = parts;
  for (int keys = 1; level.size() > 1; keys *= 2) {
    std::vector<llvm::Value*> next;
    for (std::size_t i = 0; i + 1 < level.size(); i += 2)
      next.push_back(transpose_add(b, level[i], level[i + 1], keys));
    level = std::move(next);
  }
  return level.at(0);
}

std::vector<llvm::Value*> transpose_square(llvm::IRBuilder<>& b, std::vector<llvm::Value*> rows) {
  const int n = static_cast<int>(rows.size());
  for (int bit = 1; bit < n; bit *= 2) {
    std::vector<int> lo, hi;  // lanes with `bit` clear from x (the lower row), set from y
    for (int lane = 0; lane < n; ++lane) {
      lo.push_back((lane & bit) != 0 ? n + lane - bit : lane);
      hi.push_back((lane & bit) != 0 ? n + lane : lane + bit);
    }
    for (int i = 0; i < n; ++i) {
      if ((i & bit) != 0) continue;
      const auto x = static_cast<std::size_t>(i), y = static_cast<std::size_t>(i + bit);
      llvm::Value* low = b.CreateShuffleVector(rows[x], rows[y], lo);
      rows[y] = b.CreateShuffleVector(rows[x], rows[y], hi);
      rows[x] = low;
    }
  }
  return rows;
}

std::vector<int> interleave_halves(int lanes) {
  std::vector<int> order;
  for (int i = 0; i < 2 * lanes; ++i) order.push_back(i % 2 ? lanes + i / 2 : i / 2);
  return order;
}

namespace {
/// `scalar` as a type of v's shape (a vector of as many lanes when v is a vector).
llvm::Type* like(llvm::Value* v, llvm::Type* scalar) {
  if (auto* vt = llvm::dyn_cast<llvm::VectorType>(v->getType()))
    return llvm::VectorType::get(scalar, vt->getElementCount());
  return scalar;
}
}  // namespace

llvm::Value* half_to_f32(llvm::IRBuilder<>& b, llvm::Value* bits, bool brain) {
  if (!brain) return b.CreateFPExt(b.CreateBitCast(bits, like(bits, b.getHalfTy())), like(bits, b.getFloatTy()));
  llvm::Value* wide = b.CreateShl(b.CreateZExt(bits, like(bits, b.getInt32Ty())), 16);
  return b.CreateBitCast(wide, like(bits, b.getFloatTy()));
}

llvm::Value* q4_nibbles(llvm::IRBuilder<>& b, llvm::Value* bytes, llvm::Value* high, bool centered) {
  llvm::Type* t = bytes->getType();
  llvm::Value* v = b.CreateSelect(high, b.CreateLShr(bytes, llvm::ConstantInt::get(t, 4)),
                                  b.CreateAnd(bytes, llvm::ConstantInt::get(t, 0x0F)));
  return centered ? b.CreateSub(v, llvm::ConstantInt::get(t, kQ4Zero)) : v;
}

llvm::Value* from_storage(llvm::IRBuilder<>& b, llvm::Value* v, DType t) {
  if (t == DType::f16 || t == DType::bf16) return half_to_f32(b, v, t == DType::bf16);
  // An integer read as the integer it is (the CPU's integer inputs); a byte (bool) stays one.
  if (llvm::Type* e = v->getType()->getScalarType(); is_integer(t) && e->isIntegerTy() && e->getIntegerBitWidth() >= 32)
    return b.CreateSIToFP(v, like(v, b.getFloatTy()));
  return v;
}

llvm::Value* to_storage(llvm::IRBuilder<>& b, llvm::Value* f, DType t) {
  return t == DType::f16 || t == DType::bf16 ? f32_to_half(b, f, t == DType::bf16) : f;
}

llvm::Value* dot_bf16_pairs(llvm::IRBuilder<>& b, llvm::Value* acc, llvm::Value* x, llvm::Value* y) {
  auto* pairs = llvm::FixedVectorType::get(b.getBFloatTy(), 32);
  return b.CreateIntrinsic(llvm::Intrinsic::x86_avx512bf16_dpbf16ps_512, {},
                           {acc, b.CreateBitCast(x, pairs), b.CreateBitCast(y, pairs)});
}

namespace {
/// [x | y] rounded: <32 x bfloat>, x's values in the low half.
llvm::Value* rounded_halves(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
  return b.CreateIntrinsic(llvm::Intrinsic::x86_avx512bf16_cvtne2ps2bf16_512, {}, {y, x});
}
}  // namespace

llvm::Value* bf16_pairs(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
  llvm::Value* halves = rounded_halves(b, x, y);
  return b.CreateBitCast(b.CreateShuffleVector(halves, halves, interleave_halves(16)), x->getType());
}

llvm::Value* bf16_concat(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
  return b.CreateBitCast(rounded_halves(b, x, y), x->getType());
}

llvm::Value* lanes_below(llvm::IRBuilder<>& b, int n, llvm::Value* count) {
  std::vector<llvm::Constant*> iota;
  for (int l = 0; l < n; ++l) iota.push_back(b.getInt64(static_cast<std::uint64_t>(l)));
  return b.CreateICmpSLT(llvm::ConstantVector::get(iota), b.CreateVectorSplat(static_cast<unsigned>(n), count));
}

llvm::Value* concat(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
  std::vector<int> both;
  const auto n = llvm::cast<llvm::FixedVectorType>(x->getType())->getNumElements();
  for (unsigned l = 0; l < 2 * n; ++l) both.push_back(static_cast<int>(l));
  return b.CreateShuffleVector(x, y, both);
}

llvm::Value* dot_u8s8(llvm::IRBuilder<>& b, llvm::Value* acc, llvm::Value* u, llvm::Value* s) {
  const auto lanes = llvm::cast<llvm::FixedVectorType>(acc->getType())->getNumElements();
  const auto id = lanes == 16 ? llvm::Intrinsic::x86_avx512_vpdpbusd_512 : llvm::Intrinsic::x86_avx512_vpdpbusd_256;
  return b.CreateIntrinsic(id, {}, {acc, u, s});
}

llvm::Value* f32_to_half(llvm::IRBuilder<>& b, llvm::Value* f, bool brain) {
  if (!brain) return b.CreateBitCast(b.CreateFPTrunc(f, like(f, b.getHalfTy())), like(f, b.getInt16Ty()));
  llvm::Type* i32 = like(f, b.getInt32Ty());
  auto k = [&](std::uint32_t v) { return llvm::ConstantInt::get(i32, v); };
  llvm::Value* u = b.CreateBitCast(f, i32);
  llvm::Value* hi = b.CreateLShr(u, k(16));
  llvm::Value* rounded = b.CreateLShr(b.CreateAdd(u, b.CreateAdd(k(0x7FFF), b.CreateAnd(hi, k(1)))), k(16));
  llvm::Value* nan = b.CreateFCmpUNO(f, f);
  return b.CreateTrunc(b.CreateSelect(nan, b.CreateOr(hi, k(0x40)), rounded), like(f, b.getInt16Ty()));
}

}  // namespace qkv::codegen::cpu::ir
