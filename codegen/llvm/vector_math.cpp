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
#include <llvm/IR/IntrinsicsX86.h>

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
// 2^f on [-1/2, 1/2] to degree 3 (Lawson's weighted least squares, relative error 7.5e-5 with
// fp32 coefficients and fused multiply-adds): for values rounded to bf16 before they are used.
constexpr std::array<double, 4> kExp2PolyBf16 = {0.9999280571937561, 0.6932610273361206, 0.24261121451854706,
                                                 0.05517137795686722};
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

llvm::Value* emit_exp2_scalef(llvm::IRBuilder<>& b, llvm::Value* x, bool for_bf16) {
  llvm::Type* t = x->getType();
  // Clamped below so that −inf − round(−inf) is no NaN; at −150 the result rounds to +0.
  llvm::Value* y = clamp_keep_nan(b, x, -150.0, std::numeric_limits<double>::quiet_NaN());
  llvm::Value* all = b.getInt16(0xFFFF);
  llvm::Value* current = b.getInt32(4);  // _MM_FROUND_CUR_DIRECTION: round to nearest even
  // imm 8: round to the nearest integer (ties to even), precision exceptions suppressed.
  llvm::Value* n = b.CreateIntrinsic(llvm::Intrinsic::x86_avx512_mask_rndscale_ps_512, {},
                                     {y, b.getInt32(8), y, all, current}, nullptr, "exp2.n");
  llvm::Value* f = b.CreateFSub(y, n, "exp2.f");
  llvm::Value* p = for_bf16 ? polynomial(b, f, kExp2PolyBf16) : polynomial(b, f, kExp2Poly);
  return b.CreateIntrinsic(llvm::Intrinsic::x86_avx512_mask_scalef_ps_512, {},
                           {p, n, llvm::UndefValue::get(t), all, current}, nullptr, "exp2");
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

namespace {

llvm::Type* i64_type_like(llvm::Type* t) {
  llvm::Type* i64 = llvm::Type::getInt64Ty(t->getContext());
  if (auto* vt = llvm::dyn_cast<llvm::VectorType>(t)) return llvm::VectorType::get(i64, vt->getElementCount());
  return i64;
}

/// 1.5 · 2^52: adding it to |x| < 2^51 rounds x to an integer k, left in the low mantissa bits.
constexpr double kRoundMagic64 = 6755399441055744.0;
constexpr std::uint64_t kRoundMagic64Bits = 0x4338000000000000ull;

/// {k = round(x) as a double, the bits of x + magic (whose low bits are k's, two's complement)}.
std::pair<llvm::Value*, llvm::Value*> round_f64(llvm::IRBuilder<>& b, llvm::Value* x) {
  llvm::Value* magic = llvm::ConstantFP::get(x->getType(), kRoundMagic64);
  llvm::Value* shifted = b.CreateFAdd(x, magic);
  return {b.CreateFSub(shifted, magic), b.CreateBitCast(shifted, i64_type_like(x->getType()))};
}

double inv_factorial(int n) {
  double v = 1.0;
  for (int i = 2; i <= n; ++i) v *= i;
  return 1.0 / v;
}

/// Σ_k sign^j · r^(first + 2j)/(first + 2j)! for first + 2j <= last, by Horner's rule in r2 = r² (the
/// series of cos (first 0) and of sin r / r (first 1) with sign −1); with step 1 (r2 = r) and
/// sign +1 the series of e^r.
llvm::Value* series(llvm::IRBuilder<>& b, llvm::Value* r2, int first, int last, int step, double sign) {
  llvm::Type* t = r2->getType();
  auto term = [&](int n) {
    const int j = (n - first) / step;
    return llvm::ConstantFP::get(t, (sign < 0 && j % 2 ? -1.0 : 1.0) * inv_factorial(n));
  };
  llvm::Value* p = term(last);
  for (int n = last - step; n >= first; n -= step) p = fmuladd(b, p, r2, term(n));
  return p;
}

}  // namespace

llvm::Value* emit_exp2_f64(llvm::IRBuilder<>& b, llvm::Value* x) {
  llvm::Type* t = x->getType();
  llvm::Type* it = i64_type_like(t);
  llvm::Value* y = clamp_keep_nan(b, x, -1022.0, 1023.0);
  auto [n, bits] = round_f64(b, y);
  llvm::Value* r = b.CreateFMul(b.CreateFSub(y, n), llvm::ConstantFP::get(t, kLn2));
  llvm::Value* p = series(b, r, 0, 13, 1, 1.0);  // e^r
  // bits = magic + n  ->  exponent field n + 1023, moved into place.
  llvm::Value* biased = b.CreateAdd(bits, llvm::ConstantInt::get(it, 1023ull - kRoundMagic64Bits));
  llvm::Value* scale = b.CreateBitCast(b.CreateShl(biased, llvm::ConstantInt::get(it, 52)), t);
  return b.CreateFMul(p, scale);
}

std::pair<llvm::Value*, llvm::Value*> emit_sincos_f64(llvm::IRBuilder<>& b, llvm::Value* x) {
  llvm::Type* t = x->getType();
  llvm::Type* it = i64_type_like(t);
  auto f = [&](double v) { return llvm::ConstantFP::get(t, v); };
  // π/2 in three parts of 33 bits each (fdlibm's pio2_1, pio2_2, pio2_3): k·part is exact for |k| < 2^20.
  constexpr double kPio2_1 = 1.57079632673412561417e+00, kPio2_2 = 6.07710050630396597660e-11,
                   kPio2_3 = 2.02226624871116645580e-21;
  auto [k, bits] = round_f64(b, b.CreateFMul(x, f(0.63661977236758134308)));
  llvm::Value* r = fmuladd(b, k, f(-kPio2_1), x);
  r = fmuladd(b, k, f(-kPio2_2), r);
  r = fmuladd(b, k, f(-kPio2_3), r);
  llvm::Value* r2 = b.CreateFMul(r, r);
  // sin r = r·(1 − r²/3! + r⁴/5! − …), cos r = 1 − r²/2! + r⁴/4! − …
  llvm::Value* sin_r = b.CreateFMul(r, series(b, r2, 1, 17, 2, -1.0));
  llvm::Value* cos_r = series(b, r2, 0, 16, 2, -1.0);
  // Quadrant k mod 4 (the low bits of magic + k): 0: (s, c), 1: (c, −s), 2: (−s, −c), 3: (−c, s).
  llvm::Value* q = b.CreateAnd(bits, llvm::ConstantInt::get(it, 3));
  llvm::Value* swap = b.CreateICmpNE(b.CreateAnd(q, llvm::ConstantInt::get(it, 1)), llvm::ConstantInt::get(it, 0));
  llvm::Value* sin_base = b.CreateSelect(swap, cos_r, sin_r);
  llvm::Value* cos_base = b.CreateSelect(swap, sin_r, cos_r);
  llvm::Value* neg_sin = b.CreateICmpUGE(q, llvm::ConstantInt::get(it, 2));
  llvm::Value* neg_cos =
      b.CreateOr(b.CreateICmpEQ(q, llvm::ConstantInt::get(it, 1)), b.CreateICmpEQ(q, llvm::ConstantInt::get(it, 2)));
  return {b.CreateSelect(neg_sin, b.CreateFNeg(sin_base), sin_base),
          b.CreateSelect(neg_cos, b.CreateFNeg(cos_base), cos_base)};
}

}  // namespace qkv::codegen::cpu
