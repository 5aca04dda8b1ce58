// A linear layer whose weight is quantized (a dequantize the linear reads in place, select.hpp):
// its input rows are rounded to 8 bits per group of the weight's group first (docs/semantics.md,
// "Quantized weights"; the interpreter's linear does the same), then
//
//   m <= kQuantGemvMaxRows   the GEMV on the rounded rows (f32), W's q and scales read in place;
//                            with VNNI and groups of 32: the integer GEMV (emit_int8_gemv)
//   int8_dot (VNNI)          the 8-bit rows and their scales against 8-bit panels packed from q
//                            (gemm_panel_bytes), four products an instruction (vpdpbusd)
//   otherwise                the f32 GEMM on the rounded rows, panels dequantized from q
//
// The rounded rows go first in the linear's panel block, the panels after them (module_plan_bytes.hpp).
#include "cpu/module/module_builder_impl.hpp"

#include <utility>

#include <llvm/IR/Intrinsics.h>

namespace qkv::codegen::cpu::detail {

void ModuleBuilder::emit_quantized_linear(int id, llvm::Value* wt, llvm::Value* scales, llvm::Value* block,
                                          llvm::Value* bias_pad, llvm::Value* y, const I& m, const I& nn, const I& k) {
  const int xid = g_.node(id).inputs[0];
  const std::int64_t group = gemm_cfg_.quant_group;
  llvm::Value* panels = b_.CreateGEP(i8_, block, round_up(rounded_activation_bytes(group, m, k), 64).v());
  // The GEMV on integers: 16 lanes of vpdpbusd, groups of 32, whole pairs of groups a row.
  const bool int8_gemv = gemm_cfg_.int8_dot && gemm_cfg_.lanes == 16 && group == 32;
  auto f32_gemv = [&] {
    emit_round_activations(xid, group, block, m, k, /*int8=*/false);
    emit_gemv_call(block, wt, bias_pad, y, m, nn, k, scales);
  };
  auto gemv = [&] {
    if (!int8_gemv) return f32_gemv();
    branch(
        k % 64 == 0,
        [&] {
          emit_round_activations_in_pairs(xid, block, m, k);
          emit_int8_gemv(wt, scales, block, bias_pad, y, m, nn, k);
        },
        f32_gemv);
  };
  if (!gemm_cfg_.int8_dot) {
    branch(m <= kQuantGemvMaxRows, gemv, [&] {
      emit_round_activations(xid, group, block, m, k, /*int8=*/false);
      emit_pack_panels(wt, panels, nn, k, scales);
      emit_gemm_packed(block, panels, bias_pad, y, m, nn, k);
    });
    return;
  }
  // A batch's rows (a decode step of several sequences): x in panels of `lanes` rows, W read in
  // place. Its layout fits the rounded rows' bytes from kGemvMaxRows + 1 rows on, for groups of 32
  // or more (emit_round_activations_in_panels).
  const bool batched = group % 32 == 0;
  branch(
      m <= kQuantGemvMaxRows,
      [&] {
        if (!batched) return gemv();
        branch(m <= kGemvMaxRows || k % group != 0, gemv, [&] {
          emit_round_activations_in_panels(xid, block, m, k);
          emit_int8_gemv_panels(wt, scales, block, bias_pad, y, m, nn, k);
        });
      },
      [&] {
        llvm::Value* x_scales = emit_round_activations(xid, group, block, m, k, /*int8=*/true);
        emit_pack_int8_panels(wt, panels, nn, k, scales);
        emit_gemm_packed(block, panels, bias_pad, y, m, nn, k, x_scales);
      });
}

namespace {
/// One group of x rounded to 8 bits (round_activations' definition, in IR): amax = max |x| (NaN if
/// an entry is), d = amax / 127, q = clamp(round(x · 127 / amax), −127, 127) (0 where amax is not
/// > 0). Returns q (float lanes) and d. x's lanes past K must hold 0.
std::pair<llvm::Value*, llvm::Value*> round_group(llvm::IRBuilder<>& b, llvm::Value* x) {
  llvm::Type* f32 = b.getFloatTy();
  const auto n = llvm::cast<llvm::FixedVectorType>(x->getType())->getNumElements();
  auto f = [&](double v) { return llvm::ConstantFP::get(f32, v); };
  auto splat = [&](llvm::Value* v) { return b.CreateVectorSplat(n, v); };
  llvm::Value* amax = b.CreateIntrinsic(llvm::Intrinsic::vector_reduce_fmaximum, {x->getType()},
                                        {b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x)});
  llvm::Value* inv = b.CreateSelect(b.CreateFCmpOGT(amax, f(0.0)), b.CreateFDiv(f(127.0), amax), f(0.0));
  llvm::Value* q = b.CreateUnaryIntrinsic(llvm::Intrinsic::round, b.CreateFMul(x, splat(inv)));
  q = b.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, q, splat(f(-127.0)));
  q = b.CreateBinaryIntrinsic(llvm::Intrinsic::minnum, q, splat(f(127.0)));
  return {q, b.CreateFDiv(amax, f(127.0), "x_scale")};
}

/// −z · Σ q of a rounded group (q as i32 lanes): the start of its int32 sums against W read as
/// u8 — q8 as q + 128 (z = 128), q4's nibbles as they are, q + 8 (z = kQ4Zero).
llvm::Value* zero_correction(llvm::IRBuilder<>& b, llvm::Value* q, bool q4) {
  return b.CreateMul(b.CreateAddReduce(q), b.getInt32(q4 ? -kQ4Zero : -128));
}
}  // namespace

/// Row r's group g of x (entries k0 = g·group … min(k0 + group, K)) rounded (round_group). Written as
/// x̃ = q · d in f32 [m, K], or (int8) as q + 128 in u8 [m][G·group] (0 past K: 128) and d in f32
/// [m][G] after them; returns where the scales start (int8) or null.
llvm::Value* ModuleBuilder::emit_round_activations(int xid, std::int64_t group, llvm::Value* out, const I& m,
                                                   const I& k, bool int8) {
  const I groups = ceil_div(k, group);
  const auto lanes = static_cast<unsigned>(group);
  auto* vi = llvm::FixedVectorType::get(i32_, lanes);
  llvm::Type* elem_t = elem(xid);
  auto* vx = llvm::FixedVectorType::get(elem_t, lanes);
  llvm::Value* x_scales = int8 ? b_.CreateGEP(i8_, out, (m * groups * group).v(), "x_scales") : nullptr;
  nest_parallel({m, groups}, {}, {}, c64(group * 8), [&](const Dims& i, const Dims&) {
    const I k0 = i[1] * group;
    llvm::Value* valid = ir::lanes_below(b_, static_cast<int>(group), (k - k0).v());
    llvm::Value* src = b_.CreateGEP(elem_t, buf(xid), (i[0] * k + k0).v());
    llvm::Value* x = ir::from_storage(
        b_, b_.CreateMaskedLoad(vx, src, llvm::Align(2), valid, llvm::Constant::getNullValue(vx)), g_.node(xid).dtype);
    const auto [q, d] = round_group(b_, x);
    if (!int8) {
      b_.CreateMaskedStore(b_.CreateFMul(q, b_.CreateVectorSplat(lanes, d)),
                           b_.CreateGEP(f32_, out, (i[0] * k + k0).v()), llvm::Align(4), valid);
      return;
    }
    llvm::Value* u = b_.CreateAdd(b_.CreateFPToSI(q, vi), b_.CreateVectorSplat(lanes, b_.getInt32(128)));
    b_.CreateAlignedStore(b_.CreateTrunc(u, llvm::FixedVectorType::get(i8_, lanes)),
                          b_.CreateGEP(i8_, out, (i[0] * groups * group + k0).v()), llvm::Align(1));
    store(d, x_scales, i[0] * groups + i[1]);
  });
  return x_scales;
}

namespace {
/// The integer GEMV's view of 64 entries (a pair of groups of 32) as 16 lanes of four bytes, as
/// W's bytes hold them — q8: in order; q4: byte j of a group holds entries j and j + 16, so the
/// low nibbles of the pair's 32 bytes come first, then the high ones. The group (0 or 1) of lane l:
int pair_group_of_lane(int l, bool q4) { return q4 ? (l % 8) / 4 : l / 8; }
/// The entry (0 … 63) at byte b of W's unpacked vector.
int pair_entry_at(int b, bool q4) {
  if (!q4) return b;
  const int high = b / 32, in = b % 32;  // in: byte `in` of the pair's 32 (group in / 16)
  return (in / 16) * 32 + high * 16 + in % 16;
}
}  // namespace

/// The rounded rows for the integer GEMV (K a multiple of 64): per row and pair of groups, 192
/// bytes — q (i8) in W's order of the pair's entries (pair_entry_at), −z · Σ q of each group in
/// the first of its lanes (i32 ×16; z = 128 for q8, whose W is read as q + 128, 8 for q4, whose
/// nibbles are q + 8), and each lane's group scale d (f32 ×16). The rounding is
/// emit_round_activations' (round_activations').
void ModuleBuilder::emit_round_activations_in_pairs(int xid, llvm::Value* out, const I& m, const I& k) {
  const bool q4 = gemm_cfg_.q4;
  const I pairs = k / 64;
  auto* vx = llvm::FixedVectorType::get(elem(xid), 32);
  auto* vi = llvm::FixedVectorType::get(i32_, 32);
  nest_parallel({m, pairs}, {}, {}, c64(64 * 8), [&](const Dims& i, const Dims&) {
    llvm::Value* base = b_.CreateGEP(i8_, out, ((i[0] * pairs + i[1]) * 192).v());
    std::vector<llvm::Value*> qs, ds, sums;
    for (int g = 0; g < 2; ++g) {
      llvm::Value* src = b_.CreateGEP(elem(xid), buf(xid), (i[0] * k + i[1] * 64 + g * 32).v());
      const auto [q, d] =
          round_group(b_, ir::from_storage(b_, b_.CreateAlignedLoad(vx, src, llvm::Align(2)), g_.node(xid).dtype));
      llvm::Value* qi = b_.CreateFPToSI(q, vi);
      qs.push_back(b_.CreateTrunc(qi, llvm::FixedVectorType::get(i8_, 32)));
      sums.push_back(zero_correction(b_, qi, q4));
      ds.push_back(d);
    }
    std::vector<int> order;
    for (int b = 0; b < 64; ++b) order.push_back(pair_entry_at(b, q4));
    b_.CreateAlignedStore(b_.CreateShuffleVector(qs[0], qs[1], order), base, llvm::Align(1));
    llvm::Value* corr = llvm::Constant::getNullValue(llvm::FixedVectorType::get(i32_, 16));
    llvm::Value* scale = llvm::PoisonValue::get(llvm::FixedVectorType::get(f32_, 16));
    for (int l = 0; l < 16; ++l) {
      const int g = pair_group_of_lane(l, q4);
      if (l == g * (q4 ? 4 : 8))  // the group's first lane only
        corr = b_.CreateInsertElement(corr, sums[static_cast<std::size_t>(g)], static_cast<std::uint64_t>(l));
      scale = b_.CreateInsertElement(scale, ds[static_cast<std::size_t>(g)], static_cast<std::uint64_t>(l));
    }
    b_.CreateAlignedStore(corr, b_.CreateGEP(i8_, base, c64(64).v()), llvm::Align(4));
    b_.CreateAlignedStore(scale, b_.CreateGEP(i8_, base, c64(128).v()), llvm::Align(4));
  });
}

/// y[r][o] = Σ over pairs of groups of float(Σ u8 · s8) · (W's scale · x's scale) lane by lane,
/// + bias: the pair's 64 entries of W row o in 16 lanes (q8 read as q + 128; q4's nibbles as they
/// are: q + 8), the int32 sums starting at x's −z · Σ q (emit_round_activations_in_pairs). A block
/// of four rows of W against a block of rows of x at a time (1, 2 or, from 3 rows on, 4: a batched
/// decode step has up to kQuantGemvMaxRows): each pair's W entries and scales are loaded (and
/// unpacked) once for the block's rows of x, W's rows stay in L1 across x's row blocks, and the
/// next block's bytes are prefetched (a row is a short stream: 32 cache lines for q8, 16 for q4,
/// which the hardware prefetchers barely start on).
void ModuleBuilder::emit_int8_gemv(llvm::Value* wt, llvm::Value* scales, llvm::Value* xr, llvm::Value* bias_pad,
                                   llvm::Value* y, const I& m, const I& nn, const I& k) {
  const bool q4 = gemm_cfg_.q4;
  constexpr int kOuts = 4;
  const I pairs = k / 64, groups = k / 32;
  auto* v16i = llvm::FixedVectorType::get(i32_, 16);
  auto* v16f = llvm::FixedVectorType::get(f32_, 16);
  auto* v32 = llvm::FixedVectorType::get(i8_, 32);
  auto* v2h = llvm::FixedVectorType::get(b_.getInt16Ty(), 2);
  const I row_bytes = q4 ? k / 2 : k, pair_bytes = c64(q4 ? 32 : 64);  // of W
  std::vector<int> lane_group;
  for (int l = 0; l < 16; ++l) lane_group.push_back(pair_group_of_lane(l, q4));
  // Pair p of W row `row`, prefetching the next block's same bytes: its 64 entries as 16 lanes of
  // four u8 (q8 as q + 128, q4's nibbles as they are: q + 8) and each lane's group scale.
  auto weight_pair = [&](const I& row, const I& p) -> std::pair<llvm::Value*, llvm::Value*> {
    llvm::Value* at = b_.CreateGEP(i8_, wt, (row * row_bytes + p * pair_bytes).v());
    b_.CreateIntrinsic(
        llvm::Intrinsic::prefetch, {ptr_},
        {b_.CreateGEP(i8_, at, (row_bytes * kOuts).v()), b_.getInt32(0), b_.getInt32(3), b_.getInt32(1)});
    llvm::Value* u;
    if (q4) {
      llvm::Value* bytes = b_.CreateAlignedLoad(v32, at, llvm::Align(1));
      llvm::Value* low4 = b_.CreateVectorSplat(32, b_.getInt8(0x0F));
      llvm::Value* lo = b_.CreateAnd(bytes, low4);
      llvm::Value* hi = b_.CreateAnd(b_.CreateLShr(bytes, b_.CreateVectorSplat(32, b_.getInt8(4))), low4);
      u = b_.CreateBitCast(ir::concat(b_, lo, hi), v16i);
    } else {
      u = b_.CreateXor(b_.CreateAlignedLoad(v16i, at, llvm::Align(1)), static_cast<std::uint64_t>(0x80808080u));
    }
    llvm::Value* two = ir::half_to_f32(
        b_,
        b_.CreateAlignedLoad(v2h, b_.CreateGEP(b_.getInt16Ty(), scales, (row * groups + p * 2).v()), llvm::Align(2)),
        /*brain=*/false);
    return {u, b_.CreateShuffleVector(two, lane_group)};
  };
  // acc[i·kOuts + j] over the pairs: W rows `rows` against x rows `xrows`.
  auto dot_block = [&](const std::vector<I>& rows, const std::vector<I>& xrows) {
    std::vector<llvm::Value*> init(rows.size() * xrows.size(), llvm::Constant::getNullValue(v16f));
    return ir::emit_loop(
        b_, c64(0).v(), pairs.v(), 1, init,
        [&](llvm::Value* pv, const std::vector<llvm::Value*>& cur) {
          const I p(b_, pv);
          std::vector<std::pair<llvm::Value*, llvm::Value*>> w;  // (entries, scales) of each W row
          for (const I& row : rows) w.push_back(weight_pair(row, p));
          std::vector<llvm::Value*> next(cur.size());
          for (std::size_t i = 0; i < xrows.size(); ++i) {
            llvm::Value* xb = b_.CreateGEP(i8_, xr, ((xrows[i] * pairs + p) * 192).v());
            llvm::Value* xs = b_.CreateAlignedLoad(v16i, xb, llvm::Align(4));
            llvm::Value* corr = b_.CreateAlignedLoad(v16i, b_.CreateGEP(i8_, xb, c64(64).v()), llvm::Align(4));
            llvm::Value* dx = b_.CreateAlignedLoad(v16f, b_.CreateGEP(i8_, xb, c64(128).v()), llvm::Align(4));
            for (std::size_t j = 0; j < rows.size(); ++j) {
              const std::size_t e = i * rows.size() + j;
              llvm::Value* isum = ir::dot_u8s8(b_, corr, w[j].first, xs);
              next[e] = b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {v16f},
                                           {b_.CreateSIToFP(isum, v16f), b_.CreateFMul(w[j].second, dx), cur[e]});
            }
          }
          return next;
        },
        "int8_gemv_pairs");
  };
  auto blocks_of = [&](const int kXRows) {
    int8_row_blocks(m, nn, k, kOuts, c64(kXRows),
                    [&](const std::vector<I>& rows, const I& o0, const I& end, const I& r0) {
                      std::vector<I> xrows;
                      for (int i = 0; i < kXRows; ++i) xrows.push_back(imin(r0 + i, m - 1));  // past m: not stored
                      const std::vector<llvm::Value*> acc = dot_block(rows, xrows);
                      for (int i = 0; i < kXRows; ++i)
                        for (int j = 0; j < kOuts; ++j)
                          branch(o0 + j < end && r0 + i < m, [&] {
                            llvm::Value* sum = b_.CreateFAddReduce(llvm::ConstantFP::get(f32_, -0.0),
                                                                   acc[static_cast<std::size_t>(i * kOuts + j)]);
                            store(b_.CreateFAdd(sum, load(f32_, bias_pad, o0 + j)), y, (r0 + i) * nn + o0 + j);
                          });
                    });
  };
  branch(m == 1, [&] { blocks_of(1); }, [&] { branch(m == 2, [&] { blocks_of(2); }, [&] { blocks_of(4); }); });
}

/// The rounded rows for the batched integer GEMV (K whole groups): x's rows in panels of `lanes`
/// rows, per panel P and group g a block of (group + 8) · lanes bytes at (P · G + g) — the group's
/// words of four q (i8) as [group / 4][lanes] 32-bit words, −z · Σ q of each row (i32 ×lanes; z as
/// for emit_round_activations_in_pairs) and each row's scale d (f32 ×lanes). Rows past m are
/// zeros. ceil(m / lanes) · lanes · (group + 8) ≤ m · group · 4 bytes a group for m > kGemvMaxRows
/// and groups of 32 or more: the rounded rows' block holds them.
void ModuleBuilder::emit_round_activations_in_panels(int xid, llvm::Value* out, const I& m, const I& k) {
  const int lanes = gemm_cfg_.lanes;
  const std::int64_t group = gemm_cfg_.quant_group, words = group / 4;
  const I groups = k / group;
  auto* vx = llvm::FixedVectorType::get(elem(xid), static_cast<unsigned>(group));
  auto* vi = llvm::FixedVectorType::get(i32_, static_cast<unsigned>(group));
  auto* vw = llvm::FixedVectorType::get(i32_, static_cast<unsigned>(words));
  nest_parallel({ceil_div(m, lanes), groups}, {}, {}, c64(group * 8), [&](const Dims& i, const Dims&) {
    llvm::Value* base = b_.CreateGEP(i8_, out, ((i[0] * groups + i[1]) * ((group + 8) * lanes)).v());
    loop(
        c64(0), c64(lanes),
        [&](I r) {
          const I row = i[0] * lanes + r;
          auto put_row = [&](llvm::Value* qwords, llvm::Value* corr, llvm::Value* d) {
            for (std::int64_t w = 0; w < words; ++w)
              store(b_.CreateExtractElement(qwords, static_cast<std::uint64_t>(w)), base, r + w * lanes);
            store(corr, base, r + words * lanes);
            store(d, b_.CreateGEP(i32_, base, c64((words + 1) * lanes).v()), r);
          };
          branch(
              row < m,
              [&] {
                llvm::Value* src = b_.CreateGEP(elem(xid), buf(xid), (row * k + i[1] * group).v());
                const auto [q, d] = round_group(
                    b_, ir::from_storage(b_, b_.CreateAlignedLoad(vx, src, llvm::Align(2)), g_.node(xid).dtype));
                llvm::Value* qi = b_.CreateFPToSI(q, vi);
                llvm::Value* bytes = b_.CreateTrunc(qi, llvm::FixedVectorType::get(i8_, static_cast<unsigned>(group)));
                put_row(b_.CreateBitCast(bytes, vw), zero_correction(b_, qi, gemm_cfg_.q4), d);
              },
              [&] { put_row(llvm::Constant::getNullValue(vw), b_.getInt32(0), llvm::ConstantFP::get(f32_, 0.0)); });
        },
        "panel_rows");
  });
}

/// y[r][o] for a batch of rows (kGemvMaxRows < m ≤ kQuantGemvMaxRows): W's rows read in place, a
/// block of kOuts at a time, against each panel of x's rows (emit_round_activations_in_panels) —
/// a 32-bit word of W (four u8: q8 as q + 128, q4's nibbles as they are, q + 8) broadcast to
/// every lane, each lane a row of x: int32 sums start at the panel's −z · Σ q and take four
/// products a lane an instruction; once a group, acc += float(sum) · x's scales · W's scale. Rows
/// of x run in the lanes, so a group costs one conversion and one scaling per W row for `lanes`
/// rows of x (the GEMV of emit_int8_gemv: one per row of x and 64 entries).
void ModuleBuilder::emit_int8_gemv_panels(llvm::Value* wt, llvm::Value* scales, llvm::Value* xr, llvm::Value* bias_pad,
                                          llvm::Value* y, const I& m, const I& nn, const I& k) {
  const bool q4 = gemm_cfg_.q4;
  const int lanes = gemm_cfg_.lanes;
  constexpr int kOuts = 4;
  const std::int64_t group = gemm_cfg_.quant_group, words = group / 4, block_bytes = (group + 8) * lanes;
  const I groups = k / group, row_bytes = q4 ? k / 2 : k;
  const std::int64_t group_bytes = q4 ? group / 2 : group;  // of a row of W
  auto* vi = llvm::FixedVectorType::get(i32_, static_cast<unsigned>(lanes));
  auto* vf = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(lanes));
  auto splat32 = [&](std::uint32_t v) { return b_.CreateVectorSplat(static_cast<unsigned>(lanes), b_.getInt32(v)); };
  std::vector<llvm::Constant*> iota;
  for (int l = 0; l < lanes; ++l) iota.push_back(b_.getInt64(static_cast<std::uint64_t>(l)));
  int8_row_blocks(m, nn, k, kOuts, c64(lanes), [&](const std::vector<I>& rows, const I& o0, const I& end, const I& x0) {
    const I p = x0 / lanes;
    std::vector<llvm::Value*> init(kOuts, llvm::Constant::getNullValue(vf));
    const std::vector<llvm::Value*> acc = ir::emit_loop(
        b_, c64(0).v(), groups.v(), 1, init,
        [&](llvm::Value* gv, const std::vector<llvm::Value*>& cur) {
          const I g(b_, gv);
          llvm::Value* xb = b_.CreateGEP(i8_, xr, ((p * groups + g) * block_bytes).v());
          auto x_at = [&](llvm::Type* t, std::int64_t word) {
            return b_.CreateAlignedLoad(t, b_.CreateGEP(i32_, xb, c64(word * lanes).v()), llvm::Align(4));
          };
          llvm::Value* dx = x_at(vf, words + 1);
          std::vector<llvm::Value*> next(kOuts);
          for (int j = 0; j < kOuts; ++j) {
            const I& row = rows[static_cast<std::size_t>(j)];
            llvm::Value* w_at = b_.CreateGEP(i8_, wt, (row * row_bytes + g * group_bytes).v());
            auto w_word = [&](std::int64_t d) {
              return b_.CreateVectorSplat(
                  static_cast<unsigned>(lanes),
                  b_.CreateAlignedLoad(i32_, b_.CreateGEP(i32_, w_at, c64(d).v()), llvm::Align(1)));
            };
            llvm::Value* sum = x_at(vi, words);
            if (q4) {  // byte d of the group: entries d (low four bits) and d + group / 2
              for (std::int64_t d = 0; d < words / 2; ++d) {
                llvm::Value* raw = w_word(d);
                sum = ir::dot_u8s8(b_, sum, b_.CreateAnd(raw, splat32(0x0F0F0F0Fu)), x_at(vi, d));
                sum = ir::dot_u8s8(b_, sum, b_.CreateAnd(b_.CreateLShr(raw, splat32(4)), splat32(0x0F0F0F0Fu)),
                                   x_at(vi, d + words / 2));
              }
            } else {
              for (std::int64_t d = 0; d < words; ++d)
                sum = ir::dot_u8s8(b_, sum, b_.CreateXor(w_word(d), splat32(0x80808080u)), x_at(vi, d));
            }
            llvm::Value* dw = ir::half_to_f32(b_, load(b_.getInt16Ty(), scales, row * groups + g), false);
            next[static_cast<std::size_t>(j)] = b_.CreateIntrinsic(
                llvm::Intrinsic::fmuladd, {vf},
                {b_.CreateSIToFP(sum, vf), b_.CreateFMul(dx, b_.CreateVectorSplat(static_cast<unsigned>(lanes), dw)),
                 cur[static_cast<std::size_t>(j)]});
          }
          return next;
        },
        "panel_groups");
    llvm::Value* live = ir::lanes_below(b_, lanes, (m - p * lanes).v());
    llvm::Value* first = b_.CreateVectorSplat(static_cast<unsigned>(lanes), (p * lanes).v());
    llvm::Value* x_rows = b_.CreateAdd(first, llvm::ConstantVector::get(iota));
    for (int j = 0; j < kOuts; ++j)
      branch(o0 + j < end, [&] {
        llvm::Value* at = b_.CreateAdd(b_.CreateMul(x_rows, b_.CreateVectorSplat(static_cast<unsigned>(lanes), nn.v())),
                                       b_.CreateVectorSplat(static_cast<unsigned>(lanes), (o0 + j).v()));
        llvm::Value* bias = b_.CreateVectorSplat(static_cast<unsigned>(lanes), load(f32_, bias_pad, o0 + j));
        b_.CreateMaskedScatter(b_.CreateFAdd(acc[static_cast<std::size_t>(j)], bias), b_.CreateGEP(f32_, y, at),
                               llvm::Align(4), live);
      });
  });
}

/// block(W's rows, o0, end, x0) for each block of `outs` rows of W from o0 (rows past the task's
/// `end` repeat its last: not stored) in each task's range of W's rows, and under it each block of
/// x's rows from x0 = 0, x_step, … < m (W's block stays in L1 across x's).
void ModuleBuilder::int8_row_blocks(const I& m, const I& nn, const I& k, int outs, const I& x_step,
                                    const RowBlock& block) {
  parallel_ranges(nn, 64, outs, m * k * 2, [&](I begin, I end) {
    loop(
        c64(0), ceil_div(end - begin, outs),
        [&](I blk) {
          const I o0 = begin + blk * outs;
          std::vector<I> rows;
          for (int j = 0; j < outs; ++j) rows.push_back(imin(o0 + j, end - 1));
          loop(c64(0), ceil_div(m, x_step), [&](I xb) { block(rows, o0, end, xb * x_step); }, "int8_x_rows");
        },
        "int8_w_rows");
  });
}

/// gemm_panel_bytes' int8_dot panels from q (q8, or q4's nibbles) and its f16 scales: per row of
/// W and group, the group's entries as words of four K, its scale widened, −128 · Σ of its
/// entries. The last panel's rows past N are zeros. Whole panels and whole groups go `lanes` rows
/// × `lanes` words at a time (a group's words are a whole fraction of a vector): the rows loaded
/// as vectors, transposed in registers (ir::transpose_square), each word of the group stored as
/// one vector of columns and summed by vpdpbusd against ones; the rest row by row and group by group.
void ModuleBuilder::emit_pack_int8_panels(llvm::Value* wt, llvm::Value* packed, const I& nn, const I& k,
                                          llvm::Value* scales) {
  const int lanes = gemm_cfg_.lanes;
  const std::int64_t nr = gemm_cfg_.cols(), group = gemm_cfg_.quant_group, group_bytes = nr * (group + 8);
  const std::int64_t words = group / 4;  // a group's words of four entries
  const I groups = ceil_div(k, group), panel = groups * group_bytes, full = nn / nr;
  branch(nn % nr != 0, [&] { memset0(b_.CreateGEP(i8_, packed, (full * panel).v()), panel); });
  auto* vb = llvm::FixedVectorType::get(i8_, static_cast<unsigned>(group));
  auto* vi = llvm::FixedVectorType::get(i32_, static_cast<unsigned>(lanes));
  // Entries [k0, k0 + group) of W's row (0 past K), as i8.
  auto entries = [&](const I& row, const I& g) -> llvm::Value* {
    if (gemm_cfg_.q4) {  // K whole groups: byte j of the group holds entries j and j + group / 2
      auto* half = llvm::FixedVectorType::get(i8_, static_cast<unsigned>(group / 2));
      llvm::Value* bytes =
          b_.CreateAlignedLoad(half, b_.CreateGEP(i8_, wt, (row * (k / 2) + g * (group / 2)).v()), llvm::Align(1));
      return ir::concat(b_, ir::q4_nibbles(b_, bytes, b_.getFalse(), /*centered=*/true),
                        ir::q4_nibbles(b_, bytes, b_.getTrue(), /*centered=*/true));
    }
    llvm::Value* valid = ir::lanes_below(b_, static_cast<int>(group), (k - g * group).v());
    return b_.CreateMaskedLoad(vb, b_.CreateGEP(i8_, wt, (row * k + g * group).v()), llvm::Align(1), valid,
                               llvm::Constant::getNullValue(vb));
  };
  auto block = [&](const I& p, const I& g) { return b_.CreateGEP(i8_, packed, ((p * groups + g) * group_bytes).v()); };
  auto scale = [&](const I& row, const I& g) {
    return ir::half_to_f32(b_, load(b_.getInt16Ty(), scales, row * groups + g), /*brain=*/false);
  };
  I gdone = c64(0);
  if (lanes % words == 0 && nr % lanes == 0) {
    const std::int64_t per = lanes / words;  // groups a block of `lanes` words
    const I blocks = k / group / per;
    gdone = blocks * per;
    llvm::Value* ones = b_.CreateVectorSplat(static_cast<unsigned>(lanes), b_.getInt32(0x01010101));
    nest_parallel({full, c64(nr / lanes), blocks}, {}, {}, c64(lanes * lanes * 4), [&](const Dims& i, const Dims&) {
      const I row0 = i[0] * nr + i[1] * lanes, g0 = i[2] * per;
      std::vector<llvm::Value*> rows;
      for (int j = 0; j < lanes; ++j) {
        llvm::Value* v = entries(row0 + j, g0);
        for (std::int64_t t = 1; t < per; ++t) v = ir::concat(b_, v, entries(row0 + j, g0 + t));
        rows.push_back(b_.CreateBitCast(v, vi));
      }
      rows = ir::transpose_square(b_, std::move(rows));  // rows[w]: word w of each row
      for (std::int64_t t = 0; t < per; ++t) {
        llvm::Value* blk = block(i[0], g0 + t);
        llvm::Value* sum = llvm::Constant::getNullValue(vi);
        for (std::int64_t kq = 0; kq < words; ++kq) {
          llvm::Value* w = rows[static_cast<std::size_t>(t * words + kq)];
          b_.CreateAlignedStore(w, b_.CreateGEP(i32_, blk, (i[1] * lanes + kq * nr).v()), llvm::Align(4));
          sum = ir::dot_u8s8(b_, sum, ones, w);
        }
        llvm::Value* s = llvm::PoisonValue::get(llvm::FixedVectorType::get(f32_, static_cast<unsigned>(lanes)));
        for (int j = 0; j < lanes; ++j)
          s = b_.CreateInsertElement(s, scale(row0 + j, g0 + t), static_cast<std::uint64_t>(j));
        b_.CreateAlignedStore(s, b_.CreateGEP(f32_, blk, (i[1] * lanes + words * nr).v()), llvm::Align(4));
        b_.CreateAlignedStore(b_.CreateMul(sum, b_.CreateVectorSplat(static_cast<unsigned>(lanes), b_.getInt32(-128))),
                              b_.CreateGEP(i32_, blk, (i[1] * lanes + (words + 1) * nr).v()), llvm::Align(4));
      }
    });
  }
  // One row's group at a time: the groups past gdone of the whole panels, every group of the rest.
  auto one = [&](const I& row, const I& g) {
    llvm::Value* q = entries(row, g);
    llvm::Value* blk = block(row / nr, g);
    const I r = row % nr;
    llvm::Value* w = b_.CreateBitCast(q, llvm::FixedVectorType::get(i32_, static_cast<unsigned>(words)));
    for (std::int64_t kq = 0; kq < words; ++kq)
      store(b_.CreateExtractElement(w, static_cast<std::uint64_t>(kq)), blk, r + kq * nr);
    llvm::Value* sum =
        b_.CreateAddReduce(b_.CreateSExt(q, llvm::FixedVectorType::get(i32_, static_cast<unsigned>(group))));
    store(scale(row, g), blk, r + words * nr);
    store(b_.CreateMul(sum, b_.getInt32(-128)), blk, r + (words + 1) * nr);
  };
  nest_parallel({full * nr, groups - gdone}, {}, {}, c64(group * 2),
                [&](const Dims& i, const Dims&) { one(i[0], gdone + i[1]); });
  nest_parallel({nn - full * nr, groups}, {}, {}, c64(group * 2),
                [&](const Dims& i, const Dims&) { one(full * nr + i[0], i[1]); });
}

}  // namespace qkv::codegen::cpu::detail
