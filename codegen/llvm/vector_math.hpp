// codegen/llvm/vector_math.hpp — elementary functions emitted as plain LLVM IR.
//
// Why: `llvm.exp.v16f32` on x86 is lowered to 16 scalar calls to expf. These are branch-free
// range reduction + polynomial, written with ordinary IR instructions (fadd, fmuladd, bitcast,
// shl) on any float type — `float` or `<N x float>` — so they vectorise to whatever width the
// caller chose.
#pragma once

#include <llvm/IR/IRBuilder.h>

namespace qkv::codegen {
/// log2(e): exponentials are computed as 2^(x·log2 e) (here, and in the attention kernels' scores
/// on both targets).
inline constexpr double kLog2e = 1.4426950408889634;
/// ln 2 = 1 / log2(e): a value in log2 units back to nats.
inline constexpr double kLn2 = 0.6931471805599453;
}  // namespace qkv::codegen

namespace qkv::codegen::cpu {

/// 2^x. Max relative error ~2e-7 on the normal range. x = −inf (and anything below −126.5)
/// gives exactly +0 — the masked entries of a softmax contribute nothing; x >= 128 gives +inf;
/// NaN stays NaN. `no_overflow`: the caller guarantees x < 128 or NaN (a softmax's x − max <= 0),
/// which saves the upper clamp.
llvm::Value* emit_exp2(llvm::IRBuilder<>& b, llvm::Value* x, bool no_overflow = false);

/// emit_exp2 on <16 x float> with AVX-512's vrndscaleps / vscalefps: n = round(x), 2^f by the
/// same polynomial, scaled by 2^n in one instruction (9 vector operations, not 12). The same
/// values as emit_exp2 wherever 2^x is a normal float below 2^127.5 (and finite up to 2^128,
/// where emit_exp2 overflows early); x = −inf gives +0, NaN stays NaN; for x below −126 the
/// result is the denormal, flushed to +0 under MXCSR's flush-to-zero (which the fused attention
/// kernel sets while it runs, so that there both forms agree everywhere).
///
/// `for_bf16`: a degree-3 polynomial instead (max relative error 7.5e-5, 7 operations) for values
/// that are rounded to bf16 (relative error up to 2^-9 = 2.0e-3) before they are used.
llvm::Value* emit_exp2_scalef(llvm::IRBuilder<>& b, llvm::Value* x, bool for_bf16 = false);

/// e^x (Cody–Waite reduction by ln 2 in two parts, then the same kind of polynomial). Max
/// relative error ~3e-7; x = −inf (and x below about −87.7) gives +0, x >= 88.73 gives +inf,
/// NaN stays NaN.
llvm::Value* emit_exp(llvm::IRBuilder<>& b, llvm::Value* x);

/// log2 x, with no call (the AOT objects need no libm): max absolute error ~1e-7 near x = 1,
/// relative ~1e-7 elsewhere; denormals included; log2 0 = −inf, log2 +inf = +inf, NaN for x < 0
/// or NaN.
llvm::Value* emit_log2(llvm::IRBuilder<>& b, llvm::Value* x);

/// 2^x in double (rope's frequencies theta^(−2i/D) = 2^(−2i/D·log2 theta)): Taylor series of
/// e^(f·ln 2) to degree 13 after x = n + f, |f| <= 1/2 (relative error < 1e-16); x is clamped
/// to [−1022, 1023] (2^−1022 and 2^1023 there); NaN stays NaN.
llvm::Value* emit_exp2_f64(llvm::IRBuilder<>& b, llvm::Value* x);

/// {sin x, cos x} in double, with no call: x − k·π/2 in three parts (Cody–Waite, exact for
/// |x| < 1.6e6), then Taylor series to degree 17 on [−π/4, π/4] (error < 1e-16). The rotary
/// embedding's angles (f32 position · frequency) stay far inside that range.
std::pair<llvm::Value*, llvm::Value*> emit_sincos_f64(llvm::IRBuilder<>& b, llvm::Value* x);

}  // namespace qkv::codegen::cpu
