// Philox4x32-10 (Salmon et al., SC'11) in IR, word for word the same rounds as runtime/src/rng.cpp.
#include "llvm/philox_ir.hpp"

#include <cmath>
#include <cstdint>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>

namespace qkv::codegen::cpu {

namespace {
// The constants of rng.cpp: round multipliers and the Weyl increments of the key.
constexpr std::uint32_t kMul0 = 0xD2511F53u;
constexpr std::uint32_t kMul1 = 0xCD9E8D57u;
constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;
constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;
constexpr int kRounds = 10;
constexpr int kUniformShift = 8;              // the top 24 bits make the uniform
constexpr double kUniformSteps = 16777216.0;  // 2^24

llvm::Type* widened(llvm::Type* t) {
  llvm::Type* i64 = llvm::Type::getInt64Ty(t->getContext());
  if (auto* vt = llvm::dyn_cast<llvm::VectorType>(t)) return llvm::VectorType::get(i64, vt->getElementCount());
  return i64;
}

/// hi and lo halves of the 64-bit product m · a.
std::pair<llvm::Value*, llvm::Value*> mulhilo(llvm::IRBuilder<>& b, std::uint32_t m, llvm::Value* a) {
  llvm::Type* t = a->getType();
  auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(t);
  if (vt && vt->getNumElements() % 2 == 0) {
    // Pairs of lanes as one i64: the even lane's product from the low half, the odd lane's from
    // the high half, and the halves put back in place — x86 does 32×32→64 multiplies only on
    // the even lanes (pmuludq), so this avoids widening <N x i32> to two registers and back.
    auto* pairs = llvm::FixedVectorType::get(b.getInt64Ty(), vt->getNumElements() / 2);
    llvm::Value* x = b.CreateBitCast(a, pairs);
    llvm::Value* low_mask = llvm::ConstantInt::get(pairs, 0xFFFFFFFFull);
    llvm::Value* high_mask = llvm::ConstantInt::get(pairs, 0xFFFFFFFF00000000ull);
    llvm::Value* mul = llvm::ConstantInt::get(pairs, m);
    llvm::Value* shift = llvm::ConstantInt::get(pairs, 32);
    llvm::Value* even = b.CreateMul(b.CreateAnd(x, low_mask), mul, "philox.even", true, false);
    llvm::Value* odd = b.CreateMul(b.CreateLShr(x, shift), mul, "philox.odd", true, false);
    llvm::Value* hi = b.CreateOr(b.CreateLShr(even, shift), b.CreateAnd(odd, high_mask));
    llvm::Value* lo = b.CreateOr(b.CreateAnd(even, low_mask), b.CreateShl(odd, shift));
    return {b.CreateBitCast(hi, t, "philox.hi"), b.CreateBitCast(lo, t, "philox.lo")};
  }
  llvm::Type* wide = widened(t);
  llvm::Value* product = b.CreateMul(b.CreateZExt(a, wide), llvm::ConstantInt::get(wide, m), "philox.prod",
                                     /*HasNUW=*/true, /*HasNSW=*/false);
  llvm::Value* hi = b.CreateTrunc(b.CreateLShr(product, llvm::ConstantInt::get(wide, 32)), t, "philox.hi");
  llvm::Value* lo = b.CreateTrunc(product, t, "philox.lo");
  return {hi, lo};
}

/// A uniform scalar `v` (i32) as a value of type t (splat when t is a vector).
llvm::Value* like(llvm::IRBuilder<>& b, llvm::Value* v, llvm::Type* t) {
  if (auto* vt = llvm::dyn_cast<llvm::VectorType>(t)) {
    if (v->getType()->isVectorTy()) return v;
    return b.CreateVectorSplat(vt->getElementCount(), v);
  }
  return v;
}
}  // namespace

std::array<llvm::Value*, 4> emit_philox4x32(llvm::IRBuilder<>& b, std::array<llvm::Value*, 4> c, llvm::Value* key) {
  llvm::Type* i32 = b.getInt32Ty();
  llvm::Value* k0 = b.CreateTrunc(key, i32, "philox.k0");
  llvm::Value* k1 = b.CreateTrunc(b.CreateLShr(key, b.getInt64(32)), i32, "philox.k1");
  llvm::Type* t = c[0]->getType();
  for (int r = 0; r < kRounds; ++r) {
    auto [hi0, lo0] = mulhilo(b, kMul0, c[0]);
    auto [hi1, lo1] = mulhilo(b, kMul1, c[2]);
    c = {b.CreateXor(b.CreateXor(hi1, c[1]), like(b, k0, t)), lo1, b.CreateXor(b.CreateXor(hi0, c[3]), like(b, k1, t)),
         lo0};
    k0 = b.CreateAdd(k0, b.getInt32(kWeyl0));
    k1 = b.CreateAdd(k1, b.getInt32(kWeyl1));
  }
  return c;
}

llvm::Value* emit_dropout_keep(llvm::IRBuilder<>& b, double p, llvm::Value* seed, llvm::Value* batch, llvm::Value* head,
                               llvm::Value* row, llvm::Value* col) {
  // Bring every word to the widest type among them (the lanes vary in row or col).
  llvm::Type* t = row->getType();
  for (llvm::Value* v : {col, head, batch})
    if (v->getType()->isVectorTy()) t = v->getType();
  const auto out = emit_philox4x32(b, {like(b, row, t), like(b, col, t), like(b, head, t), like(b, batch, t)}, seed);
  // uniform = (w >> 8) · 2^-24 is exact, and uniform >= pf  <=>  (w >> 8) >= ceil(pf · 2^24)
  // (pf · 2^24 is exact in double): the comparison of rng.hpp, done on integers.
  const double pf = static_cast<double>(static_cast<float>(p));
  const auto threshold = static_cast<std::uint32_t>(std::ceil(pf * kUniformSteps));
  llvm::Value* top = b.CreateLShr(out[0], llvm::ConstantInt::get(t, kUniformShift));
  return b.CreateICmpUGE(top, llvm::ConstantInt::get(t, threshold), "dropout.keep");
}

}  // namespace qkv::codegen::cpu
