// The JIT'd GEMM of gemm.hpp: the IR generator of its kernel, the kernel cache, and the driver
// that packs Bᵀ and splits a call into (row block, column block) tasks on the thread pool.
//
// The generated function computes rows [m0, m1) × columns [n0, n1) of C:
//
//   void qkv_gemm_<hash>(const GemmArgs* args, i64 m0, i64 m1, i64 n0, i64 n1)
//
//   for k0 in [0, K) step KC                         (first block: accumulators start at bias)
//     for i in [m0, m1) step MR
//       pack A[i : i+MR, k0 : k0+KC] as [kc][MR] into the stack (rows past m1 are zeros)
//       for each panel p of NR columns in [n0, n1)
//         acc[MR][NR/lanes] = k0 == 0 ? bias[p] : C tile (masked loads)
//         for kk in [0, kc): acc[r][v] += splat(Ap[kk][r]) · Bp[p][k0 + kk][v]
//         C tile = acc (masked stores: rows < m1, columns < N)
//
// That is the bf16 kernel's order (A widened or paired as packed). f32 A is read in place
// (a_in_place): no pack, splat(A[i + r][k0 + kk]), and the panel loop outside the row blocks' —
// the panel's K block, loaded once, serves every row block of [m0, m1) from L1.
//
// n0 is a multiple of NR; Bp (the packed Bᵀ) holds panel p's K × NR block contiguously,
// zero-padded past N, so the micro-kernel never needs a column mask until the store.
#include <qkv/codegen/cpu/gemm.hpp>
#include <qkv/codegen/cpu/tuning.hpp>
#include <qkv/ir/hash.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>

#include <qkv/codegen/jit.hpp>

#include "cpu/kernels/gemm_kernel.hpp"
#include "cpu/schedule.hpp"
#include "cpu/thread_pool.hpp"
#include "llvm/ir_util.hpp"

namespace qkv::codegen::cpu {

GemmConfig choose_gemm_config(const GemmSpec& spec, const HostTarget& host) {
  GemmConfig c;
  c.lanes = spec.vector_floats > 0 ? spec.vector_floats : std::max(host.vector_floats, 4);
  // Accumulators rows · col_vectors plus col_vectors loads of B must fit the register file (the
  // broadcasts of A fold into the FMAs' memory operand with AVX-512, take one register otherwise):
  // the table's (tuning.hpp).
  const KernelTuning t = kernel_tuning(host, c.lanes);
  c.rows = spec.rows > 0 ? spec.rows : t.gemm_rows;
  c.small_rows = spec.rows > 0 ? 0 : t.gemm_small_rows;
  c.col_vectors = spec.col_vectors > 0 ? spec.col_vectors : t.gemm_col_vectors;
  c.k_block = spec.k_block > 0 ? spec.k_block : (spec.bf16 || spec.f16 ? t.gemm_k_block_bf16 : t.gemm_k_block);
  c.bf16 = spec.bf16;
  c.f16 = spec.f16 && !spec.bf16;
  c.dpbf16 = spec.bf16 && bf16_dot_products(host, c.lanes);
  if (c.dpbf16) c.k_block += c.k_block % 2;  // whole pairs per K block
  c.cpu = host.cpu;
  c.features = joined_features(host);
  return c;
}

namespace {

// ------------------------------------------------------------------------------------------------
// IR generation

class GemmEmitter {
 public:
  GemmEmitter(llvm::Module& module, const GemmConfig& cfg)
      : module_(module), ctx_(module.getContext()), b_(ctx_), cfg_(cfg) {
    f32_ = b_.getFloatTy();
    i8_ = b_.getInt8Ty();
    i64_ = b_.getInt64Ty();
    ptr_ = b_.getPtrTy();
    vf_ = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(cfg.lanes));
    i16_ = b_.getInt16Ty();
    i32_ = b_.getInt32Ty();
    vi_ = llvm::FixedVectorType::get(i32_, static_cast<unsigned>(cfg.lanes));
  }

  void emit(const std::string& name) {
    fn_ = ir::declare_kernel(module_, b_, name, {ptr_, i64_, i64_, i64_, i64_}, cfg_.cpu, cfg_.features, cfg_.lanes,
                             /*args_param=*/true);
    llvm::Value* args = fn_->getArg(0);
    llvm::Value* m0 = fn_->getArg(1);
    llvm::Value* m1 = fn_->getArg(2);
    llvm::Value* n0 = fn_->getArg(3);
    llvm::Value* n1 = fn_->getArg(4);
    args->setName("args");
    m0->setName("m0");
    m1->setName("m1");
    n0->setName("n0");
    n1->setName("n1");

    auto field = [&](std::size_t offset, llvm::Type* t, const char* nm) -> llvm::Value* {
      return b_.CreateLoad(t, b_.CreateConstInBoundsGEP1_64(i8_, args, offset), nm);
    };
    a_ = field(offsetof(GemmArgs, a), ptr_, "a");
    bp_ = field(offsetof(GemmArgs, bp), ptr_, "bp");
    bias_ = field(offsetof(GemmArgs, bias), ptr_, "bias");
    c_ = field(offsetof(GemmArgs, c), ptr_, "c");
    m_ = field(offsetof(GemmArgs, m), i64_, "M");
    n_ = field(offsetof(GemmArgs, n), i64_, "N");
    k_ = field(offsetof(GemmArgs, k), i64_, "K");
    if (cfg_.int8_dot) a_scales_ = field(offsetof(GemmArgs, a_scales), ptr_, "a_scales");

    const std::int64_t mr = cfg_.rows, nr = cfg_.cols(), kc = cfg_.k_block;
    llvm::Value* p0 = b_.CreateSDiv(n0, c64(nr), "p0");
    llvm::Value* p1 = b_.CreateSDiv(b_.CreateAdd(n1, c64(nr - 1)), c64(nr), "p1");
    // f32 [kc][MR], or with dpbf16 the pairs [kc/2][MR] (i32: two bf16) — the same bytes.
    if (!a_in_place(cfg_)) ap_ = ir::entry_alloca(b_, f32_, static_cast<std::uint64_t>(mr * kc), 64, "a_packed");
    ir::emit_loop(
        b_, c64(0), k_, kc,
        [&](llvm::Value* k0) {
          llvm::Value* depth = smin(c64(kc), b_.CreateSub(k_, k0), "kc");
          llvm::Value* first = b_.CreateICmpEQ(k0, c64(0), "first");
          auto row_blocks = [&](const std::function<void(llvm::Value*, llvm::Value*)>& body) {
            ir::emit_loop(
                b_, m0, m1, mr, [&](llvm::Value* i) { body(i, smin(c64(mr), b_.CreateSub(m1, i), "rows")); },
                "row_block");
          };
          auto panels = [&](const std::function<void(llvm::Value*)>& body) {
            ir::emit_loop(b_, p0, p1, 1, body, "panel");
          };
          if (a_in_place(cfg_)) {
            // Panel by panel, every row block under it: the panel's K block stays in L1 for all of them.
            panels([&](llvm::Value* p) {
              row_blocks([&](llvm::Value* i, llvm::Value* rows) { in_place_tile(i, rows, p, k0, depth, first); });
            });
          } else {
            row_blocks([&](llvm::Value* i, llvm::Value* rows) {
              pack_a(i, k0, depth, rows);
              panels([&](llvm::Value* p) { micro_tile(i, rows, p, k0, depth, first); });
            });
          }
        },
        "k_block");
    b_.CreateRetVoid();
  }

 private:
  llvm::Value* c64(std::int64_t v) { return ir::i64c(b_, v); }
  llvm::Value* smin(llvm::Value* x, llvm::Value* y, const llvm::Twine& nm = "") {
    return b_.CreateSelect(b_.CreateICmpSLT(x, y), x, y, nm);
  }

  /// A tile of A read in place. A's columns (a_transposed): a whole tile reads MR consecutive
  /// floats of each K row; a partial one repeats its first row's instead of reading past M.
  void in_place_tile(llvm::Value* i, llvm::Value* rows, llvm::Value* p, llvm::Value* k0, llvm::Value* depth,
                     llvm::Value* first) {
    if (!cfg_.a_transposed) {
      micro_tile(i, rows, p, k0, depth, first);
      return;
    }
    auto* whole = llvm::BasicBlock::Create(ctx_, "whole_rows", fn_);
    auto* part = llvm::BasicBlock::Create(ctx_, "part_rows", fn_);
    auto* join = llvm::BasicBlock::Create(ctx_, "rows_done", fn_);
    b_.CreateCondBr(b_.CreateICmpEQ(rows, c64(cfg_.rows)), whole, part);
    b_.SetInsertPoint(whole);
    micro_tile(i, rows, p, k0, depth, first, /*whole_rows=*/true);
    b_.CreateBr(join);
    b_.SetInsertPoint(part);
    micro_tile(i, rows, p, k0, depth, first);
    b_.CreateBr(join);
    b_.SetInsertPoint(join);
  }

  /// Ap[kk][r] = A[i + r][k0 + kk] for r < rows, 0 for rows ≤ r < MR (as f32); with dpbf16 the
  /// pairs Ap[kp][r] = (A[i + r][k0 + 2kp], A[i + r][k0 + 2kp + 1]), the second 0 past K. A as
  /// [M, K] rows, or (a_transposed) [K, M]: A[i + r][k0 + kk] at (k0 + kk)·M + i + r.
  void pack_a(llvm::Value* i, llvm::Value* k0, llvm::Value* depth, llvm::Value* rows) {
    const std::int64_t mr = cfg_.rows;
    llvm::Type* elem = half_bits(cfg_) ? i16_ : f32_;
    if (cfg_.dpbf16 && cfg_.a_transposed) {
      // A given as [K, M]: a pair of K for the tile's rows is two K rows' MR consecutive entries
      // (masked to the valid rows; the second zero past K), interleaved into MR words.
      auto* part = llvm::FixedVectorType::get(i16_, static_cast<unsigned>(mr));
      llvm::Value* valid = ir::lanes_below(b_, static_cast<int>(mr), rows);
      llvm::Value* none = llvm::Constant::getNullValue(part);
      llvm::Value* pairs = b_.CreateSDiv(b_.CreateAdd(depth, c64(1)), c64(2), "pairs");
      ir::emit_loop(
          b_, c64(0), pairs, 1,
          [&](llvm::Value* kp) {
            llvm::Value* kk = b_.CreateAdd(k0, b_.CreateMul(kp, c64(2)));
            auto row = [&](llvm::Value* at, llvm::Value* mask) {
              return b_.CreateMaskedLoad(part, b_.CreateInBoundsGEP(i16_, a_, b_.CreateAdd(b_.CreateMul(at, m_), i)),
                                         llvm::Align(2), mask, none);
            };
            llvm::Value* second = b_.CreateAdd(kk, c64(1));
            llvm::Value* has_second = b_.CreateICmpSLT(second, b_.CreateAdd(k0, depth));
            llvm::Value* lo = row(kk, valid);
            llvm::Value* hi = row(b_.CreateSelect(has_second, second, kk),
                                  b_.CreateAnd(valid, b_.CreateVectorSplat(static_cast<unsigned>(mr), has_second)));
            b_.CreateAlignedStore(b_.CreateShuffleVector(lo, hi, ir::interleave_halves(static_cast<int>(mr))),
                                  b_.CreateInBoundsGEP(i32_, ap_, b_.CreateMul(kp, c64(mr))), llvm::Align(4));
          },
          "pack_pairs");
      return;
    }
    // A as [M, K] rows (dpbf16): whole blocks of `lanes` pairs go as one vector of words a row,
    // the rows (zeros past `rows` and up to `lanes`) transposed in registers, each pair then the
    // tile's MR words; the pairs after the last whole block entry by entry below.
    llvm::Value* kp_start = c64(0);
    if (cfg_.dpbf16 && !cfg_.a_transposed && cfg_.lanes >= mr) {
      const int lanes = cfg_.lanes;
      llvm::Value* blocks = b_.CreateSDiv(b_.CreateSDiv(depth, c64(2)), c64(lanes), "pair_blocks");
      kp_start = b_.CreateMul(blocks, c64(lanes));
      std::vector<int> first_rows;
      for (int r = 0; r < mr; ++r) first_rows.push_back(r);
      ir::emit_loop(
          b_, c64(0), blocks, 1,
          [&](llvm::Value* blk) {
            llvm::Value* kp0 = b_.CreateMul(blk, c64(lanes));
            std::vector<llvm::Value*> words;
            for (int r = 0; r < lanes; ++r) {
              if (r >= mr) {
                words.push_back(llvm::Constant::getNullValue(vi_));
                continue;
              }
              llvm::Value* valid = b_.CreateICmpSLT(c64(r), rows);
              llvm::Value* row = b_.CreateSelect(valid, b_.CreateAdd(i, c64(r)), i);
              llvm::Value* at = b_.CreateInBoundsGEP(
                  i16_, a_, b_.CreateAdd(b_.CreateMul(row, k_), b_.CreateAdd(k0, b_.CreateMul(kp0, c64(2)))));
              words.push_back(b_.CreateSelect(valid, b_.CreateAlignedLoad(vi_, at, llvm::Align(2)),
                                              llvm::Constant::getNullValue(vi_)));
            }
            words = ir::transpose_square(b_, std::move(words));  // words[w]: pair kp0 + w of each row
            for (int w = 0; w < lanes; ++w)
              b_.CreateAlignedStore(b_.CreateShuffleVector(words[static_cast<std::size_t>(w)], first_rows),
                                    b_.CreateInBoundsGEP(i32_, ap_, b_.CreateMul(b_.CreateAdd(kp0, c64(w)), c64(mr))),
                                    llvm::Align(4));
          },
          "pack_pair_blocks");
    }
    ir::emit_loop(
        b_, c64(0), c64(mr), 1,
        [&](llvm::Value* r) {
          llvm::Value* valid = b_.CreateICmpSLT(r, rows);
          // An invalid row reads row i (always valid) and stores zero: no branch in the loop.
          llvm::Value* src_row = b_.CreateSelect(valid, b_.CreateAdd(i, r), i);
          // Entry kk of the row (from k0 on): src[kk · k_stride].
          llvm::Value* src = b_.CreateInBoundsGEP(elem, a_,
                                                  cfg_.a_transposed ? b_.CreateAdd(b_.CreateMul(k0, m_), src_row)
                                                                    : b_.CreateAdd(b_.CreateMul(src_row, k_), k0),
                                                  "a_row");
          llvm::Value* k_stride = cfg_.a_transposed ? m_ : c64(1);
          if (cfg_.dpbf16) {
            llvm::Value* pairs = b_.CreateSDiv(b_.CreateAdd(depth, c64(1)), c64(2), "pairs");
            ir::emit_loop(
                b_, kp_start, pairs, 1,
                [&](llvm::Value* kp) {
                  llvm::Value* kk = b_.CreateMul(kp, c64(2));
                  llvm::Value* second = b_.CreateAdd(kk, c64(1));
                  llvm::Value* has_second = b_.CreateICmpSLT(second, depth);
                  llvm::Value* lo = b_.CreateLoad(i16_, b_.CreateInBoundsGEP(i16_, src, b_.CreateMul(kk, k_stride)));
                  // Past K the second half reads the first again and is zeroed.
                  llvm::Value* hi = b_.CreateLoad(
                      i16_,
                      b_.CreateInBoundsGEP(i16_, src, b_.CreateMul(b_.CreateSelect(has_second, second, kk), k_stride)));
                  hi = b_.CreateSelect(has_second, hi, b_.getInt16(0));
                  llvm::Value* pair = b_.CreateOr(b_.CreateZExt(lo, i32_), b_.CreateShl(b_.CreateZExt(hi, i32_), 16));
                  pair = b_.CreateSelect(valid, pair, b_.getInt32(0));
                  b_.CreateStore(pair, b_.CreateInBoundsGEP(i32_, ap_, b_.CreateAdd(b_.CreateMul(kp, c64(mr)), r)));
                },
                "pack_k", ir::Unroll::allowed);
            return;
          }
          ir::emit_loop(
              b_, c64(0), depth, 1,
              [&](llvm::Value* kk) {
                llvm::Value* x = b_.CreateLoad(elem, b_.CreateInBoundsGEP(elem, src, b_.CreateMul(kk, k_stride)));
                if (half_bits(cfg_)) x = ir::half_to_f32(b_, x, /*brain=*/cfg_.bf16);
                x = b_.CreateSelect(valid, x, llvm::ConstantFP::get(f32_, 0.0));
                b_.CreateStore(x, b_.CreateInBoundsGEP(f32_, ap_, b_.CreateAdd(b_.CreateMul(kk, c64(mr)), r)));
              },
              "pack_k", ir::Unroll::allowed);
        },
        "pack_r");
  }

  void micro_tile(llvm::Value* i, llvm::Value* rows, llvm::Value* p, llvm::Value* k0, llvm::Value* depth,
                  llvm::Value* first, bool whole_rows = false) {
    const int mr = cfg_.rows, nv = cfg_.col_vectors, lanes = cfg_.lanes;
    const std::int64_t nr = cfg_.cols();
    const llvm::Align vec_align(static_cast<std::uint64_t>(lanes) * 4),
        half_align(static_cast<std::uint64_t>(lanes) * 2);
    llvm::Value* col = b_.CreateMul(p, c64(nr), "col");
    llvm::Value* cols_left = b_.CreateSub(n_, col);

    // Masks: lane l of vector v is a column < N; row r is < m1.
    std::vector<llvm::Value*> col_mask(static_cast<std::size_t>(nv));
    for (int v = 0; v < nv; ++v)
      col_mask[static_cast<std::size_t>(v)] =
          ir::lanes_below(b_, lanes, b_.CreateSub(cols_left, c64(static_cast<std::int64_t>(v) * lanes)));
    llvm::Value* none = llvm::Constant::getNullValue(col_mask[0]->getType());
    std::vector<llvm::Value*> mask(static_cast<std::size_t>(mr * nv));
    std::vector<llvm::Value*> c_ptr(static_cast<std::size_t>(mr * nv));
    for (int r = 0; r < mr; ++r) {
      llvm::Value* row_ok = b_.CreateICmpSLT(c64(r), rows);
      // Not inbounds: rows past m1 may point past C (their stores are masked off).
      llvm::Value* row_ptr = b_.CreateGEP(f32_, c_, b_.CreateAdd(b_.CreateMul(b_.CreateAdd(i, c64(r)), n_), col));
      for (int v = 0; v < nv; ++v) {
        const auto idx = static_cast<std::size_t>(r * nv + v);
        mask[idx] = b_.CreateSelect(row_ok, col_mask[static_cast<std::size_t>(v)], none);
        c_ptr[idx] = b_.CreateGEP(f32_, row_ptr, c64(static_cast<std::int64_t>(v) * lanes));
      }
    }

    // Accumulators: the bias in the first K block, C's partial sums after it.
    llvm::BasicBlock* from_bias = llvm::BasicBlock::Create(ctx_, "init_bias", fn_);
    llvm::BasicBlock* from_c = llvm::BasicBlock::Create(ctx_, "init_c", fn_);
    llvm::BasicBlock* body = llvm::BasicBlock::Create(ctx_, "tile", fn_);
    b_.CreateCondBr(first, from_bias, from_c);
    b_.SetInsertPoint(from_bias);
    std::vector<llvm::Value*> bias_vec(static_cast<std::size_t>(nv));
    for (int v = 0; v < nv; ++v)
      bias_vec[static_cast<std::size_t>(v)] = b_.CreateAlignedLoad(
          vf_, b_.CreateInBoundsGEP(f32_, bias_, b_.CreateAdd(col, c64(static_cast<std::int64_t>(v) * lanes))),
          llvm::Align(4), "bias_v");
    b_.CreateBr(body);
    b_.SetInsertPoint(from_c);
    llvm::Value* zero = llvm::Constant::getNullValue(vf_);
    std::vector<llvm::Value*> c_vals(static_cast<std::size_t>(mr * nv));
    for (std::size_t x = 0; x < c_vals.size(); ++x)
      c_vals[x] = b_.CreateMaskedLoad(vf_, c_ptr[x], llvm::Align(4), mask[x], zero, "c_v");
    b_.CreateBr(body);
    b_.SetInsertPoint(body);
    std::vector<llvm::Value*> init(static_cast<std::size_t>(mr * nv));
    for (int r = 0; r < mr; ++r)
      for (int v = 0; v < nv; ++v) {
        const auto idx = static_cast<std::size_t>(r * nv + v);
        llvm::PHINode* phi = b_.CreatePHI(vf_, 2, "acc0");
        phi->addIncoming(bias_vec[static_cast<std::size_t>(v)], from_bias);
        phi->addIncoming(c_vals[idx], from_c);
        init[idx] = phi;
      }

    if (cfg_.int8_dot) {
      int8_tile(i, rows, p, k0, depth, init, c_ptr, mask);
      return;
    }
    if (cfg_.dpbf16) {
      // Panel p holds [K2][NR][2] bf16 (K2 = ceil(K / 2)); the K block starts at pair k0 / 2. Per
      // pair: col_vectors loads of 32 bf16 (16 columns × 2), one 32-bit broadcast of A's pair
      // per row, and acc += A.lo·B.lo + A.hi·B.hi lane by lane (vdpbf16ps).
      llvm::Value* k2 = b_.CreateSDiv(b_.CreateAdd(k_, c64(1)), c64(2));
      llvm::Value* panel = b_.CreateInBoundsGEP(
          i32_, bp_, b_.CreateMul(b_.CreateAdd(b_.CreateMul(p, k2), b_.CreateSDiv(k0, c64(2))), c64(nr)), "b_panel");
      llvm::Value* pairs = b_.CreateSDiv(b_.CreateAdd(depth, c64(1)), c64(2), "pairs");
      std::vector<llvm::Value*> acc = ir::emit_loop(
          b_, c64(0), pairs, 1, init,
          [&](llvm::Value* kp, const std::vector<llvm::Value*>& cur) {
            llvm::Value* brow = b_.CreateInBoundsGEP(i32_, panel, b_.CreateMul(kp, c64(nr)));
            llvm::Value* arow = b_.CreateInBoundsGEP(i32_, ap_, b_.CreateMul(kp, c64(mr)));
            std::vector<llvm::Value*> bv(static_cast<std::size_t>(nv));
            for (int v = 0; v < nv; ++v)
              bv[static_cast<std::size_t>(v)] = b_.CreateAlignedLoad(
                  vi_,
                  b_.CreateConstInBoundsGEP1_64(i32_, brow,
                                                static_cast<std::uint64_t>(v) * static_cast<std::uint64_t>(lanes)),
                  vec_align, "b_v");
            std::vector<llvm::Value*> next(cur.size());
            for (int r = 0; r < mr; ++r) {
              llvm::Value* x =
                  b_.CreateAlignedLoad(i32_, b_.CreateConstInBoundsGEP1_64(i32_, arow, static_cast<std::uint64_t>(r)),
                                       llvm::Align(4), "a_s");
              llvm::Value* xs = b_.CreateVectorSplat(static_cast<unsigned>(lanes), x);
              for (int v = 0; v < nv; ++v) {
                const auto idx = static_cast<std::size_t>(r * nv + v);
                next[idx] = ir::dot_bf16_pairs(b_, cur[idx], xs, bv[static_cast<std::size_t>(v)]);
              }
            }
            return next;
          },
          "k");
      for (std::size_t x = 0; x < acc.size(); ++x) b_.CreateMaskedStore(acc[x], c_ptr[x], llvm::Align(4), mask[x]);
      return;
    }
    llvm::Type* b_elem = half_panels(cfg_) ? i16_ : f32_;
    llvm::Value* panel =
        b_.CreateInBoundsGEP(b_elem, bp_, b_.CreateMul(b_.CreateAdd(b_.CreateMul(p, k_), k0), c64(nr)), "b_panel");
    // A read in place: row r of the tile from A[i + r][k0] on (a row past m1 reads row i; its
    // sums are never stored).
    // a_cols (f32 A given transposed, read in place): row r's offset in a K row; a bf16 A is packed.
    const bool a_columns = cfg_.a_transposed && a_in_place(cfg_);
    std::vector<llvm::Value*> a_rows, a_cols;
    if (a_columns)
      for (int r = 0; r < mr; ++r)
        a_cols.push_back(whole_rows ? c64(r) : b_.CreateSelect(b_.CreateICmpSLT(c64(r), rows), c64(r), c64(0)));
    else if (a_in_place(cfg_))
      for (int r = 0; r < mr; ++r) {
        llvm::Value* row = b_.CreateSelect(b_.CreateICmpSLT(c64(r), rows), b_.CreateAdd(i, c64(r)), i);
        a_rows.push_back(b_.CreateInBoundsGEP(f32_, a_, b_.CreateAdd(b_.CreateMul(row, k_), k0), "a_row"));
      }
    std::vector<llvm::Value*> acc = ir::emit_loop(
        b_, c64(0), depth, 1, init,
        [&](llvm::Value* kk, const std::vector<llvm::Value*>& cur) {
          llvm::Value* brow = b_.CreateInBoundsGEP(b_elem, panel, b_.CreateMul(kk, c64(nr)));
          llvm::Value* arow = nullptr;
          if (a_columns)  // A[i + r][k0 + kk] = At[k0 + kk][i + r]
            arow = b_.CreateInBoundsGEP(f32_, a_, b_.CreateAdd(b_.CreateMul(b_.CreateAdd(k0, kk), m_), i), "a_col");
          else if (a_rows.empty())
            arow = b_.CreateInBoundsGEP(f32_, ap_, b_.CreateMul(kk, c64(mr)));
          std::vector<llvm::Value*> bv(static_cast<std::size_t>(nv));
          for (int v = 0; v < nv; ++v) {
            llvm::Value* at = b_.CreateConstInBoundsGEP1_64(b_elem, brow, static_cast<std::uint64_t>(v) * lanes);
            bv[static_cast<std::size_t>(v)] =
                half_panels(cfg_)
                    ? ir::half_to_f32(b_, b_.CreateAlignedLoad(llvm::FixedVectorType::get(i16_, lanes), at, half_align),
                                      /*brain=*/cfg_.bf16)
                    : b_.CreateAlignedLoad(vf_, at, vec_align, "b_v");
          }
          std::vector<llvm::Value*> next(cur.size());
          for (int r = 0; r < mr; ++r) {
            const auto rr = static_cast<std::size_t>(r);
            llvm::Value* at = !a_cols.empty() ? b_.CreateInBoundsGEP(f32_, arow, a_cols[rr])
                              : arow          ? b_.CreateConstInBoundsGEP1_64(f32_, arow, static_cast<std::uint64_t>(r))
                                              : b_.CreateInBoundsGEP(f32_, a_rows[rr], kk);
            llvm::Value* x = b_.CreateAlignedLoad(f32_, at, llvm::Align(4), "a_s");
            llvm::Value* xs = b_.CreateVectorSplat(static_cast<unsigned>(lanes), x);
            for (int v = 0; v < nv; ++v) {
              const auto idx = static_cast<std::size_t>(r * nv + v);
              next[idx] =
                  b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {vf_}, {xs, bv[static_cast<std::size_t>(v)], cur[idx]});
            }
          }
          return next;
        },
        "k");
    for (std::size_t x = 0; x < acc.size(); ++x) b_.CreateMaskedStore(acc[x], c_ptr[x], llvm::Align(4), mask[x]);
  }

  /// The int8_dot tile (gemm_panel_bytes' panels; A and its scales as GemmArgs::a_scales says),
  /// group by group of the K block: int32 sums start at the panel's −128 · Σ W of the group and
  /// take four u8 · s8 products a lane an instruction; then acc += float(sum) · W's scale ·
  /// the row's scale. A row past m1 reads row i (its sums are never stored).
  void int8_tile(llvm::Value* i, llvm::Value* rows, llvm::Value* p, llvm::Value* k0, llvm::Value* depth,
                 const std::vector<llvm::Value*>& init, const std::vector<llvm::Value*>& c_ptr,
                 const std::vector<llvm::Value*>& mask) {
    const int mr = cfg_.rows, nv = cfg_.col_vectors, lanes = cfg_.lanes;
    const std::int64_t nr = cfg_.cols(), group = cfg_.quant_group, group_bytes = nr * (group + 8);
    const llvm::Align four(4);
    llvm::Value* groups = b_.CreateSDiv(b_.CreateAdd(k_, c64(group - 1)), c64(group), "groups");
    llvm::Value* g0 = b_.CreateSDiv(k0, c64(group), "g0");
    llvm::Value* count = b_.CreateSDiv(b_.CreateAdd(depth, c64(group - 1)), c64(group), "block_groups");
    llvm::Value* panel = b_.CreateInBoundsGEP(
        i8_, bp_, b_.CreateMul(b_.CreateAdd(b_.CreateMul(p, groups), g0), c64(group_bytes)), "b_panel");
    std::vector<llvm::Value*> a_rows, s_rows;
    for (int r = 0; r < mr; ++r) {
      llvm::Value* row = b_.CreateSelect(b_.CreateICmpSLT(c64(r), rows), b_.CreateAdd(i, c64(r)), i);
      a_rows.push_back(b_.CreateInBoundsGEP(
          i8_, a_, b_.CreateAdd(b_.CreateMul(row, b_.CreateMul(groups, c64(group))), b_.CreateMul(g0, c64(group))),
          "a_row"));
      s_rows.push_back(b_.CreateInBoundsGEP(f32_, a_scales_, b_.CreateAdd(b_.CreateMul(row, groups), g0), "s_row"));
    }
    auto vector_at = [&](llvm::Type* t, llvm::Value* base, std::int64_t byte) {
      return b_.CreateAlignedLoad(t, b_.CreateConstInBoundsGEP1_64(i8_, base, static_cast<std::uint64_t>(byte)), four);
    };
    std::vector<llvm::Value*> acc = ir::emit_loop(
        b_, c64(0), count, 1, init,
        [&](llvm::Value* g, const std::vector<llvm::Value*>& cur) {
          llvm::Value* blk = b_.CreateInBoundsGEP(i8_, panel, b_.CreateMul(g, c64(group_bytes)), "b_group");
          std::vector<llvm::Value*> sums(static_cast<std::size_t>(mr * nv));
          for (int v = 0; v < nv; ++v) {
            llvm::Value* corr = vector_at(vi_, blk, group * nr + nr * 4 + std::int64_t{v} * lanes * 4);
            for (int r = 0; r < mr; ++r) sums[static_cast<std::size_t>(r * nv + v)] = corr;
          }
          for (std::int64_t kq = 0; kq < group / 4; ++kq) {
            std::vector<llvm::Value*> bv(static_cast<std::size_t>(nv));
            for (int v = 0; v < nv; ++v)
              bv[static_cast<std::size_t>(v)] = vector_at(vi_, blk, (kq * nr + std::int64_t{v} * lanes) * 4);
            for (int r = 0; r < mr; ++r) {
              llvm::Value* at = b_.CreateInBoundsGEP(i8_, a_rows[static_cast<std::size_t>(r)],
                                                     b_.CreateAdd(b_.CreateMul(g, c64(group)), c64(kq * 4)));
              llvm::Value* xs =
                  b_.CreateVectorSplat(static_cast<unsigned>(lanes), b_.CreateAlignedLoad(i32_, at, llvm::Align(1)));
              for (int v = 0; v < nv; ++v) {
                auto& sum = sums[static_cast<std::size_t>(r * nv + v)];
                sum = ir::dot_u8s8(b_, sum, xs, bv[static_cast<std::size_t>(v)]);
              }
            }
          }
          std::vector<llvm::Value*> next(cur.size());
          std::vector<llvm::Value*> w_scale(static_cast<std::size_t>(nv));
          for (int v = 0; v < nv; ++v)
            w_scale[static_cast<std::size_t>(v)] = vector_at(vf_, blk, group * nr + std::int64_t{v} * lanes * 4);
          for (int r = 0; r < mr; ++r) {
            llvm::Value* x_scale = b_.CreateVectorSplat(
                static_cast<unsigned>(lanes),
                b_.CreateAlignedLoad(f32_, b_.CreateInBoundsGEP(f32_, s_rows[static_cast<std::size_t>(r)], g), four));
            for (int v = 0; v < nv; ++v) {
              const auto idx = static_cast<std::size_t>(r * nv + v);
              next[idx] = b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {vf_},
                                             {b_.CreateSIToFP(sums[idx], vf_),
                                              b_.CreateFMul(w_scale[static_cast<std::size_t>(v)], x_scale), cur[idx]});
            }
          }
          return next;
        },
        "group");
    for (std::size_t x = 0; x < acc.size(); ++x) b_.CreateMaskedStore(acc[x], c_ptr[x], llvm::Align(4), mask[x]);
  }

  llvm::Module& module_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  GemmConfig cfg_;
  llvm::Type *f32_ = nullptr, *i8_ = nullptr, *i16_ = nullptr, *i32_ = nullptr, *i64_ = nullptr, *ptr_ = nullptr;
  llvm::FixedVectorType *vf_ = nullptr, *vi_ = nullptr;
  llvm::Function* fn_ = nullptr;
  llvm::Value *a_ = nullptr, *bp_ = nullptr, *bias_ = nullptr, *c_ = nullptr, *m_ = nullptr, *n_ = nullptr,
              *k_ = nullptr;
  llvm::Value* ap_ = nullptr;
  llvm::Value* a_scales_ = nullptr;
};

}  // namespace

void emit_gemm_kernel(llvm::Module& module, const GemmConfig& cfg, const std::string& name) {
  GemmEmitter(module, cfg).emit(name);
}

std::unique_ptr<llvm::Module> build_gemm_module(llvm::LLVMContext& context, const GemmConfig& cfg,
                                                const std::string& name) {
  auto module = std::make_unique<llvm::Module>(name, context);
  emit_gemm_kernel(*module, cfg, name);
  return module;
}

namespace {

// ------------------------------------------------------------------------------------------------
// kernel cache

using Clock = std::chrono::steady_clock;

struct Kernel {
  GemmSpec spec;
  GemmConfig config;
  std::string name;
  GemmKernelFn* fn = nullptr;
};

struct KernelCache {
  std::mutex mutex;
  std::unique_ptr<Jit> jit;
  std::map<std::pair<std::uint64_t, std::string>, std::vector<std::unique_ptr<Kernel>>> kernels;
  std::uint64_t added = 0;
};

KernelCache& cache() {
  static KernelCache c;
  return c;
}

[[noreturn]] void invalid(const std::string& what) { throw std::invalid_argument("run_linear: " + what); }

void check_spec(const GemmSpec& s) {
  if (s.vector_floats < 0 || s.vector_floats > 64) invalid("vector_floats must be 0 (auto) or in [1, 64]");
  if (s.rows < 0 || s.rows > 32) invalid("rows must be 0 (auto) or in [1, 32]");
  if (s.col_vectors < 0 || s.col_vectors > 8) invalid("col_vectors must be 0 (auto) or in [1, 8]");
  if (s.k_block < 0 || s.k_block > 4096) invalid("k_block must be 0 (auto) or in [1, 4096]");
}

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Jit& jit_locked(KernelCache& c) {
  if (!c.jit) {
    std::string error;
    c.jit = Jit::create(&error);
    if (!c.jit) throw std::runtime_error("run_linear: " + error);
  }
  return *c.jit;
}

const Kernel& get_kernel(const GemmSpec& spec, GemmInfo* info) {
  check_spec(spec);
  KernelCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  Jit& jit = jit_locked(c);
  auto& bucket = c.kernels[{spec.hash(), jit.target_key()}];
  for (const auto& k : bucket)
    if (k->spec == spec) {
      if (info) {
        info->name = k->name;
        info->cached = true;
      }
      return *k;
    }
  const auto t0 = Clock::now();
  auto kernel = std::make_unique<Kernel>();
  kernel->spec = spec;
  kernel->config = choose_gemm_config(spec, jit.target());
  kernel->name = "qkv_gemm_" + hex(spec.hash()) + "_" + std::to_string(c.added++);
  auto context = std::make_unique<llvm::LLVMContext>();
  auto module = build_gemm_module(*context, kernel->config, kernel->name);
  std::string error;
  if (!jit.add(std::move(module), std::move(context), &error)) throw std::runtime_error("run_linear: " + error);
  kernel->fn = jit.lookup<GemmKernelFn>(kernel->name, &error);
  if (!kernel->fn) throw std::runtime_error("run_linear: " + error);
  if (info) {
    info->name = kernel->name;
    info->compile_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  bucket.push_back(std::move(kernel));
  return *bucket.back();
}

/// A 64-byte aligned float buffer (reused by the calling thread between calls).
float* scratch(std::vector<float>& buf, std::size_t n) {
  if (buf.size() < n + 16) buf.resize(n + 16);
  auto addr = reinterpret_cast<std::uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / sizeof(float);
}

}  // namespace

std::uint64_t GemmSpec::hash() const {
  Fnv1a h;
  for (int v : {vector_floats, rows, col_vectors, k_block, bf16 ? 1 : 0, f16 ? 1 : 0}) h.i(v);
  return h.value();
}

GemmInfo prepare_linear(const GemmSpec& spec) {
  GemmInfo info;
  const Kernel& k = get_kernel(spec, &info);
  info.vector_floats = k.config.lanes;
  info.rows = k.config.rows;
  info.cols = k.config.cols();
  info.k_block = k.config.k_block;
  info.dpbf16 = k.config.dpbf16;
  return info;
}

void clear_linear_cache() {
  KernelCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.kernels.clear();
  c.jit.reset();
}

std::string gemm_kernel_ir(const GemmSpec& spec, bool optimized) {
  check_spec(spec);
  KernelCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  Jit& jit = jit_locked(c);
  llvm::LLVMContext context;
  auto module = build_gemm_module(context, choose_gemm_config(spec, jit.target()), "qkv_gemm_" + hex(spec.hash()));
  std::string error;
  if (optimized && !jit.optimize(*module, &error)) throw std::runtime_error("gemm_kernel_ir: " + error);
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os, nullptr);
  os.flush();
  return text;
}

namespace {

/// What run_linear and run_linear_bf16 share: the checks, the kernel, Bᵀ packed panel by panel by
/// `pack(p, panel)` into panels of `panel_words` 4-byte words, the bias padded, then the tasks of
/// schedule.hpp's gemm_blocks.
template <class Pack>
void drive(const void* a, bool have_b, const float* bias, float* c, std::int64_t m, std::int64_t n, std::int64_t k,
           int threads, const GemmSpec& spec, Pack pack) {
  if (m < 0 || n < 0 || k < 0) invalid("m, n and k must not be negative");
  if (m == 0 || n == 0) return;
  if (!c) invalid("c must not be null");
  if (k == 0) {  // an empty sum: the bias alone
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * n + j] = bias ? bias[j] : 0.0f;
    return;
  }
  if (!a || !have_b) invalid("a and b must not be null");
  const Kernel& kernel = get_kernel(spec, nullptr);
  const GemmConfig& cfg = kernel.config;
  const std::int64_t mr = cfg.rows, nr = cfg.cols();
  const std::int64_t panels = (n + nr - 1) / nr;
  const std::int64_t panel_words = gemm_panel_bytes(cfg, nr, k) / 4;

  thread_local std::vector<float> packed_buf, bias_buf;
  float* bp = scratch(packed_buf, static_cast<std::size_t>(panels * panel_words));
  float* bias_pad = scratch(bias_buf, static_cast<std::size_t>(panels * nr));
  for (std::int64_t j = 0; j < panels * nr; ++j) bias_pad[j] = bias && j < n ? bias[j] : 0.0f;
  ThreadPool& pool = ThreadPool::shared();
  pool.run(panels, threads, [&](std::int64_t p) { pack(cfg, p, bp + p * panel_words); });

  const GemmBlocks<std::int64_t> blocks = gemm_blocks(m, n, mr, nr, a_in_place(cfg));  // schedule.hpp
  const std::int64_t mc = blocks.mc, nblocks = blocks.nblocks, panels_per = blocks.panels_per;

  const GemmArgs args{a, bp, bias_pad, c, m, n, k, nullptr};
  GemmKernelFn* fn = kernel.fn;
  pool.run(blocks.tasks(), threads, [&](std::int64_t t) {
    const std::int64_t mb = t / nblocks, nb = t % nblocks;
    const std::int64_t m0 = mb * mc, m1 = std::min(m, m0 + mc);
    const std::int64_t n0 = nb * panels_per * nr, n1 = std::min(n, n0 + panels_per * nr);
    fn(&args, m0, m1, n0, n1);
  });
}

}  // namespace

void run_linear(const float* a, const float* b, const float* bias, float* c, std::int64_t m, std::int64_t n,
                std::int64_t k, int threads, const GemmSpec& spec) {
  if (spec.bf16) invalid("spec.bf16 is run_linear_bf16's");
  // Bᵀ in panels: bp[(p·K + kk)·NR + r] = B[p·NR + r][kk], zeros past N.
  drive(a, b != nullptr, bias, c, m, n, k, threads, spec, [&](const GemmConfig& cfg, std::int64_t p, float* dst) {
    const std::int64_t nr = cfg.cols();
    for (std::int64_t r = 0; r < nr; ++r) {
      const std::int64_t row = p * nr + r;
      const float* src = b + std::min(row, n - 1) * k;  // rows past N are zeros
      for (std::int64_t kk = 0; kk < k; ++kk) dst[kk * nr + r] = row < n ? src[kk] : 0.0f;
    }
  });
}

void run_linear_bf16(const std::uint16_t* a, const std::uint16_t* b, const float* bias, float* c, std::int64_t m,
                     std::int64_t n, std::int64_t k, int threads, GemmSpec spec) {
  spec.bf16 = true;
  drive(a, b != nullptr, bias, c, m, n, k, threads, spec, [&](const GemmConfig& cfg, std::int64_t p, float* dst) {
    const std::int64_t nr = cfg.cols();
    for (std::int64_t r = 0; r < nr; ++r) {
      const std::int64_t row = p * nr + r;
      const std::uint16_t* src = b + std::min(row, n - 1) * k;  // rows past N are zeros
      if (cfg.dpbf16) {  // pairs: word (kp·NR + r) = B[row][2kp] | B[row][2kp + 1] << 16, zeros past K and N
        auto* words = reinterpret_cast<std::uint32_t*>(dst);
        for (std::int64_t kp = 0; 2 * kp < k; ++kp) {
          const std::uint32_t lo = row < n ? src[2 * kp] : 0, hi = row < n && 2 * kp + 1 < k ? src[2 * kp + 1] : 0;
          words[kp * nr + r] = lo | hi << 16;
        }
      } else {  // half_panels: bp[(p·K + kk)·NR + r] = B[row][kk] as it is
        auto* halves = reinterpret_cast<std::uint16_t*>(dst);
        for (std::int64_t kk = 0; kk < k; ++kk) halves[kk * nr + r] = row < n ? src[kk] : 0;
      }
    }
  });
}

}  // namespace qkv::codegen::cpu
