// The GEMV kernel (gemm_kernel.hpp): linear layers with a few rows, W read in place.
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>

#include "cpu/kernels/gemm_kernel.hpp"
#include "llvm/ir_util.hpp"

namespace qkv::codegen::cpu {

int gemv_outputs(int rows, int lanes) { return std::min(rows >= 4 ? 4 : 8, lanes); }

void emit_gemv_kernel(llvm::Module& module, const GemmConfig& cfg, int rows, const std::string& name) {
  llvm::IRBuilder<> b(module.getContext());
  llvm::Type* f32 = b.getFloatTy();
  llvm::Type* i64 = b.getInt64Ty();
  llvm::Type* ptr = b.getPtrTy();
  const int lanes = cfg.lanes, outs = gemv_outputs(rows, lanes);
  auto* vf = llvm::FixedVectorType::get(f32, static_cast<unsigned>(lanes));
  auto* vo = llvm::FixedVectorType::get(f32, static_cast<unsigned>(outs));
  auto c64 = [&](std::int64_t v) { return ir::i64c(b, v); };
  auto smin = [&](llvm::Value* x, llvm::Value* y) {
    return b.CreateIntrinsic(llvm::Intrinsic::smin, {x->getType()}, {x, y});
  };
  auto fma = [&](llvm::Value* x, llvm::Value* y, llvm::Value* z) {
    return b.CreateIntrinsic(llvm::Intrinsic::fmuladd, {x->getType()}, {x, y, z});
  };
  auto lane_mask = [&](int n, llvm::Value* count) {  // <n x i1>: lane < count
    std::vector<llvm::Constant*> iota;
    for (int j = 0; j < n; ++j) iota.push_back(b.getInt64(static_cast<std::uint64_t>(j)));
    return b.CreateICmpSLT(llvm::ConstantVector::get(iota), b.CreateVectorSplat(static_cast<unsigned>(n), count));
  };

  llvm::Function* fn = ir::declare_kernel(module, b, name, {ptr, i64, i64}, cfg.cpu, cfg.features, lanes,
                                          /*args_param=*/true);
  llvm::Value* args = fn->getArg(0);
  llvm::Value* n0 = fn->getArg(1);
  llvm::Value* n1 = fn->getArg(2);
  auto field = [&](std::size_t offset, llvm::Type* t) {
    return b.CreateLoad(t, b.CreateConstInBoundsGEP1_64(b.getInt8Ty(), args, offset));
  };
  llvm::Value* x = field(offsetof(GemvArgs, x), ptr);
  llvm::Value* w = field(offsetof(GemvArgs, w), ptr);
  llvm::Value* bias = field(offsetof(GemvArgs, bias), ptr);
  llvm::Value* y = field(offsetof(GemvArgs, y), ptr);
  llvm::Value* m = field(offsetof(GemvArgs, m), i64);
  llvm::Value* n = field(offsetof(GemvArgs, n), i64);
  llvm::Value* k = field(offsetof(GemvArgs, k), i64);
  llvm::Value* rem = b.CreateSRem(k, c64(lanes));
  llvm::Value* kfull = b.CreateSub(k, rem, "kfull");
  llvm::Value* tail = lane_mask(lanes, rem);
  // Rows past m repeat row m − 1 (their results are not stored).
  // x and W as stored: f32, or bf16 widened as loaded (the kernel reads W once: half the bytes).
  llvm::Type* elem = cfg.bf16 ? b.getInt16Ty() : f32;
  auto* vin = llvm::FixedVectorType::get(elem, static_cast<unsigned>(lanes));
  std::vector<llvm::Value*> xrow(static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r)
    xrow[r] = b.CreateInBoundsGEP(elem, x, b.CreateMul(smin(c64(r), b.CreateSub(m, c64(1))), k));

  ir::emit_loop(
      b, n0, n1, outs,
      [&](llvm::Value* o0) {
        // Outputs past n1 (the last group only) read row n1 − 1 of W.
        std::vector<llvm::Value*> wrow(static_cast<std::size_t>(outs));
        for (int j = 0; j < outs; ++j)
          wrow[j] =
              b.CreateInBoundsGEP(elem, w, b.CreateMul(smin(b.CreateAdd(o0, c64(j)), b.CreateSub(n1, c64(1))), k));
        auto step = [&](llvm::Value* i, const std::vector<llvm::Value*>& in, llvm::Value* mask) {
          std::vector<llvm::Value*> acc = in;
          auto load = [&](llvm::Value* row) {
            llvm::Value* p = b.CreateGEP(elem, row, i);
            const llvm::Align align(cfg.bf16 ? 2 : 4);
            llvm::Value* v = mask ? b.CreateMaskedLoad(vin, p, align, mask, llvm::Constant::getNullValue(vin))
                                  : static_cast<llvm::Value*>(b.CreateAlignedLoad(vin, p, align));
            return cfg.bf16 ? ir::half_to_f32(b, v, /*brain=*/true) : v;
          };
          std::vector<llvm::Value*> xv(static_cast<std::size_t>(rows));
          for (int r = 0; r < rows; ++r) xv[r] = load(xrow[r]);
          for (int j = 0; j < outs; ++j) {
            llvm::Value* wv = load(wrow[j]);
            for (int r = 0; r < rows; ++r) acc[j * rows + r] = fma(xv[r], wv, acc[j * rows + r]);
          }
          return acc;
        };
        std::vector<llvm::Value*> zero(static_cast<std::size_t>(outs * rows), llvm::ConstantFP::get(vf, 0.0));
        std::vector<llvm::Value*> acc = ir::emit_loop(
            b, c64(0), kfull, lanes, zero,
            [&](llvm::Value* i, const std::vector<llvm::Value*>& in) { return step(i, in, nullptr); }, "gemv.k",
            ir::Unroll::allowed);
        acc = step(kfull, acc, tail);  // K's last partial vector (an empty mask when lanes divides K)

        llvm::Value* valid = lane_mask(outs, b.CreateSub(n1, o0));
        llvm::Value* bv = b.CreateMaskedLoad(vo, b.CreateInBoundsGEP(f32, bias, o0), llvm::Align(4), valid,
                                             llvm::ConstantFP::get(vo, 0.0));
        for (int r = 0; r < rows; ++r) {
          std::vector<llvm::Value*> parts;
          for (int j = 0; j < outs; ++j) parts.push_back(acc[j * rows + r]);
          llvm::Value* v = ir::transpose_sum(b, parts);
          // Output j is the sum of lanes [j·width, (j + 1)·width): halve the blocks, then pick.
          const int width = lanes / outs;
          for (int half = width / 2; half >= 1; half /= 2) {
            std::vector<int> shift;
            for (int l = 0; l < lanes; ++l) shift.push_back(l + half < lanes ? l + half : l);
            v = b.CreateFAdd(v, b.CreateShuffleVector(v, v, shift));
          }
          std::vector<int> pick;
          for (int j = 0; j < outs; ++j) pick.push_back(j * width);
          llvm::Value* out = b.CreateFAdd(b.CreateShuffleVector(v, v, pick), bv);
          llvm::Value* dst = b.CreateGEP(f32, y, b.CreateAdd(b.CreateMul(c64(r), n), o0));
          llvm::Value* mask = valid;
          if (r > 0)
            mask = b.CreateAnd(mask, b.CreateVectorSplat(static_cast<unsigned>(outs), b.CreateICmpSLT(c64(r), m)));
          b.CreateMaskedStore(out, dst, llvm::Align(4), mask);
        }
      },
      "gemv.out");
  b.CreateRetVoid();
}

}  // namespace qkv::codegen::cpu
