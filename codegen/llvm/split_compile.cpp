// codegen/llvm/split_compile.cpp — a large module compiled in parts at once (split_compile.hpp).
#include "llvm/split_compile.hpp"

#include <algorithm>
#include <map>
#include <thread>

#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Transforms/Utils/Cloning.h>

#include "llvm/optimize.hpp"

namespace qkv::codegen {

namespace {

std::size_t instructions(const llvm::Function& f) {
  std::size_t n = 0;
  for (const auto& block : f) n += block.size();
  return n;
}

/// Optimises and compiles one part, given as bitcode, in a context of its own.
std::unique_ptr<llvm::MemoryBuffer> compile_part(
    const llvm::SmallVector<char, 0>& bitcode, const std::string& name,
    const std::function<std::unique_ptr<llvm::TargetMachine>(std::string*)>& make_machine, std::string* error) {
  llvm::LLVMContext context;
  auto module =
      llvm::parseBitcodeFile(llvm::MemoryBufferRef(llvm::StringRef(bitcode.data(), bitcode.size()), name), context);
  if (!module) {
    *error = "jit: cannot read back part " + name + ": " + llvm::toString(module.takeError());
    return nullptr;
  }
  std::unique_ptr<llvm::TargetMachine> machine = make_machine(error);
  if (!machine || !optimize_module(**module, *machine, "jit", error)) return nullptr;
  llvm::SmallVector<char, 0> object;
  llvm::raw_svector_ostream os(object);
  llvm::legacy::PassManager passes;
  if (machine->addPassesToEmitFile(passes, os, nullptr, llvm::CodeGenFileType::ObjectFile)) {
    *error = "jit: the target machine cannot emit an object file";
    return nullptr;
  }
  passes.run(**module);
  return llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(object.data(), object.size()), name);
}

}  // namespace

int compile_parts(const llvm::Module& module) {
  std::size_t n = 0;
  for (const auto& f : module) n += instructions(f);
  const auto threads = static_cast<std::size_t>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(std::clamp<std::size_t>(std::min(threads, n / kSplitInstructions), 1, 4));
}

std::vector<std::unique_ptr<llvm::MemoryBuffer>> compile_split(
    std::unique_ptr<llvm::Module> module, int parts, const std::string& tag, const std::string& name,
    const std::function<std::unique_ptr<llvm::TargetMachine>(std::string* error)>& make_machine, std::string* error) {
  // Locals become hidden externals under names no other module has.
  int unnamed = 0;
  auto externalize = [&](llvm::GlobalValue& g) {
    if (g.isDeclaration() || !g.hasLocalLinkage()) return;
    g.setName((g.hasName() ? g.getName().str() : "qkv.unnamed" + std::to_string(unnamed++)) + "." + tag);
    g.setLinkage(llvm::GlobalValue::ExternalLinkage);
    g.setVisibility(llvm::GlobalValue::HiddenVisibility);
  };
  for (auto& f : *module) externalize(f);
  for (auto& v : module->globals()) externalize(v);
  // Functions largest first, each to the lightest part so far.
  struct Sized {
    std::size_t size, order;
    const llvm::Function* f;
  };
  std::vector<Sized> functions;
  for (const auto& f : *module)
    if (!f.isDeclaration()) functions.push_back({instructions(f), functions.size(), &f});
  std::sort(functions.begin(), functions.end(),
            [](const Sized& a, const Sized& b) { return a.size != b.size ? a.size > b.size : a.order < b.order; });
  std::vector<std::size_t> load(static_cast<std::size_t>(parts), 0);
  std::map<const llvm::GlobalValue*, int> owner;
  for (const Sized& s : functions) {
    const auto lightest = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[s.f] = lightest;
    load[static_cast<std::size_t>(lightest)] += s.size;
  }
  std::vector<llvm::SmallVector<char, 0>> bitcode(static_cast<std::size_t>(parts));
  for (int p = 0; p < parts; ++p) {
    llvm::ValueToValueMapTy map;
    std::unique_ptr<llvm::Module> part = llvm::CloneModule(*module, map, [&](const llvm::GlobalValue* g) {
      const auto it = owner.find(g);
      return it != owner.end() ? it->second == p : p == 0;  // global variables: part 0
    });
    llvm::raw_svector_ostream os(bitcode[static_cast<std::size_t>(p)]);
    llvm::WriteBitcodeToFile(*part, os);
  }
  module.reset();
  std::vector<std::unique_ptr<llvm::MemoryBuffer>> objects(static_cast<std::size_t>(parts));
  std::vector<std::string> errors(static_cast<std::size_t>(parts));
  {
    std::vector<std::jthread> workers;
    for (int p = 1; p < parts; ++p)
      workers.emplace_back([&, p] {
        const auto i = static_cast<std::size_t>(p);
        objects[i] = compile_part(bitcode[i], name + "." + std::to_string(p), make_machine, &errors[i]);
      });
    objects[0] = compile_part(bitcode[0], name + ".0", make_machine, &errors[0]);
  }
  for (int p = 0; p < parts; ++p)
    if (!objects[static_cast<std::size_t>(p)]) {
      *error = errors[static_cast<std::size_t>(p)];
      return {};
    }
  return objects;
}

}  // namespace qkv::codegen
