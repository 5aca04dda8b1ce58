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

#include <qkv/ir/error.hpp>
#include <qkv/ir/quant.hpp>

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
  auto lane_mask = [&](int n, llvm::Value* count) { return ir::lanes_below(b, n, count); };

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
  // x and W as stored: f32, or bf16 / f16 widened as loaded (the kernel reads W once: half the bytes);
  // a quantized W is int8 (a quarter of them), a whole group's x · q summed, then scaled by its
  // scale once (a last partial group: each vector scaled as loaded); a q4 W two entries a byte, a
  // vector one nibble of `lanes` bytes (half a group is whole vectors).
  const int group = cfg.quant_group;
  if (group % lanes != 0 || (cfg.q4 && (group / 2) % lanes != 0))
    internal_error("emit_gemv_kernel: groups of " + std::to_string(group) + " in vectors of " + std::to_string(lanes));
  llvm::Type* xelem = half_bits(cfg) ? b.getInt16Ty() : f32;
  llvm::Type* welem = group > 0 ? b.getInt8Ty() : xelem;
  llvm::Value* scales = group > 0 ? field(offsetof(GemvArgs, scales), ptr) : nullptr;
  llvm::Value* groups = group > 0 ? b.CreateSDiv(b.CreateAdd(k, c64(group - 1)), c64(group)) : nullptr;
  llvm::Value* wbytes = cfg.q4 ? b.CreateSDiv(k, c64(2)) : k;  // a row of W, in its elements
  // x's rows in chunks of `rows` (m may be more: a quantized W, gemm_kernel.hpp), each chunk's
  // rows set before it runs.
  std::vector<llvm::Value*> xrow(static_cast<std::size_t>(rows));
  llvm::Value* chunks = b.CreateSDiv(b.CreateAdd(m, c64(rows - 1)), c64(rows));

  ir::emit_loop(
      b, n0, n1, outs,
      [&](llvm::Value* o0) {
        // Outputs past n1 (the last group only) read row n1 − 1 of W.
        std::vector<llvm::Value*> wrow(static_cast<std::size_t>(outs)), srow(static_cast<std::size_t>(outs));
        for (int j = 0; j < outs; ++j) {
          llvm::Value* row = smin(b.CreateAdd(o0, c64(j)), b.CreateSub(n1, c64(1)));
          wrow[j] = b.CreateInBoundsGEP(welem, w, b.CreateMul(row, wbytes));
          if (group > 0) srow[j] = b.CreateInBoundsGEP(b.getInt16Ty(), scales, b.CreateMul(row, groups));
        }
        auto load = [&](llvm::Type* elem, llvm::Value* row, llvm::Value* i, llvm::Value* mask) {
          auto* vin = llvm::FixedVectorType::get(elem, static_cast<unsigned>(lanes));
          llvm::Value* p = b.CreateGEP(elem, row, i);
          const llvm::Align align(elem->getPrimitiveSizeInBits() / 8);
          llvm::Value* v = mask ? b.CreateMaskedLoad(vin, p, align, mask, llvm::Constant::getNullValue(vin))
                                : static_cast<llvm::Value*>(b.CreateAlignedLoad(vin, p, align));
          if (elem == f32) return v;
          if (elem == b.getInt8Ty()) return b.CreateSIToFP(v, vf);
          return ir::half_to_f32(b, v, /*brain=*/!cfg.f16);
        };
        // Whether a whole group of q4's x · n is summed before its scale multiplies it (one multiply
        // a group, the zero point through Σ x: 8 % faster decode on Zen 5; q8's was 10 % slower, so
        // it scales each vector): the partial sums beside the accumulators must fit in the
        // registers (one row: 8 outputs; more rows would spill them).
        const bool per_group = cfg.q4 && 2 * outs * rows + 2 * rows + 2 <= (lanes >= 16 ? 32 : 16);
        // A q4 vector of row j: one nibble of `lanes` bytes from byte `at`: as stored (0 … 15)
        // when the group's sums take the zero point, else less 8.
        auto load_q4 = [&](int j, llvm::Value* at, bool high) {
          auto* vb = llvm::FixedVectorType::get(b.getInt8Ty(), static_cast<unsigned>(lanes));
          llvm::Value* v = b.CreateAlignedLoad(vb, b.CreateGEP(b.getInt8Ty(), wrow[j], at), llvm::Align(1));
          return b.CreateSIToFP(ir::q4_nibbles(b, v, b.getInt1(high), /*centered=*/!per_group), vf);
        };
        // One vector of K at i: acc[j·rows + r] += x[r][i…] · W[j][i…] (a quantized W scaled by
        // `scale[j]`, or with no scale as its integers); a q4 W's vector (its nibbles as stored)
        // from byte `q4_at`, its high nibbles if `q4_high`.
        auto step = [&](llvm::Value* i, const std::vector<llvm::Value*>& in, llvm::Value* mask,
                        const std::vector<llvm::Value*>& scale, llvm::Value* q4_at = nullptr, bool q4_high = false) {
          std::vector<llvm::Value*> acc = in;
          std::vector<llvm::Value*> xv(static_cast<std::size_t>(rows));
          for (int r = 0; r < rows; ++r) xv[r] = load(xelem, xrow[r], i, mask);
          for (int j = 0; j < outs; ++j) {
            llvm::Value* wv = q4_at ? load_q4(j, q4_at, q4_high) : load(welem, wrow[j], i, mask);
            if (!scale.empty()) wv = b.CreateFMul(wv, scale[j]);
            for (int r = 0; r < rows; ++r) acc[j * rows + r] = fma(xv[r], wv, acc[j * rows + r]);
          }
          return acc;
        };
        // The scales of group gi of the outputs' rows, each splat across a vector.
        auto scales_of = [&](llvm::Value* gi) {
          std::vector<llvm::Value*> sc;
          if (group == 0) return sc;  // (W as x is: no scale)
          sc.resize(static_cast<std::size_t>(outs));
          for (int j = 0; j < outs; ++j) {
            llvm::Value* bits = b.CreateLoad(b.getInt16Ty(), b.CreateGEP(b.getInt16Ty(), srow[j], gi));
            sc[j] = b.CreateVectorSplat(static_cast<unsigned>(lanes), ir::half_to_f32(b, bits, /*brain=*/false));
          }
          return sc;
        };
        llvm::Value* valid = lane_mask(outs, b.CreateSub(n1, o0));
        llvm::Value* bv = b.CreateMaskedLoad(vo, b.CreateInBoundsGEP(f32, bias, o0), llvm::Align(4), valid,
                                             llvm::ConstantFP::get(vo, 0.0));
        // The outputs' W rows stay in L1 while each chunk of x's rows runs past them.
        ir::emit_loop(
            b, c64(0), chunks, 1,
            [&](llvm::Value* chunk) {
              llvm::Value* r0 = b.CreateMul(chunk, c64(rows));
              for (int r = 0; r < rows; ++r)  // rows past m repeat row m − 1 (their results are not stored)
                xrow[r] = b.CreateInBoundsGEP(xelem, x,
                                              b.CreateMul(smin(b.CreateAdd(r0, c64(r)), b.CreateSub(m, c64(1))), k));
              std::vector<llvm::Value*> acc(static_cast<std::size_t>(outs * rows), llvm::ConstantFP::get(vf, 0.0));
              llvm::Value* kvec = c64(0);  // where the vectors of the last, partial group start (q8)
              if (group > 0) {
                // Whole groups: their scales loaded once, their group / lanes vectors unrolled.
                llvm::Value* kgroups = b.CreateSDiv(k, c64(group), "kgroups");
                acc = ir::emit_loop(
                    b, c64(0), kgroups, 1, acc,
                    [&](llvm::Value* gi, const std::vector<llvm::Value*>& in) {
                      const std::vector<llvm::Value*> sc = scales_of(gi);
                      // Each vector scaled as loaded, or (per_group) the group's sums over its
                      // integers (q4's nibbles, with Σ x for the zero point: Σ x (n − 8) = Σ x n −
                      // 8 Σ x) scaled once: one multiply a group, not one a vector.
                      std::vector<llvm::Value*> part =
                          per_group ? std::vector<llvm::Value*>(in.size(), llvm::ConstantFP::get(vf, 0.0)) : in;
                      std::vector<llvm::Value*> xsum(static_cast<std::size_t>(rows), llvm::ConstantFP::get(vf, 0.0));
                      for (int v = 0; v < group / lanes; ++v) {
                        const int e = v * lanes, half = group / 2;  // the vector's first entry in the group
                        llvm::Value* i = b.CreateAdd(b.CreateMul(gi, c64(group)), c64(e));
                        llvm::Value* q4_at = cfg.q4 ? b.CreateAdd(b.CreateMul(gi, c64(half)), c64(e % half)) : nullptr;
                        part = step(i, part, nullptr, per_group ? std::vector<llvm::Value*>{} : sc, q4_at, e >= half);
                        if (per_group)
                          for (int r = 0; r < rows; ++r)
                            xsum[r] = b.CreateFAdd(xsum[r], load(xelem, xrow[r], i, nullptr));
                      }
                      if (!per_group) return part;
                      std::vector<llvm::Value*> a = in;
                      llvm::Value* zero_point = llvm::ConstantFP::get(vf, -static_cast<double>(kQ4Zero));
                      for (int j = 0; j < outs; ++j)
                        for (int r = 0; r < rows; ++r) {
                          a[j * rows + r] = fma(fma(xsum[r], zero_point, part[j * rows + r]), sc[j], a[j * rows + r]);
                        }
                      return a;
                    },
                    "gemv.groups");
                kvec = b.CreateMul(kgroups, c64(group));
              }
              if (!cfg.q4) {  // (a q4 W's K is whole groups: select.hpp)
                // The last, partial group's scales (the last group's when there is none: the loop and the
                // masked vector below then read no W).
                const std::vector<llvm::Value*> last =
                    scales_of(group > 0 ? smin(b.CreateSDiv(kvec, c64(group)), b.CreateSub(groups, c64(1))) : nullptr);
                acc = ir::emit_loop(
                    b, kvec, kfull, lanes, acc,
                    [&](llvm::Value* i, const std::vector<llvm::Value*>& in) { return step(i, in, nullptr, last); },
                    "gemv.k", ir::Unroll::allowed);
                acc = step(kfull, acc, tail, last);  // K's last partial vector (an empty mask when lanes divides K)
              }

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
                llvm::Value* row = b.CreateAdd(r0, c64(r));
                llvm::Value* dst = b.CreateGEP(f32, y, b.CreateAdd(b.CreateMul(row, n), o0));
                llvm::Value* mask = valid;
                if (r > 0)
                  mask = b.CreateAnd(mask, b.CreateVectorSplat(static_cast<unsigned>(outs), b.CreateICmpSLT(row, m)));
                b.CreateMaskedStore(out, dst, llvm::Align(4), mask);
              }
            },
            "gemv.rows");
      },
      "gemv.out");
  b.CreateRetVoid();
}

}  // namespace qkv::codegen::cpu
