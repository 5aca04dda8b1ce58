#include "cpu/module/threads_ir.hpp"

#include <cstdint>
#include <set>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "llvm/ir_util.hpp"

namespace qkv::codegen::cpu {

namespace {
/// The module's parallel hook (null at first): a function taking a parallel region's tasks.
llvm::GlobalVariable* parallel_hook(llvm::Module& m) {
  if (llvm::GlobalVariable* g = m.getNamedGlobal("qkv_parallel_hook")) return g;
  auto* ptr = llvm::PointerType::get(m.getContext(), 0);
  return new llvm::GlobalVariable(m, ptr, false, llvm::GlobalValue::InternalLinkage,
                                  llvm::ConstantPointerNull::get(ptr), "qkv_parallel_hook");
}
}  // namespace

llvm::GlobalVariable* emit_thread_setting(llvm::Module& m, const std::string& name,
                                          const std::function<void(llvm::Function*)>& attributes,
                                          llvm::Function** set_threads) {
  llvm::IRBuilder<> b(m.getContext());
  llvm::Type* i32 = b.getInt32Ty();
  auto* setting =
      new llvm::GlobalVariable(m, i32, false, llvm::GlobalValue::InternalLinkage, b.getInt32(0), name + "_threads");
  auto* set = llvm::Function::Create(llvm::FunctionType::get(i32, {i32}, false), llvm::GlobalValue::ExternalLinkage,
                                     name + "_set_threads", m);
  attributes(set);
  b.SetInsertPoint(llvm::BasicBlock::Create(m.getContext(), "entry", set));
  llvm::Value* n = set->getArg(0);
  llvm::Value* ok = b.CreateICmpSGE(n, b.getInt32(0));
  b.CreateStore(b.CreateSelect(ok, n, b.getInt32(0)), setting);
  b.CreateRet(b.CreateZExt(b.CreateNot(ok), i32));
  *set_threads = set;
  return setting;
}

llvm::Function* emit_parallel_setter(llvm::Module& m, const std::string& name,
                                     const std::function<void(llvm::Function*)>& attributes) {
  llvm::IRBuilder<> b(m.getContext());
  auto* set = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), {b.getPtrTy()}, false),
                                     llvm::GlobalValue::ExternalLinkage, name + "_set_parallel", m);
  attributes(set);
  b.SetInsertPoint(llvm::BasicBlock::Create(m.getContext(), "entry", set));
  b.CreateStore(set->getArg(0), parallel_hook(m));
  b.CreateRetVoid();
  return set;
}

llvm::Value* emit_thread_count(llvm::IRBuilder<>& b, llvm::Value* requested) {
  llvm::Module& m = *b.GetInsertBlock()->getModule();
  llvm::Type *i32 = b.getInt32Ty(), *i64 = b.getInt64Ty();
  auto* sysconf = llvm::cast<llvm::Function>(m.getOrInsertFunction("sysconf", i64, i32).getCallee());
  constexpr int kScNprocessorsOnln = 84;  // glibc's _SC_NPROCESSORS_ONLN
  llvm::Value* online = b.CreateTrunc(b.CreateCall(sysconf, {b.getInt32(kScNprocessorsOnln)}), i32);
  llvm::Value* t = b.CreateSelect(b.CreateICmpSGT(requested, b.getInt32(0)), requested, online);
  t = b.CreateSelect(b.CreateICmpSLT(t, b.getInt32(1)), b.getInt32(1), t);
  return b.CreateSelect(b.CreateICmpSGT(t, b.getInt32(256)), b.getInt32(256), t, "threads");
}

llvm::Function* emit_parallel_runtime(llvm::Module& m_, const std::function<void(llvm::Function*)>& attributes) {
  llvm::LLVMContext& ctx_ = m_.getContext();
  llvm::IRBuilder<> b_(ctx_);
  llvm::Type* i32_ = b_.getInt32Ty();
  llvm::Type* i64_ = b_.getInt64Ty();
  llvm::PointerType* ptr_ = b_.getPtrTy();
  auto* par_type = llvm::StructType::get(ctx_, {ptr_, ptr_, i64_, i64_});  // body, ctx, n, next
  auto* body_type = llvm::FunctionType::get(b_.getVoidTy(), {ptr_, i64_}, false);
  // ptr qkv_par_worker(ptr par): takes tasks until none is left (also the pthread start routine).
  auto* worker = llvm::Function::Create(llvm::FunctionType::get(ptr_, {ptr_}, false),
                                        llvm::GlobalValue::InternalLinkage, "qkv_par_worker", m_);
  attributes(worker);
  {
    llvm::IRBuilder<> b(llvm::BasicBlock::Create(ctx_, "entry", worker));
    llvm::Value* par = worker->getArg(0);
    llvm::Value* body = b.CreateLoad(ptr_, b.CreateStructGEP(par_type, par, 0));
    llvm::Value* ctx = b.CreateLoad(ptr_, b.CreateStructGEP(par_type, par, 1));
    llvm::Value* n = b.CreateLoad(i64_, b.CreateStructGEP(par_type, par, 2));
    auto* take = llvm::BasicBlock::Create(ctx_, "take", worker);
    auto* run = llvm::BasicBlock::Create(ctx_, "run", worker);
    auto* done = llvm::BasicBlock::Create(ctx_, "done", worker);
    b.CreateBr(take);
    b.SetInsertPoint(take);
    llvm::Value* i =
        b.CreateAtomicRMW(llvm::AtomicRMWInst::Add, b.CreateStructGEP(par_type, par, 3),
                          llvm::ConstantInt::get(i64_, 1), llvm::MaybeAlign(8), llvm::AtomicOrdering::Monotonic);
    b.CreateCondBr(b.CreateICmpSLT(i, n), run, done);
    b.SetInsertPoint(run);
    b.CreateCall(body_type, body, {ctx, i});
    b.CreateBr(take);
    b.SetInsertPoint(done);
    b.CreateRet(llvm::ConstantPointerNull::get(ptr_));
  }
  auto* parallel_ = llvm::Function::Create(llvm::FunctionType::get(b_.getVoidTy(), {ptr_, ptr_, i64_, i32_}, false),
                                           llvm::GlobalValue::InternalLinkage, "qkv_parallel", m_);
  attributes(parallel_);
  constexpr std::int64_t kMaxThreads = 256;
  auto* i8 = llvm::Type::getInt8Ty(ctx_);
  auto* tid_array = llvm::ArrayType::get(i64_, kMaxThreads);  // pthread_t is an unsigned long
  auto* made_array = llvm::ArrayType::get(i8, kMaxThreads);
  llvm::IRBuilder<> b(llvm::BasicBlock::Create(ctx_, "entry", parallel_));
  llvm::Value* par = b.CreateAlloca(par_type, nullptr, "par");
  llvm::Value* tids = b.CreateAlloca(tid_array, nullptr, "tids");
  llvm::Value* made = b.CreateAlloca(made_array, nullptr, "made");
  for (unsigned f = 0; f < 3; ++f) b.CreateStore(parallel_->getArg(f), b.CreateStructGEP(par_type, par, f));
  b.CreateStore(llvm::ConstantInt::get(i64_, 0), b.CreateStructGEP(par_type, par, 3));
  // helpers = min(threads, n, 256) - 1
  llvm::Value* n = parallel_->getArg(2);
  llvm::Value* cap =
      b.CreateTrunc(b.CreateSelect(b.CreateICmpSLT(n, ir::i64c(b, kMaxThreads)), n, ir::i64c(b, kMaxThreads)), i32_);
  llvm::Value* t = parallel_->getArg(3);
  llvm::Value* helpers =
      b.CreateSExt(b.CreateSub(b.CreateSelect(b.CreateICmpSLT(t, cap), t, cap), b.getInt32(1)), i64_, "helpers");
  // A hook that takes the tasks (returns 0) when there is more than one thread to run them on.
  {
    auto* hooked = llvm::BasicBlock::Create(ctx_, "hooked", parallel_);
    auto* own = llvm::BasicBlock::Create(ctx_, "own_threads", parallel_);
    auto* ret = llvm::BasicBlock::Create(ctx_, "taken", parallel_);
    llvm::Value* hook = b.CreateLoad(ptr_, parallel_hook(m_), "hook");
    b.CreateCondBr(b.CreateAnd(b.CreateIsNotNull(hook), b.CreateICmpSGT(helpers, ir::i64c(b, 0))), hooked, own);
    b.SetInsertPoint(hooked);
    auto* hook_type = llvm::FunctionType::get(i32_, {ptr_, ptr_, i64_, i32_}, false);
    llvm::Value* rc =
        b.CreateCall(hook_type, hook, {parallel_->getArg(0), parallel_->getArg(1), n, parallel_->getArg(3)});
    b.CreateCondBr(b.CreateICmpEQ(rc, b.getInt32(0)), ret, own);
    b.SetInsertPoint(ret);
    b.CreateRetVoid();
    b.SetInsertPoint(own);
  }
  auto* create =
      llvm::cast<llvm::Function>(m_.getOrInsertFunction("pthread_create", i32_, ptr_, ptr_, ptr_, ptr_).getCallee());
  auto* join = llvm::cast<llvm::Function>(m_.getOrInsertFunction("pthread_join", i32_, i64_, ptr_).getCallee());
  ir::emit_loop(
      b, ir::i64c(b, 0), helpers, 1,
      [&](llvm::Value* k) {
        llvm::Value* slot = b.CreateInBoundsGEP(tid_array, tids, {ir::i64c(b, 0), k});
        llvm::Value* rc = b.CreateCall(create, {slot, llvm::ConstantPointerNull::get(ptr_), worker, par});
        b.CreateStore(b.CreateZExt(b.CreateICmpEQ(rc, b.getInt32(0)), i8),
                      b.CreateInBoundsGEP(made_array, made, {ir::i64c(b, 0), k}));
      },
      "spawn");
  b.CreateCall(worker, {par});
  ir::emit_loop(
      b, ir::i64c(b, 0), helpers, 1,
      [&](llvm::Value* k) {
        auto* yes = llvm::BasicBlock::Create(ctx_, "join", parallel_);
        auto* next = llvm::BasicBlock::Create(ctx_, "joined", parallel_);
        llvm::Value* ok = b.CreateLoad(i8, b.CreateInBoundsGEP(made_array, made, {ir::i64c(b, 0), k}));
        b.CreateCondBr(b.CreateICmpNE(ok, b.getInt8(0)), yes, next);
        b.SetInsertPoint(yes);
        b.CreateCall(join, {b.CreateLoad(i64_, b.CreateInBoundsGEP(tid_array, tids, {ir::i64c(b, 0), k})),
                            llvm::ConstantPointerNull::get(ptr_)});
        b.CreateBr(next);
        b.SetInsertPoint(next);
      },
      "join");
  b.CreateRetVoid();
  return parallel_;
}

llvm::Value* capture_into(llvm::IRBuilder<>& b, llvm::Function& task) {
  std::vector<llvm::Value*> foreign;  // in the order the task first uses them: a stable module text
  std::set<llvm::Value*> seen;
  for (llvm::BasicBlock& block : task)
    for (llvm::Instruction& inst : block)
      for (llvm::Value* op : inst.operands()) {
        const auto* i = llvm::dyn_cast<llvm::Instruction>(op);
        const auto* a = llvm::dyn_cast<llvm::Argument>(op);
        if (((i && i->getFunction() != &task) || (a && a->getParent() != &task)) && seen.insert(op).second)
          foreign.push_back(op);
      }
  if (foreign.empty()) return llvm::ConstantPointerNull::get(b.getPtrTy());
  std::vector<llvm::Type*> types;
  for (llvm::Value* v : foreign) types.push_back(v->getType());
  auto* ctx_type = llvm::StructType::get(b.getContext(), types);
  llvm::Value* ctx = ir::entry_alloca(b, ctx_type, 1, 8, "task_ctx");
  llvm::IRBuilder<> in_task(&task.getEntryBlock(), task.getEntryBlock().begin());
  for (unsigned f = 0; f < foreign.size(); ++f) {
    b.CreateStore(foreign[f], b.CreateStructGEP(ctx_type, ctx, f));
    llvm::Value* loaded = in_task.CreateLoad(types[f], in_task.CreateStructGEP(ctx_type, task.getArg(0), f));
    foreign[f]->replaceUsesWithIf(loaded, [&](llvm::Use& u) {
      const auto* user = llvm::dyn_cast<llvm::Instruction>(u.getUser());
      return user && user->getFunction() == &task;
    });
  }
  return ctx;
}

}  // namespace qkv::codegen::cpu
