// codegen/llvm/ir_util.hpp — small helpers for emitting LLVM IR with an IRBuilder: counted
// loops with loop-carried SSA values, entry-block allocas, constants. Private to codegen.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <llvm/IR/IRBuilder.h>

#include <qkv/ir/dtype.hpp>

namespace qkv::codegen::cpu::ir {

/// The body of a counted loop: given the induction variable and the current values of the
/// loop-carried variables, emit the body at the builder's insertion point (it may create
/// blocks) and return the values for the next iteration (same count and types).
using LoopBody = std::function<std::vector<llvm::Value*>(llvm::Value* i, const std::vector<llvm::Value*>& carried)>;

/// What the optimiser may do to a loop. Loops whose bodies are already unrolled and vectorised
/// by the generator say `as_written`: unrolling them again only grows the code (and the JIT's
/// compile time) without making it faster.
enum class Unroll { allowed, as_written };

/// for (i = begin; i < end; i += step) — i64, signed compare, guarded (zero trips allowed) and
/// rotated (one compare per iteration, at the latch). Returns the carried values after the loop
/// (their initial values when it runs zero times); the builder is left in the exit block.
std::vector<llvm::Value*> emit_loop(llvm::IRBuilder<>& b, llvm::Value* begin, llvm::Value* end, std::int64_t step,
                                    std::vector<llvm::Value*> init, const LoopBody& body, const llvm::Twine& name,
                                    Unroll unroll = Unroll::as_written);

/// The same without carried values.
void emit_loop(llvm::IRBuilder<>& b, llvm::Value* begin, llvm::Value* end, std::int64_t step,
               const std::function<void(llvm::Value* i)>& body, const llvm::Twine& name,
               Unroll unroll = Unroll::as_written);

/// An alloca of `count` elements of `type` in the function's entry block (where SROA and
/// mem2reg look for them), aligned to `align` bytes.
llvm::AllocaInst* entry_alloca(llvm::IRBuilder<>& b, llvm::Type* type, std::uint64_t count, std::uint64_t align,
                               const llvm::Twine& name);

/// A kernel function `name` returning void, with the generated kernels' attributes: nounwind,
/// the target CPU and features, and vectors of `lanes` floats kept whole (without these the X86
/// backend may split 512-bit vectors in two: prefer-vector-width=256 on some CPUs); with
/// `args_param`, parameter 0 (an argument struct) noalias, nocapture, read-only. The builder is
/// left at its entry block.
llvm::Function* declare_kernel(llvm::Module& module, llvm::IRBuilder<>& b, const std::string& name,
                               const std::vector<llvm::Type*>& params, const std::string& cpu,
                               const std::string& features, int lanes, bool args_param);

/// One step of a transposing sum: x and y each hold `keys` dot products as lanes / keys
/// consecutive partial sums per product; the result holds x's products then y's, half as many
/// partial sums each (the first half of every block plus the second half). Starting from one
/// vector of lane-wise products per dot product, log2(lanes) levels of steps leave `lanes` dot
/// products in one vector, product j in lane j (the decode kernel's scores, the GEMV's outputs).
llvm::Value* transpose_add(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y, int keys);

/// The `lanes` dot products whose lane-wise products are `parts` (a power of two of them, at
/// most the vector width), by transpose_add: product j ends in lanes [j·w, (j + 1)·w) of the
/// result, w = lanes / parts.size(), still to be summed when w > 1.
llvm::Value* transpose_sum(llvm::IRBuilder<>& b, const std::vector<llvm::Value*>& parts);

/// The transpose of a square block held as n vectors of n lanes (n a power of two): lane j of
/// result i is lane i of rows[j]. log2(n) stages of n two-source shuffles, each swapping one bit
/// of the row index with the same bit of the lane index (64 shuffles for 16 x 16, where the
/// strided gathers or scatters it replaces cost far more on AMD's cores).
std::vector<llvm::Value*> transpose_square(llvm::IRBuilder<>& b, std::vector<llvm::Value*> rows);

/// The shuffle mask that interleaves the halves [x | y] of 2·lanes elements: [x0, y0, x1, y1, ...]
/// (bf16 pairs from two vectors of `lanes` elements).
std::vector<int> interleave_halves(int lanes);

inline llvm::Value* i64c(llvm::IRBuilder<>& b, std::int64_t v) { return b.getInt64(static_cast<std::uint64_t>(v)); }

/// Half-precision storage (lowering/storage.hpp) in registers: i16 elements (a scalar or a
/// vector) holding bf16 (`brain` true) or IEEE f16 bits, to float elements — exact — and float
/// elements to those bits, rounded to nearest, ties to even (a NaN stays a quiet NaN), as the
/// host's f32_to_bf16 / f32_to_f16 (runtime/io/array.hpp) do.
llvm::Value* half_to_f32(llvm::IRBuilder<>& b, llvm::Value* bits, bool brain);
llvm::Value* f32_to_half(llvm::IRBuilder<>& b, llvm::Value* f, bool brain);

/// The 4-bit entries in i8 `bytes` (a scalar or a vector; qkv/ir/quant.hpp): their high four bits
/// where the i1 `high` holds, else their low four, as stored (0 … 15) or, `centered`, less 8.
llvm::Value* q4_nibbles(llvm::IRBuilder<>& b, llvm::Value* bytes, llvm::Value* high, bool centered);

/// The same by dtype: an element loaded from a buffer of dtype `t` as the kernels compute with it
/// (f16 / bf16 bits widened to f32; i32 / i64 integers converted to f32; f32, bool bytes and the
/// rest as loaded), and an f32 result as
/// a buffer of dtype `t` stores it (rounded to f16 / bf16 bits; otherwise as it is).
llvm::Value* from_storage(llvm::IRBuilder<>& b, llvm::Value* v, DType t);
llvm::Value* to_storage(llvm::IRBuilder<>& b, llvm::Value* f, DType t);

/// acc + x·y over pairs of bf16, lane by lane (vdpbf16ps, AVX512-BF16): acc is <16 x float>; x and
/// y are any 64-byte vectors holding 32 bf16 (bitcast here); each lane adds the two exact products
/// of its pair.
llvm::Value* dot_bf16_pairs(llvm::IRBuilder<>& b, llvm::Value* acc, llvm::Value* x, llvm::Value* y);

/// The bf16 pairs (x_l, y_l) of two <16 x float>, rounded to nearest even (vcvtne2ps2bf16,
/// AVX512-BF16): lane l of the result, a <16 x float> only by type, holds x_l in its low half and
/// y_l in its high one — what dot_bf16_pairs multiplies.
llvm::Value* bf16_pairs(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y);
/// The same two vectors rounded to bf16 one after the other, [x | y] (no interleave): 32
/// consecutive values of a row as 16 pairs of neighbours.
llvm::Value* bf16_concat(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y);

/// <n x i1>: lane l < count (an i64).
llvm::Value* lanes_below(llvm::IRBuilder<>& b, int n, llvm::Value* count);

/// [x | y]: two vectors of one type joined into one of twice the lanes.
llvm::Value* concat(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y);

/// acc + Σ of four u8 · s8 products a lane (vpdpbusd): `u` and `s` hold four bytes a 32-bit lane,
/// `acc` i32 lanes; 16 lanes (AVX512-VNNI) or 8 (AVX-VNNI / AVX512-VL).
llvm::Value* dot_u8s8(llvm::IRBuilder<>& b, llvm::Value* acc, llvm::Value* u, llvm::Value* s);

}  // namespace qkv::codegen::cpu::ir
