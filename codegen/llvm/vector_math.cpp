// Vectorisable exp and exp2 in IR: reduce x = n + f (|f| <= 1/2) with the round-to-nearest
// "magic number" trick, evaluate a degree-5 minimax polynomial for 2^f (or e^r), and build 2^n
// directly in the exponent bits. No fptosi (its result is poison for NaN), no calls, no tables.
// log2: the exponent field and a mantissa in [√½, √2), then Cephes' logf polynomial.
#include "llvm/vector_math.hpp"

#include <array>
#include <limits>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Intrinsics.h>

namespace qkv::codegen::cpu {

namespace {

// 1.5 · 2^23: adding it to |x| < 2^22 rounds x to an integer (round-to-nearest-even, the default
// mode) and leaves that integer, offset by 0x400000, in the low mantissa bits of the sum.
constexpr double kRoundMagic = 12582912.0;
constexpr std::uint32_t kRoundMagicBits = 0x4B400000u;
constexpr int kExponentBias = 127;
constexpr int kMantissaBits = 23;
// Reduced-range limits: 2^-127 has a zero exponent field (we build +0 there), 2^128 is +inf.
constexpr double kExp2Lo = -127.0;
constexpr double kExp2Hi = 128.0;

// ln 2 split in two (Cody–Waite): kLn2Hi has few significant bits, so n·kLn2Hi is exact.
constexpr double kLn2Hi = 0.693359375;
constexpr double kLn2Lo = -2.12194440e-4;

// Minimax (relative error) fits, computed for fp32 evaluation with fused multiply-adds:
// 2^f on [-1/2, 1/2] (fit error 9.1e-8) and e^r on [-ln2/2, ln2/2] (fit error 9.2e-8).
constexpr std::array<double, 6> kExp2Poly = {1.0, 0.693147004, 0.240222424, 0.0555073358, 0.00967151299, 0.00132647273};
constexpr std::array<double, 6> kExpPoly = {1.0, 0.999999702, 0.499991506, 0.166676372, 0.0418979637, 0.00829030853};

llvm::Type* int_type_like(llvm::Type* t) {
  llvm::Type* i32 = llvm::Type::getInt32Ty(t->getContext());
  if (auto* vt = llvm::dyn_cast<llvm::VectorType>(t)) return llvm::VectorType::get(i32, vt->getElementCount());
  return i32;
}

llvm::Value* fmuladd(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y, llvm::Value* z) {
  return b.CreateIntrinsic(llvm::Intrinsic::fmuladd, {x->getType()}, {x, y, z});
}

/// Horner's rule: c[0] + r·(c[1] + r·(…)).
template <std::size_t N>
llvm::Value* polynomial(llvm::IRBuilder<>& b, llvm::Value* r, const std::array<double, N>& c) {
  llvm::Type* t = r->getType();
  llvm::Value* p = llvm::ConstantFP::get(t, c[N - 1]);
  for (std::size_t k = N - 1; k-- > 0;) p = fmuladd(b, p, r, llvm::ConstantFP::get(t, c[k]));
  return p;
}

/// x clamped to [lo, hi] (to [lo, +inf) when hi is NaN), NaN preserved: a compare with NaN is
/// false, so the select keeps x.
llvm::Value* clamp_keep_nan(llvm::IRBuilder<>& b, llvm::Value* x, double lo, double hi) {
  llvm::Type* t = x->getType();
  llvm::Value* clo = llvm::ConstantFP::get(t, lo);
  x = b.CreateSelect(b.CreateFCmpOLT(x, clo), clo, x);
  if (hi != hi) return x;
  llvm::Value* chi = llvm::ConstantFP::get(t, hi);
  return b.CreateSelect(b.CreateFCmpOGT(x, chi), chi, x);
}

/// Splits y (already clamped to [-127, 128]) into n = round(y) and returns {n as float, 2^n}.
std::pair<llvm::Value*, llvm::Value*> round_and_scale(llvm::IRBuilder<>& b, llvm::Value* y) {
  llvm::Type* t = y->getType();
  llvm::Type* it = int_type_like(t);
  llvm::Value* magic = llvm::ConstantFP::get(t, kRoundMagic);
  llvm::Value* shifted = b.CreateFAdd(y, magic, "exp.shifted");
  llvm::Value* n = b.CreateFSub(shifted, magic, "exp.n");
  // bits(shifted) = 0x4B400000 + n  ->  exponent field n + 127, moved into place.
  llvm::Value* bits = b.CreateBitCast(shifted, it);
  llvm::Value* biased =
      b.CreateAdd(bits, llvm::ConstantInt::get(it, static_cast<std::uint32_t>(kExponentBias) - kRoundMagicBits));
  llvm::Value* scale = b.CreateBitCast(b.CreateShl(biased, llvm::ConstantInt::get(it, kMantissaBits)), t, "exp.scale");
  return {n, scale};
}

// Cephes logf: ln(1 + x) = x − x²/2 + x³·P(x) for x in [√½ − 1, √2 − 1] (about 1 ulp).
constexpr std::array<double, 9> kLogPoly = {3.3333331174e-1,  -2.4999993993e-1, 2.0000714765e-1,
                                            -1.6668057665e-1, 1.4249322787e-1,  -1.2420140846e-1,
                                            1.1676998740e-1,  -1.1514610310e-1, 7.0376836292e-2};

}  // namespace

llvm::Value* emit_log2(llvm::IRBuilder<>& b, llvm::Value* x) {
  llvm::Type* t = x->getType();
  llvm::Type* it = int_type_like(t);
  auto f = [&](double v) { return llvm::ConstantFP::get(t, v); };
  auto i = [&](std::uint32_t v) { return llvm::ConstantInt::get(it, v); };
  // Denormals first scaled by 2^23 (their exponent then corrected).
  llvm::Value* tiny = b.CreateFCmpOLT(x, f(0x1p-126));
  llvm::Value* xs = b.CreateSelect(tiny, b.CreateFMul(x, f(0x1p23)), x);
  llvm::Value* bits = b.CreateBitCast(xs, it);
  llvm::Value* e = b.CreateSub(b.CreateLShr(bits, i(kMantissaBits)), i(kExponentBias));
  llvm::Value* m = b.CreateBitCast(b.CreateOr(b.CreateAnd(bits, i(0x007FFFFFu)), i(0x3F800000u)), t);  // [1, 2)
  // m >= √2: halve it (and count one more in the exponent), so that m − 1 is small either way.
  llvm::Value* big = b.CreateFCmpOGE(m, f(1.41421356237));
  m = b.CreateSelect(big, b.CreateFMul(m, f(0.5)), m);
  llvm::Value* ef = b.CreateSIToFP(b.CreateAdd(e, b.CreateZExt(big, it)), t);
  ef = b.CreateSelect(tiny, b.CreateFSub(ef, f(23.0)), ef);
  llvm::Value* r = b.CreateFSub(m, f(1.0));
  llvm::Value* r2 = b.CreateFMul(r, r);
  llvm::Value* p = polynomial(b, r, kLogPoly);
  llvm::Value* ln = fmuladd(b, b.CreateFMul(r2, r), p, fmuladd(b, r2, f(-0.5), r));  // ln(m)
  llvm::Value* y = fmuladd(b, ln, f(kLog2e), ef);
  // The special values: log2 0 = −inf, of a negative number or NaN NaN, log2 +inf = +inf.
  y = b.CreateSelect(b.CreateFCmpOEQ(x, f(0.0)), f(-std::numeric_limits<double>::infinity()), y);
  y = b.CreateSelect(b.CreateFCmpOEQ(x, f(std::numeric_limits<double>::infinity())), x, y);
  return b.CreateSelect(b.CreateFCmpOGE(x, f(0.0)), y, f(std::numeric_limits<double>::quiet_NaN()));
}

llvm::Value* emit_exp2(llvm::IRBuilder<>& b, llvm::Value* x, bool no_overflow) {
  llvm::Value* y = clamp_keep_nan(b, x, kExp2Lo, no_overflow ? std::numeric_limits<double>::quiet_NaN() : kExp2Hi);
  auto [n, scale] = round_and_scale(b, y);
  llvm::Value* f = b.CreateFSub(y, n, "exp2.f");
  return b.CreateFMul(polynomial(b, f, kExp2Poly), scale, "exp2");
}

llvm::Value* emit_exp(llvm::IRBuilder<>& b, llvm::Value* x) {
  llvm::Type* t = x->getType();
  // Clamp in the log2 domain so that n lands in [-127, 128] exactly as for exp2.
  llvm::Value* xc = clamp_keep_nan(b, x, kExp2Lo / kLog2e, kExp2Hi / kLog2e);
  llvm::Value* y = b.CreateFMul(xc, llvm::ConstantFP::get(t, kLog2e));
  y = clamp_keep_nan(b, y, kExp2Lo, kExp2Hi);
  auto [n, scale] = round_and_scale(b, y);
  llvm::Value* r = fmuladd(b, n, llvm::ConstantFP::get(t, -kLn2Hi), xc);
  r = fmuladd(b, n, llvm::ConstantFP::get(t, -kLn2Lo), r);
  return b.CreateFMul(polynomial(b, r, kExpPoly), scale, "exp");
}

}  // namespace qkv::codegen::cpu
