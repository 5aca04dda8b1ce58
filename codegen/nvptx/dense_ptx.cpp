// The NVPTX kernels around attention: the linear layer's SGEMM, layer norm, elementwise maps and
// the strided copy. Their numerics mirror the CPU kernels (gemm.hpp, rowwise.hpp).
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <stdexcept>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Intrinsics.h>

#include "llvm/vector_math.hpp"
#include "nvptx/geometry.hpp"
#include "nvptx/kernel_builder.hpp"

namespace qkv::codegen::nvptx::detail {

namespace {

using Values = std::vector<llvm::Value*>;

[[noreturn]] void fail(const std::string& message) { throw std::runtime_error("nvptx: " + message); }

void mark_inputs(llvm::Function* fn, std::initializer_list<unsigned> inputs, std::initializer_list<unsigned> outputs,
                 bool noalias) {
  for (unsigned a : inputs) {
    if (noalias) fn->addParamAttr(a, llvm::Attribute::NoAlias);
    fn->addParamAttr(a, llvm::Attribute::NoCapture);
    fn->addParamAttr(a, llvm::Attribute::ReadOnly);
  }
  for (unsigned a : outputs) {
    if (noalias) fn->addParamAttr(a, llvm::Attribute::NoAlias);
    fn->addParamAttr(a, llvm::Attribute::NoCapture);
  }
}

/// The global index of this thread and the grid's thread count, as i64.
std::pair<llvm::Value*, llvm::Value*> grid_stride(KernelBuilder& kb) {
  auto& b = kb.b();
  llvm::Value* ntid = b.CreateZExt(kb.ntid_x(), kb.i64());
  llvm::Value* first =
      b.CreateAdd(b.CreateMul(b.CreateZExt(kb.ctaid_x(), kb.i64()), ntid), b.CreateZExt(kb.tid_x(), kb.i64()), "first");
  llvm::Value* stride = b.CreateMul(b.CreateZExt(kb.nctaid_x(), kb.i64()), ntid, "stride");
  return {first, stride};
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// linear: y[M,N] = x[M,K] · W[N,K]ᵀ + b[N]
//
// Block (bx, by) computes y[bx·BM .. +BM][by·BN .. +BN]. Thread (ty, tx) = (tid / (BN/4),
// tid % (BN/4)) owns rows ty·8 + r (r < 8) and columns tx·4 + c (c < 4): 32 accumulators. Per K
// slice of BK: both operand tiles are staged k-major (As[k][m], Bs[k][n], zeros outside M, N, K),
// then per k two ld.shared.v4 of As, one of Bs and 32 fma. Accumulation is in increasing k.

KernelInfo build_linear(llvm::Module& module, const LinearKernel& r, const HostEmulation* emulation) {
  if (r.storage == DType::bf16) return build_linear_mma(module, r, emulation);
  if (r.storage != DType::f32) fail("linear: x, w, b and y stored as " + std::string(dtype_name(r.storage)));
  if (r.block_m < 8 || r.block_m % 8 != 0 || r.block_n < 4 || r.block_n % 4 != 0 || r.block_k < 1 || r.block_k > 64)
    fail("linear: block_m must be a multiple of 8, block_n a multiple of 4, block_k in [1, 64]");
  const int threads = (r.block_m / 8) * (r.block_n / 4);
  check_threads(threads, 1024, "linear ((block_m / 8)·(block_n / 4))");
  const int am = r.block_m + 4, bn = r.block_n + 4;  // padded k-major rows (16-byte aligned)
  const std::int64_t smem_floats = std::int64_t{r.block_k} * (am + bn);
  if (smem_floats * 4 > 48 * 1024) fail("linear: the tiles need more than 48 KiB of static shared memory");

  KernelBuilder kb(module, emulation);
  auto& b = kb.b();
  llvm::Type *p = kb.ptr(), *i64 = kb.i64(), *f32 = kb.f32();
  const std::string name = kernel_name(r);
  llvm::Function* fn =
      kb.declare_kernel(name, {p, p, p, p, i64, i64, i64}, {"x", "w", "b", "y", "m", "n", "k"}, threads);
  mark_inputs(fn, {0, 1, 2}, {3}, true);
  llvm::Value *x = fn->getArg(0), *w = fn->getArg(1), *bias = fn->getArg(2), *y = fn->getArg(3);
  llvm::Value *M = fn->getArg(4), *N = fn->getArg(5), *K = fn->getArg(6);
  llvm::Value* smem = kb.static_shared("qkv_linear_tiles", smem_floats);
  llvm::Value* as = b.CreateConstInBoundsGEP1_64(f32, smem, 0);
  llvm::Value* bs = b.CreateConstInBoundsGEP1_64(f32, smem, static_cast<std::uint64_t>(r.block_k * am));

  llvm::Value* tid = kb.tid_x();
  llvm::Value* tx = b.CreateURem(tid, kb.c32(r.block_n / 4), "tx");
  llvm::Value* ty = b.CreateUDiv(tid, kb.c32(r.block_n / 4), "ty");
  llvm::Value* m0 = b.CreateMul(b.CreateZExt(kb.ctaid_x(), i64), kb.c64(r.block_m), "m0");
  llvm::Value* n0 = b.CreateMul(b.CreateZExt(kb.ctaid_y(), i64), kb.c64(r.block_n), "n0");
  llvm::Value* a_col = b.CreateMul(ty, kb.c32(8));  // this thread's rows within As' k-rows
  llvm::Value* b_col = b.CreateMul(tx, kb.c32(4));  // its columns within Bs' k-rows

  // tile[kk][row] = src[(base + row)·K + k0 + kk], 0 outside [0, limit) × [0, K).
  auto stage = [&](llvm::Value* src, llvm::Value* base, llvm::Value* limit, int rows, int stride, llvm::Value* tile,
                   llvm::Value* k0, const char* tag) {
    kb.loop(
        tid, kb.c32(rows * r.block_k), threads,
        [&](llvm::Value* idx) {
          llvm::Value* row = b.CreateUDiv(idx, kb.c32(r.block_k));
          llvm::Value* kk = b.CreateSub(idx, b.CreateMul(row, kb.c32(r.block_k)));
          llvm::Value* grow = b.CreateAdd(base, b.CreateZExt(row, i64));
          llvm::Value* gk = b.CreateAdd(k0, b.CreateZExt(kk, i64));
          llvm::Value* ok = b.CreateAnd(b.CreateICmpSLT(grow, limit), b.CreateICmpSLT(gk, K));
          llvm::Value* at = b.CreateSelect(ok, b.CreateAdd(b.CreateMul(grow, K), gk), kb.c64(0));
          llvm::Value* v = b.CreateLoad(f32, b.CreateInBoundsGEP(f32, src, at));
          b.CreateStore(b.CreateSelect(ok, v, kb.cf(0.0)),
                        b.CreateInBoundsGEP(f32, tile, b.CreateAdd(b.CreateMul(kk, kb.c32(stride)), row)));
        },
        tag);
  };

  auto* v4 = llvm::FixedVectorType::get(f32, 4);
  Values zero(32, kb.cf(0.0));
  Values acc = kb.loop(
      kb.c64(0), K, r.block_k, zero,
      [&](llvm::Value* k0, const Values& in) {
        Values a = in;
        kb.barrier();
        stage(x, m0, M, r.block_m, am, as, k0, "stage_x");
        stage(w, n0, N, r.block_n, bn, bs, k0, "stage_w");
        kb.barrier();
        for (int kk = 0; kk < r.block_k; ++kk) {
          llvm::Value* arow = b.CreateInBoundsGEP(f32, as, b.CreateAdd(a_col, kb.c32(kk * am)));
          llvm::Value* brow = b.CreateInBoundsGEP(f32, bs, b.CreateAdd(b_col, kb.c32(kk * bn)));
          llvm::Value* a0 = b.CreateAlignedLoad(v4, arow, llvm::Align(16));
          llvm::Value* a1 = b.CreateAlignedLoad(v4, b.CreateConstInBoundsGEP1_64(f32, arow, 4), llvm::Align(16));
          llvm::Value* bv = b.CreateAlignedLoad(v4, brow, llvm::Align(16));
          for (int i = 0; i < 8; ++i) {
            llvm::Value* ai = b.CreateExtractElement(i < 4 ? a0 : a1, static_cast<std::uint64_t>(i % 4));
            for (int c = 0; c < 4; ++c)
              a[static_cast<std::size_t>(i * 4 + c)] =
                  kb.fma(ai, b.CreateExtractElement(bv, static_cast<std::uint64_t>(c)),
                         a[static_cast<std::size_t>(i * 4 + c)]);
          }
        }
        return a;
      },
      "kslices", /*unroll=*/false);

  // y = acc + b[n] (b null: no bias), rows < M, columns < N.
  llvm::Value* has_bias = b.CreateICmpNE(bias, llvm::ConstantPointerNull::get(llvm::PointerType::getUnqual(kb.ctx())));
  Values bv;
  Values gn;
  for (int c = 0; c < 4; ++c) {
    gn.push_back(b.CreateAdd(n0, b.CreateZExt(b.CreateAdd(b_col, kb.c32(c)), i64), "gn"));
    llvm::Value* ok = b.CreateAnd(has_bias, b.CreateICmpSLT(gn.back(), N));
    bv.push_back(kb.guarded_load(ok, f32, b.CreateInBoundsGEP(f32, bias, gn.back()), kb.cf(0.0), "bias"));
  }
  for (int i = 0; i < 8; ++i) {
    llvm::Value* gm = b.CreateAdd(m0, b.CreateZExt(b.CreateAdd(a_col, kb.c32(i)), i64), "gm");
    kb.if_then(
        b.CreateICmpSLT(gm, M),
        [&] {
          llvm::Value* yrow = b.CreateInBoundsGEP(f32, y, b.CreateMul(gm, N));
          for (int c = 0; c < 4; ++c)
            kb.if_then(
                b.CreateICmpSLT(gn[static_cast<std::size_t>(c)], N),
                [&] {
                  b.CreateStore(b.CreateFAdd(acc[static_cast<std::size_t>(i * 4 + c)], bv[static_cast<std::size_t>(c)]),
                                b.CreateInBoundsGEP(f32, yrow, gn[static_cast<std::size_t>(c)]));
                },
                "store_col");
        },
        "store_row");
  }
  b.CreateRetVoid();

  KernelInfo info;
  info.name = name;
  info.signature = linear_params();
  info.grid_rule = "(ceil(m / " + std::to_string(r.block_m) + "), ceil(n / " + std::to_string(r.block_n) + "), 1)";
  info.block_x = threads;
  info.static_shared_bytes = static_cast<int>(smem_floats * 4);
  return info;
}

// ------------------------------------------------------------------------------------------------
// layer norm: one warp per row; Σx → mean = Σx · (1/n); Σ(x − mean)² → var = · (1/n);
// y = (x − mean)·(1/sqrt(var + eps))·gamma + beta — the CPU kernel's operations, with the sums
// taken lane-strided and then by butterfly shuffles.

KernelInfo build_layer_norm(llvm::Module& module, const LayerNormKernel& r, const HostEmulation* emulation) {
  check_threads(r.threads, 1024, "layer_norm");
  KernelBuilder kb(module, emulation);
  auto& b = kb.b();
  llvm::Type *p = kb.ptr(), *i64 = kb.i64(), *f32 = kb.f32();
  const std::string name = kernel_name(r);
  llvm::Function* fn =
      kb.declare_kernel(name, {p, p, p, p, i64, i64, f32}, {"x", "gamma", "beta", "y", "rows", "n", "eps"}, r.threads);
  mark_inputs(fn, {0, 1, 2}, {3}, false);  // y may alias x
  llvm::Value *x = fn->getArg(0), *gamma = fn->getArg(1), *beta = fn->getArg(2), *y = fn->getArg(3);
  llvm::Value *rows = fn->getArg(4), *n = fn->getArg(5), *eps = fn->getArg(6);

  llvm::Value* tid = kb.tid_x();
  llvm::Value* lane = b.CreateZExt(b.CreateAnd(tid, kb.c32(31)), i64, "lane");
  llvm::Value* warp = b.CreateZExt(b.CreateLShr(tid, kb.c32(5)), i64, "warp");
  llvm::Value* row = b.CreateAdd(b.CreateMul(b.CreateZExt(kb.ctaid_x(), i64), kb.c64(r.threads / 32)), warp, "row");
  // The whole warp takes this branch together (row is uniform per warp): the shuffles are safe.
  kb.if_then(
      b.CreateICmpSLT(row, rows),
      [&] {
        llvm::Value* off = b.CreateMul(row, n);
        llvm::Value* xr = b.CreateInBoundsGEP(f32, x, off, "x_row");
        llvm::Value* yr = b.CreateInBoundsGEP(f32, y, off, "y_row");
        auto load = [&](llvm::Value* base, llvm::Value* k) {
          return b.CreateLoad(f32, b.CreateInBoundsGEP(f32, base, k));
        };
        llvm::Value* inv_n = b.CreateFDiv(kb.cf(1.0), b.CreateSIToFP(n, f32), "inv_n");
        Values sum = kb.loop(
            lane, n, 32, {kb.cf(0.0)},
            [&](llvm::Value* k, const Values& in) { return Values{b.CreateFAdd(in[0], load(xr, k))}; }, "sum");
        llvm::Value* mean = b.CreateFMul(kb.group_sum(sum[0], 32), inv_n, "mean");
        Values ss = kb.loop(
            lane, n, 32, {kb.cf(0.0)},
            [&](llvm::Value* k, const Values& in) {
              llvm::Value* d = b.CreateFSub(load(xr, k), mean);
              return Values{kb.fma(d, d, in[0])};
            },
            "sumsq");
        llvm::Value* var = b.CreateFMul(kb.group_sum(ss[0], 32), inv_n, "var");
        llvm::Value* sd = b.CreateIntrinsic(llvm::Intrinsic::sqrt, {f32}, {b.CreateFAdd(var, eps)});
        llvm::Value* inv_std = b.CreateFDiv(kb.cf(1.0), sd, "inv_std");
        kb.loop(
            lane, n, 32,
            [&](llvm::Value* k) {
              llvm::Value* z = b.CreateFMul(b.CreateFSub(load(xr, k), mean), inv_std);
              b.CreateStore(kb.fma(z, load(gamma, k), load(beta, k)), b.CreateInBoundsGEP(f32, yr, k));
            },
            "norm");
      },
      "row");
  b.CreateRetVoid();

  KernelInfo info;
  info.name = name;
  info.signature = layer_norm_params();
  info.grid_rule = "(ceil(rows / " + std::to_string(r.threads / 32) + "), 1, 1)";
  info.block_x = r.threads;
  return info;
}

// ------------------------------------------------------------------------------------------------
// elementwise maps, grid-stride

namespace {

/// GELU as the CPU kernel computes it: c = Φ(−|x|) = ½·erfc(|x|/√2) with Numerical Recipes'
/// erfcc fit (t = 1/(1 + z/2), erfc(z) = t·exp(−z² + P(t))) and the IR exp of vector_math.hpp;
/// then x − x·c for x > 0 and x·c otherwise (c == 0 keeps 0; NaN stays NaN).
llvm::Value* gelu(KernelBuilder& kb, llvm::Value* x) {
  auto& b = kb.b();
  llvm::Type* t = x->getType();
  llvm::Value* ax = b.CreateIntrinsic(llvm::Intrinsic::fabs, {t}, {x});
  llvm::Value* z = b.CreateFMul(ax, kb.cf(0.70710678118654752440));
  llvm::Value* tt = b.CreateFDiv(kb.cf(1.0), kb.fma(kb.cf(0.5), z, kb.cf(1.0)));
  static constexpr double kP[] = {0.17087277,  -0.82215223, 1.48851587, -1.13520398, 0.27886807,
                                  -0.18628806, 0.09678418,  0.37409196, 1.00002368,  -1.26551223};
  llvm::Value* p = kb.cf(kP[0]);
  for (std::size_t i = 1; i < std::size(kP); ++i) p = kb.fma(p, tt, kb.cf(kP[i]));
  llvm::Value* e = cpu::emit_exp(b, kb.fma(b.CreateFNeg(z), z, p));
  llvm::Value* c = b.CreateFMul(b.CreateFMul(tt, e), kb.cf(0.5));
  llvm::Value* zero = kb.cf(0.0);
  llvm::Value* small = b.CreateSelect(b.CreateFCmpUGT(c, zero), b.CreateFMul(x, c), zero);
  return b.CreateSelect(b.CreateFCmpOGT(x, zero), b.CreateFSub(x, small), small);
}

}  // namespace

KernelInfo build_elementwise(llvm::Module& module, const ElementwiseKernel& r, const HostEmulation* emulation) {
  check_threads(r.threads, 1024, "elementwise");
  KernelBuilder kb(module, emulation);
  auto& b = kb.b();
  llvm::Type *p = kb.ptr(), *i64 = kb.i64(), *f32 = kb.f32();
  const std::string name = kernel_name(r);
  llvm::Function* fn = kb.declare_kernel(name, {p, p, p, i64}, {"a", "b_or_null", "y", "count"}, r.threads);
  mark_inputs(fn, {0, 1}, {2}, false);  // y may alias a or b
  llvm::Value *a = fn->getArg(0), *bb = fn->getArg(1), *y = fn->getArg(2), *count = fn->getArg(3);
  auto [first, stride] = grid_stride(kb);
  kb.loop(
      first, count, stride,
      [&](llvm::Value* i) {
        llvm::Value* x = b.CreateLoad(f32, b.CreateInBoundsGEP(f32, a, i));
        llvm::Value* out = nullptr;
        switch (r.op) {
          case ElementwiseOp::relu:
            // x > 0 or NaN (unordered) keeps x; everything else (−0 included) becomes +0.
            out = b.CreateSelect(b.CreateFCmpUGT(x, kb.cf(0.0)), x, kb.cf(0.0));
            break;
          case ElementwiseOp::gelu:
            out = gelu(kb, x);
            break;
          case ElementwiseOp::add:
            out = b.CreateFAdd(x, b.CreateLoad(f32, b.CreateInBoundsGEP(f32, bb, i)));
            break;
          case ElementwiseOp::scale:
            out = b.CreateFMul(x, llvm::ConstantFP::get(f32, static_cast<double>(r.factor)));
            break;
        }
        b.CreateStore(out, b.CreateInBoundsGEP(f32, y, i));
      },
      "elements");
  b.CreateRetVoid();

  KernelInfo info;
  info.name = name;
  info.signature = elementwise_params();
  info.grid_rule = "(min(ceil(count / " + std::to_string(r.threads) + "), 65535), 1, 1) (any x >= 1 is correct)";
  info.block_x = r.threads;
  return info;
}

// ------------------------------------------------------------------------------------------------
// strided copy: dst[i] = src[offset + Σ coord_a(i)·stride_a], grid-stride. When count plus the
// grid's stride fits in i32 (every size <= count does too) the index is unravelled with 32-bit
// divisions; otherwise with 64-bit ones. Offsets are always i64.

KernelInfo build_strided_copy(llvm::Module& module, const StridedCopyKernel& r, const HostEmulation* emulation) {
  if (r.rank < 1 || r.rank > 6) fail("strided_copy: rank " + std::to_string(r.rank) + " is not in [1, 6]");
  check_threads(r.threads, 1024, "strided_copy");
  KernelBuilder kb(module, emulation);
  auto& b = kb.b();
  llvm::Type *p = kb.ptr(), *i64 = kb.i64(), *f32 = kb.f32();
  const std::string name = kernel_name(r);
  std::vector<llvm::Type*> params = {p, p, i64, i64};
  std::vector<std::string> names = {"src", "dst", "count", "offset"};
  for (int a = 0; a < 6; ++a) {
    params.push_back(i64);
    names.push_back("size" + std::to_string(a));
  }
  for (int a = 0; a < 6; ++a) {
    params.push_back(i64);
    names.push_back("stride" + std::to_string(a));
  }
  llvm::Function* fn = kb.declare_kernel(name, params, names, r.threads);
  mark_inputs(fn, {0}, {1}, true);
  llvm::Value *src = fn->getArg(0), *dst = fn->getArg(1), *count = fn->getArg(2), *offset = fn->getArg(3);
  Values size, stride;
  for (unsigned a = 0; a < 6; ++a) {
    size.push_back(fn->getArg(4 + a));
    stride.push_back(fn->getArg(10 + a));
  }
  auto [first, step] = grid_stride(kb);

  auto copy_loop = [&](llvm::Type* it, const char* tag) {
    kb.loop(
        b.CreateTrunc(first, it), b.CreateTrunc(count, it), b.CreateTrunc(step, it),
        [&](llvm::Value* i) {
          llvm::Value* rem = i;
          llvm::Value* off = offset;
          for (int a = r.rank - 1; a >= 1; --a) {
            llvm::Value* sz = b.CreateTrunc(size[static_cast<std::size_t>(a)], it);
            llvm::Value* q = b.CreateUDiv(rem, sz);
            llvm::Value* coord = b.CreateSub(rem, b.CreateMul(q, sz));
            off = b.CreateAdd(off, b.CreateMul(b.CreateZExt(coord, i64), stride[static_cast<std::size_t>(a)]));
            rem = q;
          }
          off = b.CreateAdd(off, b.CreateMul(b.CreateZExt(rem, i64), stride[0]));
          llvm::Value* x = b.CreateLoad(f32, b.CreateGEP(f32, src, off));
          b.CreateStore(x, b.CreateInBoundsGEP(f32, dst, b.CreateZExt(i, i64)));
        },
        tag);
  };
  llvm::Value* narrow = b.CreateICmpSLE(b.CreateAdd(count, step), kb.c64(std::numeric_limits<std::int32_t>::max()));
  llvm::BasicBlock* wide_bb = llvm::BasicBlock::Create(kb.ctx(), "wide", fn);
  llvm::BasicBlock* narrow_bb = llvm::BasicBlock::Create(kb.ctx(), "narrow", fn);
  llvm::BasicBlock* done = llvm::BasicBlock::Create(kb.ctx(), "done", fn);
  b.CreateCondBr(narrow, narrow_bb, wide_bb);
  b.SetInsertPoint(narrow_bb);
  copy_loop(kb.i32(), "copy32");
  b.CreateBr(done);
  b.SetInsertPoint(wide_bb);
  copy_loop(i64, "copy64");
  b.CreateBr(done);
  b.SetInsertPoint(done);
  b.CreateRetVoid();

  KernelInfo info;
  info.name = name;
  info.signature = strided_copy_params();
  info.grid_rule = "(min(ceil(count / " + std::to_string(r.threads) + "), 65535), 1, 1) (any x >= 1 is correct)";
  info.block_x = r.threads;
  return info;
}

}  // namespace qkv::codegen::nvptx::detail
