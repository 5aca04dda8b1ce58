#include "llvm/ir_util.hpp"

#include <llvm/IR/BasicBlock.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Metadata.h>

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

}  // namespace qkv::codegen::cpu::ir
