// outline.cpp — each node's code a function of its own, and one function for nodes that compute
// alike (module_builder_impl.hpp: outline_node_regions, merge_identical_functions).
//
// The outliner is linear in the region it moves: it reads the region's own instructions for
// what they use from outside (the arguments) and what the rest of the function uses of them
// (none, or the region stays). LLVM's CodeExtractor, which this replaced, scanned every user of
// every input — the sizes and the handle are used by every node — and took seconds, growing with
// the square of the depth, on a 32-layer decoder.
#include <llvm/ADT/DenseMap.h>
#include <llvm/ADT/SmallPtrSet.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/PassManager.h>
#include <llvm/Transforms/IPO/MergeFunctions.h>

#include "cpu/module/module_builder_impl.hpp"

namespace qkv::codegen::cpu::detail {

namespace {

/// Moves `region` (its first block entered from outside only, every exit to one block outside)
/// into a new function named `name` whose arguments are the values the region uses from outside
/// (instructions and arguments of `fn`, in the order of their first use), and puts a call to it
/// where the region was. False, with nothing changed, when the region cannot be moved: it
/// returns, defines a value used outside, has no single exit, or another block of it is entered
/// from outside.
bool outline(llvm::Function& fn, const std::vector<llvm::BasicBlock*>& region, const std::string& name) {
  const llvm::SmallPtrSet<llvm::BasicBlock*, 32> in(region.begin(), region.end());
  auto inside = [&](const llvm::Value* v) {
    const auto* i = llvm::dyn_cast<llvm::Instruction>(v);
    return i && in.contains(i->getParent());
  };
  llvm::BasicBlock* start = region.front();
  llvm::BasicBlock* exit = nullptr;
  std::vector<llvm::Value*> inputs;
  llvm::DenseMap<llvm::Value*, unsigned> index;
  std::size_t instructions = 0;
  for (llvm::BasicBlock* bb : region) {
    if (bb != start)
      for (const llvm::User* u : bb->users())
        if (!inside(u)) return false;
    for (llvm::Instruction& inst : *bb) {
      ++instructions;
      if (llvm::isa<llvm::ReturnInst>(inst) || (llvm::isa<llvm::PHINode>(inst) && bb == start)) return false;
      for (const llvm::User* u : inst.users())
        if (!inside(u)) return false;
      for (llvm::Value* v : inst.operands())
        if ((llvm::isa<llvm::Argument>(v) || llvm::isa<llvm::Instruction>(v)) && !inside(v) &&
            index.try_emplace(v, static_cast<unsigned>(inputs.size())).second)
          inputs.push_back(v);
    }
    for (llvm::BasicBlock* next : llvm::successors(bb))
      if (!in.contains(next)) {
        if (exit && exit != next) return false;
        exit = next;
      }
  }
  // Branches only (nothing to move), or no way out.
  if (!exit || instructions <= region.size() || !exit->phis().empty()) return false;

  llvm::LLVMContext& ctx = fn.getContext();
  std::vector<llvm::Type*> types;
  for (llvm::Value* v : inputs) types.push_back(v->getType());
  auto* f = llvm::Function::Create(llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), types, false),
                                   llvm::GlobalValue::InternalLinkage, name, fn.getParent());
  for (const llvm::Attribute& a : fn.getAttributes().getFnAttrs()) f->addFnAttr(a);
  f->addFnAttr(llvm::Attribute::NoInline);
  f->setUnnamedAddr(llvm::GlobalValue::UnnamedAddr::Global);  // nothing compares its address
  for (std::size_t k = 0; k < inputs.size(); ++k) f->getArg(static_cast<unsigned>(k))->setName(inputs[k]->getName());

  // Where the region was: the call, then on to the exit.
  auto* call = llvm::BasicBlock::Create(ctx, "call." + name, &fn, start);
  start->replaceUsesWithIf(call, [&](llvm::Use& u) { return !inside(u.getUser()); });
  llvm::IRBuilder<> b(call);
  b.CreateCall(f, inputs);
  b.CreateBr(exit);

  // The region, moved: entered from a block of its own, its exits returning.
  auto* entry = llvm::BasicBlock::Create(ctx, "entry", f);
  llvm::BranchInst::Create(start, entry);
  auto* done = llvm::BasicBlock::Create(ctx, "done");
  llvm::ReturnInst::Create(ctx, done);
  for (llvm::BasicBlock* bb : region) {
    bb->removeFromParent();
    bb->insertInto(f);
    for (llvm::Instruction& inst : *bb)
      for (llvm::Use& u : inst.operands())
        if (auto it = index.find(u.get()); it != index.end()) u.set(f->getArg(it->second));
    bb->getTerminator()->replaceSuccessorWith(exit, done);
  }
  done->insertInto(f);
  return true;
}

}  // namespace

void outline_node_regions(llvm::Function& fn, const std::vector<std::vector<llvm::BasicBlock*>>& regions,
                          const std::vector<std::string>& labels) {
  for (std::size_t r = 0; r < regions.size(); ++r)
    if (!regions[r].empty()) outline(fn, regions[r], fn.getName().str() + "." + labels.at(r));
}

void merge_identical_functions(llvm::Module& module) {
  for (llvm::Function& f : module)
    if (!f.isDeclaration() && f.hasLocalLinkage()) f.setUnnamedAddr(llvm::GlobalValue::UnnamedAddr::Global);
  llvm::ModuleAnalysisManager unused;  // the pass asks for no analysis
  llvm::MergeFunctionsPass().run(module, unused);
}

}  // namespace qkv::codegen::cpu::detail
