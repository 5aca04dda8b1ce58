// y[M,N] = x[M,K] · W[N,K]ᵀ + b[N] with bf16 storage on tensor cores (sm_80+):
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, fp32 accumulation, y rounded to bf16.
//
// Semantics: LinearKernel's with x, w, b, y holding bf16 bits — what the CPU computes for a
// linear of bf16 tensors (the values decoded exactly, products and sums in fp32, the bias added in
// fp32, the result rounded to bf16, nearest even); only the order of the fp32 sums differs.
//
// One block per (block_m rows, block_n columns) = (ctaid.x, ctaid.y), block_m / 16 warps; warp w
// owns the rows [16w, 16w + 16) of the block and all its block_n columns (block_n / 8 n8 tiles of
// C fragments). Per K slice of block_k: barrier; x and W tiles → static shared memory as bf16 rows
// of block_k + 8 elements (16-byte padding: the 8 row addresses of an ldmatrix hit distinct
// banks; elements past M, N or K are 0), one element per thread and step (any K: rows of x and W
// need not be 16-byte aligned); barrier; per k16: the A fragment of the warp's rows by ldmatrix.x4
// and, per 16 columns, W's B fragments of two n8 tiles by ldmatrix.x4 (W's rows are the columns of
// B = Wᵀ: "col" layout, no .trans) and two mma. Fragment layouts: attention_mma_ptx.cpp's header.
#include <cstdint>
#include <stdexcept>
#include <string>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>

#include "nvptx/geometry.hpp"
#include "nvptx/kernel_builder.hpp"

namespace qkv::codegen::nvptx::detail {

namespace {
using Values = std::vector<llvm::Value*>;
[[noreturn]] void fail(const std::string& message) { throw std::runtime_error("nvptx: " + message); }
}  // namespace

std::string linear_mma_unsupported(const LinearKernel& r) {
  if (r.storage != DType::bf16) return "x, w, b and y are not bf16";
  if (r.block_m < 16 || r.block_m > 128 || r.block_m % 16 != 0) return "block_m is not a multiple of 16 in [16, 128]";
  if (r.block_n < 16 || r.block_n > 128 || r.block_n % 16 != 0) return "block_n is not a multiple of 16 in [16, 128]";
  if (r.block_k < 16 || r.block_k > 64 || r.block_k % 16 != 0) return "block_k is not a multiple of 16 in [16, 64]";
  return {};
}

KernelInfo build_linear_mma(llvm::Module& module, const LinearKernel& r, const HostEmulation* emulation) {
  if (const std::string why = linear_mma_unsupported(r); !why.empty()) fail("linear (bf16, tensor cores): " + why);
  const int warps = r.block_m / 16, threads = 32 * warps, tiles_n = r.block_n / 8;
  const int stride = r.block_k + 8;  // bf16 elements per shared row
  const std::int64_t x_elems = std::int64_t{r.block_m} * stride, w_elems = std::int64_t{r.block_n} * stride;
  const std::int64_t smem_floats = (x_elems + w_elems) / 2;

  KernelBuilder kb(module, emulation);
  auto& b = kb.b();
  llvm::Type *p = kb.ptr(), *i64 = kb.i64(), *i16 = b.getInt16Ty();
  const std::string name = kernel_name(r);
  llvm::Function* fn =
      kb.declare_kernel(name, {p, p, p, p, i64, i64, i64}, {"x", "w", "b", "y", "m", "n", "k"}, threads, 1);
  for (unsigned a : {0u, 1u, 2u, 3u}) {
    fn->addParamAttr(a, llvm::Attribute::NoAlias);
    fn->addParamAttr(a, llvm::Attribute::NoCapture);
    if (a != 3) fn->addParamAttr(a, llvm::Attribute::ReadOnly);
  }
  llvm::Value *x = fn->getArg(0), *w = fn->getArg(1), *bias = fn->getArg(2), *y = fn->getArg(3);
  llvm::Value *M = fn->getArg(4), *N = fn->getArg(5), *K = fn->getArg(6);
  llvm::Value* smem = kb.static_shared("qkv_linear_bf16_tiles", smem_floats);
  llvm::Value* xs = b.CreateConstInBoundsGEP1_64(kb.f32(), smem, 0);
  llvm::Value* ws = b.CreateConstInBoundsGEP1_64(kb.f32(), smem, static_cast<std::uint64_t>(x_elems / 2));
  auto at16 = [&](llvm::Value* base, llvm::Value* index) { return b.CreateInBoundsGEP(i16, base, index); };

  llvm::Value* tid = kb.tid_x();
  llvm::Value* warp = b.CreateLShr(tid, kb.c32(5), "warp");
  llvm::Value* lane = b.CreateAnd(tid, kb.c32(31), "lane");
  llvm::Value* group = b.CreateLShr(lane, kb.c32(2), "group");
  llvm::Value* tig = b.CreateAnd(lane, kb.c32(3), "tig");
  llvm::Value* m0 = b.CreateMul(b.CreateZExt(kb.ctaid_x(), i64), kb.c64(r.block_m), "m0");
  llvm::Value* n0 = b.CreateMul(b.CreateZExt(kb.ctaid_y(), i64), kb.c64(r.block_n), "n0");
  // ldmatrix row addresses (lane 8m + r8): x as attention's Q (A fragments), W as its K (B fragments).
  llvm::Value* r8 = b.CreateAnd(lane, kb.c32(7));
  llvm::Value* mb0 = b.CreateAnd(b.CreateLShr(lane, kb.c32(3)), kb.c32(1));
  llvm::Value* mb1 = b.CreateLShr(lane, kb.c32(4));
  llvm::Value* x_row = b.CreateAdd(b.CreateMul(warp, kb.c32(16)), b.CreateAdd(r8, b.CreateMul(mb0, kb.c32(8))));
  llvm::Value* ld_x = at16(xs, b.CreateAdd(b.CreateMul(x_row, kb.c32(stride)), b.CreateMul(mb1, kb.c32(8))));
  llvm::Value* w_row = b.CreateAdd(r8, b.CreateMul(mb1, kb.c32(8)));
  llvm::Value* ld_w = at16(ws, b.CreateAdd(b.CreateMul(w_row, kb.c32(stride)), b.CreateMul(mb0, kb.c32(8))));

  // tile[row][kk] = src[(base + row)·K + k0 + kk], 0 outside [0, limit) × [0, K).
  auto stage = [&](llvm::Value* src, llvm::Value* base, llvm::Value* limit, int rows, llvm::Value* tile,
                   llvm::Value* k0, const char* tag) {
    kb.loop(
        tid, kb.c32(rows * r.block_k), threads,
        [&](llvm::Value* idx) {
          llvm::Value* row = b.CreateUDiv(idx, kb.c32(r.block_k));
          llvm::Value* kk = b.CreateSub(idx, b.CreateMul(row, kb.c32(r.block_k)));
          llvm::Value* grow = b.CreateAdd(base, b.CreateZExt(row, i64));
          llvm::Value* gk = b.CreateAdd(k0, b.CreateZExt(kk, i64));
          llvm::Value* ok = b.CreateAnd(b.CreateICmpSLT(grow, limit), b.CreateICmpSLT(gk, K));
          llvm::Value* from = b.CreateSelect(ok, b.CreateAdd(b.CreateMul(grow, K), gk), kb.c64(0));
          llvm::Value* v = b.CreateLoad(i16, at16(src, from));
          b.CreateStore(b.CreateSelect(ok, v, b.getInt16(0)),
                        at16(tile, b.CreateAdd(b.CreateMul(row, kb.c32(stride)), kk)));
        },
        tag);
  };

  Values zero(static_cast<std::size_t>(tiles_n * 4), kb.cf(0.0));
  Values acc = kb.loop(
      kb.c64(0), K, r.block_k, zero,
      [&](llvm::Value* k0, const Values& in) {
        Values a = in;
        kb.barrier();
        stage(x, m0, M, r.block_m, xs, k0, "stage_x");
        stage(w, n0, N, r.block_n, ws, k0, "stage_w");
        kb.barrier();
        for (int ks = 0; ks < r.block_k / 16; ++ks) {
          Values af = kb.ldmatrix_x4(at16(ld_x, kb.c32(16 * ks)), false);
          for (int np = 0; np < tiles_n / 2; ++np) {
            Values bf = kb.ldmatrix_x4(at16(ld_w, kb.c32(16 * np * stride + 16 * ks)), false);
            for (int h = 0; h < 2; ++h) {
              const auto nt = static_cast<std::ptrdiff_t>(2 * np + h);
              Values c(a.begin() + 4 * nt, a.begin() + 4 * nt + 4);
              Values d =
                  kb.mma_bf16(af, {bf[static_cast<std::size_t>(2 * h)], bf[static_cast<std::size_t>(2 * h + 1)]}, c);
              std::copy(d.begin(), d.end(), a.begin() + 4 * nt);
            }
          }
        }
        return a;
      },
      "kslices", /*unroll=*/false);

  // y = acc + b[n] (b null: no bias), rounded to bf16; rows < M, columns < N, one element each
  // (a row of y need not be 4-byte aligned when N is odd).
  llvm::Value* has_bias = b.CreateICmpNE(bias, llvm::ConstantPointerNull::get(llvm::PointerType::getUnqual(kb.ctx())));
  Values gn, bv;
  for (int nt = 0; nt < tiles_n; ++nt)
    for (int e = 0; e < 2; ++e) {
      llvm::Value* col = b.CreateAdd(b.CreateMul(tig, kb.c32(2)), kb.c32(8 * nt + e));
      gn.push_back(b.CreateAdd(n0, b.CreateZExt(col, i64), "gn"));
      llvm::Value* ok = b.CreateAnd(has_bias, b.CreateICmpSLT(gn.back(), N));
      llvm::Value* bits = kb.guarded_load(ok, i16, at16(bias, gn.back()), b.getInt16(0), "bias");
      bv.push_back(b.CreateBitCast(b.CreateShl(b.CreateZExt(bits, kb.i32()), kb.c32(16)), kb.f32()));
    }
  for (int i = 0; i < 2; ++i) {
    llvm::Value* row = b.CreateAdd(b.CreateMul(warp, kb.c32(16)), b.CreateAdd(group, kb.c32(8 * i)));
    llvm::Value* gm = b.CreateAdd(m0, b.CreateZExt(row, i64), "gm");
    kb.if_then(
        b.CreateICmpSLT(gm, M),
        [&] {
          llvm::Value* yrow = at16(y, b.CreateMul(gm, N));
          for (int nt = 0; nt < tiles_n; ++nt) {
            const auto c0 = static_cast<std::size_t>(nt * 4 + 2 * i);
            const auto j0 = static_cast<std::size_t>(2 * nt);
            llvm::Value* pair = kb.pack_bf16x2(b.CreateFAdd(acc[c0], bv[j0]), b.CreateFAdd(acc[c0 + 1], bv[j0 + 1]));
            for (int e = 0; e < 2; ++e)
              kb.if_then(
                  b.CreateICmpSLT(gn[j0 + static_cast<std::size_t>(e)], N),
                  [&] {
                    llvm::Value* half = b.CreateTrunc(b.CreateLShr(pair, kb.c32(16 * e)), i16);
                    b.CreateStore(half, at16(yrow, gn[j0 + static_cast<std::size_t>(e)]));
                  },
                  "store_col");
          }
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

}  // namespace qkv::codegen::nvptx::detail
