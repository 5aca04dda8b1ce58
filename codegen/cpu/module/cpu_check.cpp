// The CPU check of an emitted library (cpu_check.hpp): cpuid / XCR0 or AT_HWCAP read once, the
// required features compared bit by bit (llvm/cpu_features.hpp's table), the message built once.
#include "cpu/module/cpu_check.hpp"

#include <array>
#include <map>
#include <mutex>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/Module.h>

#include "llvm/cpu_features.hpp"

namespace qkv::codegen::cpu {

namespace {

using cpu_features::Word;

/// The baseline CPU of an architecture, and its feature string (computed once per triple).
const HostTarget& baseline(const std::string& triple) {
  static std::mutex mutex;
  static std::map<std::string, HostTarget> made;
  std::lock_guard lock(mutex);
  auto it = made.find(triple);
  if (it == made.end())
    it = made.emplace(triple, make_target(triple, target_arch(triple) == "x86_64" ? "x86-64" : "generic")).first;
  return it->second;
}

/// {eax, ebx, ecx, edx} of cpuid(leaf, sub).
std::array<llvm::Value*, 4> cpuid(llvm::IRBuilder<>& b, std::uint32_t leaf, std::uint32_t sub) {
  llvm::Type* i32 = b.getInt32Ty();
  auto* ty = llvm::FunctionType::get(llvm::StructType::get(i32, i32, i32, i32), {i32, i32}, false);
  auto* asm_ = llvm::InlineAsm::get(ty, "cpuid", "={ax},={bx},={cx},={dx},{ax},{cx},~{dirflag},~{fpsr},~{flags}",
                                    /*hasSideEffects=*/true);
  llvm::Value* r = b.CreateCall(ty, asm_, {b.getInt32(leaf), b.getInt32(sub)});
  return {b.CreateExtractValue(r, 0), b.CreateExtractValue(r, 1), b.CreateExtractValue(r, 2),
          b.CreateExtractValue(r, 3)};
}

/// The words of llvm/cpu_features.hpp on x86-64, as i64. A leaf past the CPU's maximum reads 0;
/// XCR0 is read only when the OS enabled xgetbv (leaf 1 ECX.OSXSAVE), else 0.
std::array<llvm::Value*, cpu_features::kWords> x86_words(llvm::IRBuilder<>& b, llvm::Function* f) {
  llvm::Type* i64 = b.getInt64Ty();
  auto wide = [&](llvm::Value* v) { return b.CreateZExt(v, i64); };
  llvm::Value* zero = b.getInt64(0);
  std::array<llvm::Value*, cpu_features::kWords> w;
  w.fill(zero);
  llvm::Value* max = cpuid(b, 0, 0)[0];
  const auto l1 = cpuid(b, 1, 0);
  const auto l7 = cpuid(b, 7, 0);
  const auto l7s1 = cpuid(b, 7, 1);
  llvm::Value* max_ext = cpuid(b, 0x80000000u, 0)[0];
  const auto e1 = cpuid(b, 0x80000001u, 0);
  llvm::Value* has7 = b.CreateICmpUGE(max, b.getInt32(7));
  llvm::Value* has7s1 = b.CreateAnd(has7, b.CreateICmpUGE(l7[0], b.getInt32(1)));
  llvm::Value* has_e1 = b.CreateICmpUGE(max_ext, b.getInt32(0x80000001u));
  auto at = [&](Word word) -> llvm::Value*& { return w[static_cast<std::size_t>(word)]; };
  at(Word::leaf1_ecx) = wide(l1[2]);
  at(Word::leaf1_edx) = wide(l1[3]);
  at(Word::leaf7_ebx) = b.CreateSelect(has7, wide(l7[1]), zero);
  at(Word::leaf7_ecx) = b.CreateSelect(has7, wide(l7[2]), zero);
  at(Word::leaf7_edx) = b.CreateSelect(has7, wide(l7[3]), zero);
  at(Word::leaf7s1_eax) = b.CreateSelect(has7s1, wide(l7s1[0]), zero);
  at(Word::leaf7s1_edx) = b.CreateSelect(has7s1, wide(l7s1[3]), zero);
  at(Word::ext1_ecx) = b.CreateSelect(has_e1, wide(e1[2]), zero);
  // xgetbv faults unless the OS set CR4.OSXSAVE (reported as leaf 1 ECX bit 27).
  llvm::BasicBlock* from = b.GetInsertBlock();
  auto* read = llvm::BasicBlock::Create(b.getContext(), "xgetbv", f);
  auto* done = llvm::BasicBlock::Create(b.getContext(), "words", f);
  b.CreateCondBr(b.CreateICmpNE(b.CreateAnd(l1[2], b.getInt32(1u << 27)), b.getInt32(0)), read, done);
  b.SetInsertPoint(read);
  llvm::Type* i32 = b.getInt32Ty();
  auto* ty = llvm::FunctionType::get(llvm::StructType::get(i32, i32), {i32}, false);
  auto* asm_ = llvm::InlineAsm::get(ty, "xgetbv", "={ax},={dx},{cx},~{dirflag},~{fpsr},~{flags}", true);
  llvm::Value* xcr0 = wide(b.CreateExtractValue(b.CreateCall(ty, asm_, {b.getInt32(0)}), 0));
  b.CreateBr(done);
  b.SetInsertPoint(done);
  llvm::PHINode* phi = b.CreatePHI(i64, 2, "xcr0");
  phi->addIncoming(zero, from);
  phi->addIncoming(xcr0, read);
  at(Word::xcr0) = phi;
  return w;
}

/// AT_HWCAP (16) and AT_HWCAP2 (26) from the C library's getauxval.
std::array<llvm::Value*, cpu_features::kWords> aarch64_words(llvm::IRBuilder<>& b, llvm::Module& m) {
  llvm::Type* i64 = b.getInt64Ty();
  std::array<llvm::Value*, cpu_features::kWords> w;
  w.fill(b.getInt64(0));
  auto getauxval = m.getOrInsertFunction("getauxval", i64, i64);
  w[static_cast<std::size_t>(Word::hwcap)] = b.CreateCall(getauxval, {b.getInt64(16)});
  w[static_cast<std::size_t>(Word::hwcap2)] = b.CreateCall(getauxval, {b.getInt64(26)});
  return w;
}

}  // namespace

void baseline_attributes(llvm::Function* f, const HostTarget& target) {
  const HostTarget& base = baseline(target.triple);
  f->addFnAttr(llvm::Attribute::NoUnwind);
  f->addFnAttr("target-cpu", base.cpu);
  f->addFnAttr("target-features", joined_features(base));
}

CpuCheck emit_cpu_check(llvm::Module& m, const HostTarget& target, const std::string& prefix) {
  llvm::LLVMContext& ctx = m.getContext();
  llvm::IRBuilder<> b(ctx);
  llvm::Type* ptr = b.getPtrTy();
  llvm::Type* i32 = b.getInt32Ty();
  llvm::Type* i64 = b.getInt64Ty();
  const std::vector<std::string> required = required_features(target);
  CpuCheck out;

  // const char* <prefix>_required_features(void)
  std::string list;
  for (const auto& f : required) list += (list.empty() ? "" : ",") + f;
  out.required = llvm::Function::Create(llvm::FunctionType::get(ptr, false), llvm::GlobalValue::ExternalLinkage,
                                        prefix + "_required_features", m);
  baseline_attributes(out.required, target);
  b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", out.required));
  b.CreateRet(b.CreateGlobalStringPtr(list, prefix + "_required_list"));

  // const char* <prefix>_check_cpu(void)
  const std::string head = cpu_error(target, {});  // "code for X needs a, b; this CPU lacks "
  std::size_t capacity = head.size() + 1;
  for (const auto& f : required) capacity += f.size() + 2;
  auto* buffer_type = llvm::ArrayType::get(b.getInt8Ty(), capacity);
  auto* buffer = new llvm::GlobalVariable(m, buffer_type, false, llvm::GlobalValue::InternalLinkage,
                                          llvm::ConstantAggregateZero::get(buffer_type), prefix + "_cpu_message");
  // 0: not checked yet, 1: this CPU runs the code, 2: it does not (the message is written), 3: a
  // thread is writing the message.
  auto* state =
      new llvm::GlobalVariable(m, i32, false, llvm::GlobalValue::InternalLinkage, b.getInt32(0), prefix + "_cpu_state");
  llvm::Function* f = out.check = llvm::Function::Create(llvm::FunctionType::get(ptr, false),
                                                         llvm::GlobalValue::ExternalLinkage, prefix + "_check_cpu", m);
  baseline_attributes(f, target);
  auto block = [&](const char* name) { return llvm::BasicBlock::Create(ctx, name, f); };
  llvm::Value* null = llvm::ConstantPointerNull::get(llvm::cast<llvm::PointerType>(ptr));
  auto load_state = [&] {
    auto* l = b.CreateLoad(i32, state);
    l->setAtomic(llvm::AtomicOrdering::Acquire);
    l->setAlignment(llvm::Align(4));
    return l;
  };
  auto store_state = [&](int v) {
    auto* s = b.CreateStore(b.getInt32(v), state);
    s->setAtomic(llvm::AtomicOrdering::Release);
    s->setAlignment(llvm::Align(4));
  };
  b.SetInsertPoint(block("entry"));
  llvm::Value* s0 = load_state();
  auto* known = block("known");
  auto* probe = block("probe");
  b.CreateCondBr(b.CreateICmpEQ(s0, b.getInt32(0)), probe, known);
  b.SetInsertPoint(known);  // 1, 2, or 3 (wait for the writer)
  {
    auto* wait = block("wait");
    auto* answer = block("answer");
    b.CreateBr(wait);
    b.SetInsertPoint(wait);
    llvm::Value* s = load_state();
    b.CreateCondBr(b.CreateICmpEQ(s, b.getInt32(3)), wait, answer);
    b.SetInsertPoint(answer);
    b.CreateRet(b.CreateSelect(b.CreateICmpEQ(s, b.getInt32(1)), null, buffer));
  }
  b.SetInsertPoint(probe);
  const std::string arch = target_arch(target.triple);
  const auto words = arch == "x86_64" ? x86_words(b, f) : aarch64_words(b, m);
  std::vector<llvm::Value*> has;
  llvm::Value* all = b.getTrue();
  const auto table = cpu_features::checked(arch);
  for (const auto& name : required) {
    const auto c = std::find_if(table.begin(), table.end(), [&](const auto& e) { return e.name == name; });
    auto bits = [&](Word w, std::uint64_t mask) {
      llvm::Value* m64 = b.getInt64(mask);
      return b.CreateICmpEQ(b.CreateAnd(words[static_cast<std::size_t>(w)], m64), m64);
    };
    llvm::Value* ok = bits(c->word, c->mask);
    if (c->also) ok = b.CreateAnd(ok, bits(c->also_word, c->also));
    has.push_back(ok);
    all = b.CreateAnd(all, ok);
  }
  auto* runs = block("runs");
  auto* lacks = block("lacks");
  b.CreateCondBr(all, runs, lacks);
  b.SetInsertPoint(runs);
  store_state(1);
  b.CreateRet(null);
  b.SetInsertPoint(lacks);
  auto* cas = b.CreateAtomicCmpXchg(state, b.getInt32(0), b.getInt32(3), llvm::MaybeAlign(4),
                                    llvm::AtomicOrdering::Acquire, llvm::AtomicOrdering::Acquire);
  auto* write = block("write");
  b.CreateCondBr(b.CreateExtractValue(cas, 1), write, known);
  b.SetInsertPoint(write);
  llvm::Value* at = b.getInt64(head.size());
  b.CreateMemCpy(buffer, llvm::MaybeAlign(1), b.CreateGlobalStringPtr(head, prefix + "_cpu_head"), llvm::MaybeAlign(1),
                 head.size());
  for (std::size_t k = 0; k < required.size(); ++k) {  // ", " after each missing name
    const std::string piece = required[k] + ", ";
    llvm::Value* text = b.CreateGlobalStringPtr(piece, prefix + "_cpu_name");
    auto* append = block("append");
    auto* next = block("next");
    llvm::BasicBlock* before = b.GetInsertBlock();
    b.CreateCondBr(has[k], next, append);
    b.SetInsertPoint(append);
    b.CreateMemCpy(b.CreateGEP(b.getInt8Ty(), buffer, at), llvm::MaybeAlign(1), text, llvm::MaybeAlign(1),
                   piece.size());
    llvm::Value* grown = b.CreateAdd(at, b.getInt64(piece.size()));
    b.CreateBr(next);
    b.SetInsertPoint(next);
    llvm::PHINode* phi = b.CreatePHI(i64, 2);
    phi->addIncoming(at, before);
    phi->addIncoming(grown, append);
    at = phi;
  }
  // Drop the last ", " (at least one name was appended: some feature is missing).
  b.CreateStore(b.getInt8(0), b.CreateGEP(b.getInt8Ty(), buffer, b.CreateSub(at, b.getInt64(2))));
  store_state(2);
  b.CreateRet(buffer);
  return out;
}

}  // namespace qkv::codegen::cpu
