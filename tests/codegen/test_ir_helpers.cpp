// The IR building blocks of the CPU kernels, JIT-compiled on their own: the vector exp/exp2
// against libm in double, the Philox4x32-10 / dropout-keep IR against runtime/src/rng.cpp, and the
// register transpose.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <qkv/codegen/cpu/tuning.hpp>
#include <qkv/codegen/jit.hpp>
#include <qkv/runtime/rng.hpp>

#include "llvm/ir_util.hpp"
#include "llvm/philox_ir.hpp"
#include "llvm/vector_math.hpp"

namespace qkv::codegen {
namespace {

constexpr unsigned kLanes = 16;

Jit& jit() {
  static std::unique_ptr<Jit> j = [] {
    std::string error;
    auto made = Jit::create(&error);
    if (!made) ADD_FAILURE() << error;
    return made;
  }();
  return *j;
}

/// A module with `void name(const T* in, U* out, i64 n)` applying `body` to <16 x T> chunks.
template <class Body>
void* compile_map(const std::string& name, llvm::Type* (*in_elem)(llvm::LLVMContext&),
                  llvm::Type* (*out_elem)(llvm::LLVMContext&), Body body) {
  auto ctx = std::make_unique<llvm::LLVMContext>();
  auto mod = std::make_unique<llvm::Module>(name, *ctx);
  llvm::IRBuilder<> b(*ctx);
  auto* ptr = b.getPtrTy();
  auto* fn =
      llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), {ptr, ptr, b.getInt64Ty(), b.getInt64Ty()}, false),
                             llvm::GlobalValue::ExternalLinkage, name, *mod);
  b.SetInsertPoint(llvm::BasicBlock::Create(*ctx, "entry", fn));
  llvm::Type* vin = llvm::FixedVectorType::get(in_elem(*ctx), kLanes);
  cpu::ir::emit_loop(
      b, b.getInt64(0), fn->getArg(2), kLanes,
      [&](llvm::Value* i) {
        llvm::Value* x = b.CreateAlignedLoad(vin, b.CreateGEP(in_elem(*ctx), fn->getArg(0), i), llvm::Align(4));
        llvm::Value* y = body(b, x, fn->getArg(3), i);
        b.CreateAlignedStore(y, b.CreateGEP(out_elem(*ctx), fn->getArg(1), i), llvm::Align(4));
      },
      "map");
  b.CreateRetVoid();
  std::string error;
  EXPECT_TRUE(jit().add(std::move(mod), std::move(ctx), &error)) << error;
  void* f = jit().lookup_address(name, &error);
  EXPECT_NE(f, nullptr) << error;
  return f;
}

llvm::Type* f32_type(llvm::LLVMContext& c) { return llvm::Type::getFloatTy(c); }
llvm::Type* i32_type(llvm::LLVMContext& c) { return llvm::Type::getInt32Ty(c); }

using MapFn = void(const void* in, void* out, std::int64_t n, std::int64_t extra);

std::vector<float> sample_inputs(float lo, float hi, std::size_t n) {
  std::vector<float> x(n);
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (auto& v : x) v = dist(gen);
  return x;
}

double max_rel_error(const std::vector<float>& x, const std::vector<float>& y, double (*ref)(double), double min_ref) {
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = ref(x[i]);
    if (!(want >= min_ref && want <= std::numeric_limits<float>::max())) continue;  // normal f32 results only
    worst = std::max(worst, std::abs(y[i] - want) / want);
  }
  return worst;
}

TEST(VectorMath, Exp2IsAccurateAndMapsMinusInfinityToZero) {
  auto* f = reinterpret_cast<MapFn*>(compile_map(
      "test_exp2", f32_type, f32_type,
      [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value*, llvm::Value*) { return cpu::emit_exp2(b, x); }));
  ASSERT_NE(f, nullptr);
  std::vector<float> x = sample_inputs(-126.0f, 127.0f, 1 << 16);
  const float specials[] = {-std::numeric_limits<float>::infinity(),
                            -1000.0f,
                            -127.5f,
                            0.0f,
                            -0.5f,
                            0.5f,
                            1.0f,
                            128.0f,
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -0.0f,
                            3.0f,
                            -3.0f,
                            10.0f,
                            -10.0f,
                            0.25f};
  std::copy(std::begin(specials), std::end(specials), x.begin());
  std::vector<float> y(x.size());
  f(x.data(), y.data(), static_cast<std::int64_t>(x.size()), 0);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_FLOAT_EQ(y[3], 1.0f);
  EXPECT_EQ(y[7], std::numeric_limits<float>::infinity());
  EXPECT_EQ(y[8], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(y[9]));
  EXPECT_EQ(y[11], 8.0f);
  const double err = max_rel_error(x, y, [](double v) { return std::exp2(v); }, 1.2e-38);
  EXPECT_LT(err, 3e-7);
  RecordProperty("exp2_max_rel_error", std::to_string(err));
}

TEST(VectorMath, Exp2ByScalefGivesExp2sValues) {
  // The fused attention's exponentials on AVX-512 (vrndscaleps + vscalefps): bit for bit the
  // portable form's values on the normal range, −inf to +0, NaN kept.
  if (!cpu::has_feature(jit().target(), "+avx512f")) GTEST_SKIP() << "the host has no AVX-512";
  auto* scalef = reinterpret_cast<MapFn*>(compile_map(
      "test_exp2_scalef", f32_type, f32_type,
      [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value*, llvm::Value*) { return cpu::emit_exp2_scalef(b, x); }));
  auto* portable = reinterpret_cast<MapFn*>(compile_map(
      "test_exp2_portable", f32_type, f32_type,
      [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value*, llvm::Value*) { return cpu::emit_exp2(b, x); }));
  ASSERT_NE(scalef, nullptr);
  ASSERT_NE(portable, nullptr);
  std::vector<float> x = sample_inputs(-126.0f, 127.0f, 1 << 16);
  for (int k = 0; k < 4096; ++k) x[static_cast<std::size_t>(k)] = -static_cast<float>(k) / 64.0f;  // a softmax's range
  const float specials[] = {-std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -1000.0f,
                            128.0f,
                            std::numeric_limits<float>::infinity(),
                            0.0f,
                            -0.0f,
                            -160.0f};
  std::copy(std::begin(specials), std::end(specials), x.end() - std::size(specials));
  std::vector<float> got(x.size()), want(x.size());
  scalef(x.data(), got.data(), static_cast<std::int64_t>(x.size()), 0);
  portable(x.data(), want.data(), static_cast<std::int64_t>(x.size()), 0);
  int compared = 0;
  for (std::size_t i = 0; i + std::size(specials) < x.size(); ++i) {
    if (x[i] < -126.0f) continue;  // a denormal result: flushed only under FTZ
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i])) << "2^" << x[i];
    ++compared;
  }
  EXPECT_GT(compared, 60000);
  const float* s = got.data() + x.size() - std::size(specials);
  EXPECT_EQ(s[0], 0.0f);
  EXPECT_TRUE(std::isnan(s[1]));
  EXPECT_EQ(s[2], 0.0f);
  EXPECT_EQ(s[3], std::numeric_limits<float>::infinity());
  EXPECT_EQ(s[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(s[5], 1.0f);
  EXPECT_EQ(s[6], 1.0f);
  EXPECT_EQ(s[7], 0.0f);
}

TEST(VectorMath, Exp2ForBf16IsWithinItsBoundOnASoftmaxsRange) {
  // The degree-3 form the bf16 attention uses for P: relative error <= 7.5e-5 against exp2 in
  // double over x <= 0 down to 2^-126, a quarter of bf16's rounding step; −inf to +0, NaN kept.
  if (!cpu::has_feature(jit().target(), "+avx512f")) GTEST_SKIP() << "the host has no AVX-512";
  auto* f = reinterpret_cast<MapFn*>(compile_map("test_exp2_bf16", f32_type, f32_type,
                                                 [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value*, llvm::Value*) {
                                                   return cpu::emit_exp2_scalef(b, x, true);
                                                 }));
  ASSERT_NE(f, nullptr);
  std::vector<float> x = sample_inputs(-126.0f, 0.0f, 1 << 16);
  x[0] = -std::numeric_limits<float>::infinity();
  x[1] = std::numeric_limits<float>::quiet_NaN();
  x[2] = -1000.0f;
  std::vector<float> y(x.size());
  f(x.data(), y.data(), static_cast<std::int64_t>(x.size()), 0);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_EQ(y[2], 0.0f);
  const std::vector<float> finite(x.begin() + 3, x.end()), got(y.begin() + 3, y.end());
  const double err = max_rel_error(finite, got, [](double v) { return std::exp2(v); }, 1.2e-38);
  EXPECT_LT(err, 7.6e-5);
  EXPECT_GT(err, 1e-6);  // it is the short polynomial, not the full one
  RecordProperty("exp2_bf16_max_rel_error", std::to_string(err));
}

TEST(VectorMath, ExpIsAccurateAndMapsMinusInfinityToZero) {
  auto* f = reinterpret_cast<MapFn*>(compile_map(
      "test_exp", f32_type, f32_type,
      [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value*, llvm::Value*) { return cpu::emit_exp(b, x); }));
  ASSERT_NE(f, nullptr);
  std::vector<float> x = sample_inputs(-87.0f, 88.0f, 1 << 16);
  x[0] = -std::numeric_limits<float>::infinity();
  x[1] = std::numeric_limits<float>::quiet_NaN();
  x[2] = 0.0f;
  x[3] = 1.0f;
  x[4] = 100.0f;
  std::vector<float> y(x.size());
  f(x.data(), y.data(), static_cast<std::int64_t>(x.size()), 0);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_FLOAT_EQ(y[2], 1.0f);
  EXPECT_NEAR(y[3], std::exp(1.0), 3e-7 * std::exp(1.0));
  EXPECT_EQ(y[4], std::numeric_limits<float>::infinity());
  x[1] = 0.0f;  // NaN checked above
  const double err = max_rel_error(x, y, [](double v) { return std::exp(v); }, 1.2e-38);
  EXPECT_LT(err, 3e-7);
  RecordProperty("exp_max_rel_error", std::to_string(err));
}

TEST(VectorMath, Log2IsAccurateOverTheWholeRange) {
  // No library call (the AOT objects need no libm). Absolute error near 1 (where log2 is ~0),
  // relative elsewhere; denormals, 0, +inf, negatives and NaN by their rules.
  auto* f = reinterpret_cast<MapFn*>(compile_map(
      "test_log2", f32_type, f32_type,
      [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value*, llvm::Value*) { return cpu::emit_log2(b, x); }));
  ASSERT_NE(f, nullptr);
  std::vector<float> x;
  for (int k = 0; k < (1 << 16); ++k)
    x.push_back(std::ldexp(1.0f + static_cast<float>(k) / (1 << 16), (k % 250) - 125));
  for (int k = 0; k < 4096; ++k) x.push_back(0.5f + static_cast<float>(k) / 4096.0f);  // around 1
  x.push_back(1e-40f);                                                                 // denormal
  x.push_back(std::numeric_limits<float>::denorm_min());
  const std::size_t specials = x.size();
  x.push_back(0.0f);
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(-1.0f);
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  x.resize((x.size() + kLanes - 1) / kLanes * kLanes, 1.0f);  // whole vectors
  std::vector<float> y(x.size());
  f(x.data(), y.data(), static_cast<std::int64_t>(x.size()), 0);
  double err = 0;
  for (std::size_t i = 0; i < specials; ++i) {
    const double want = std::log2(static_cast<double>(x[i]));
    err = std::max(err, std::abs(y[i] - want) / std::max(1.0, std::abs(want)));
  }
  EXPECT_LT(err, 2.5e-7);
  EXPECT_EQ(y[specials], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(y[specials + 1], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(y[specials + 2]));
  EXPECT_TRUE(std::isnan(y[specials + 3]));
  EXPECT_EQ(y[1 << 16], -1.0f);  // log2 0.5, exactly
  RecordProperty("log2_max_error", std::to_string(err));
}

TEST(PhiloxIr, MatchesTheRuntimeGeneratorBitForBit) {
  // out[i] = word 0 of philox((row = in[i], col = i, head = 5, batch = 2), key) — lanes vary in
  // two words, as in the kernel (rows per lane); the full block is checked through word 0..3.
  for (int word = 0; word < 4; ++word) {
    const std::string name = "test_philox_" + std::to_string(word);
    auto* f = reinterpret_cast<MapFn*>(compile_map(
        name, i32_type, i32_type, [word](llvm::IRBuilder<>& b, llvm::Value* rows, llvm::Value* key, llvm::Value* i) {
          std::vector<llvm::Constant*> iota;
          for (unsigned l = 0; l < kLanes; ++l) iota.push_back(b.getInt32(l));
          llvm::Value* cols = b.CreateAdd(b.CreateVectorSplat(kLanes, b.CreateTrunc(i, b.getInt32Ty())),
                                          llvm::ConstantVector::get(iota));
          const auto out = cpu::emit_philox4x32(
              b, {rows, cols, b.CreateVectorSplat(kLanes, b.getInt32(5)), b.CreateVectorSplat(kLanes, b.getInt32(2))},
              key);
          return out[static_cast<std::size_t>(word)];
        }));
    ASSERT_NE(f, nullptr);
    std::vector<std::uint32_t> rows(4096), got(rows.size());
    std::mt19937 gen(11);
    for (auto& r : rows) r = gen();
    const std::uint64_t key = 0x0123456789abcdefull;
    f(rows.data(), got.data(), static_cast<std::int64_t>(rows.size()), static_cast<std::int64_t>(key));
    std::size_t differ = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto want = philox4x32({rows[i], static_cast<std::uint32_t>(i), 5u, 2u}, key);
      differ += got[i] != want[static_cast<std::size_t>(word)];
    }
    EXPECT_EQ(differ, 0u) << "word " << word;
  }
}

TEST(PhiloxIr, DropoutKeepMatchesTheRuntime) {
  for (double p : {0.0, 1e-7, 0.1, 0.3, 0.5, 0.999}) {
    const std::string name = "test_keep_" + std::to_string(static_cast<int>(p * 1e7));
    auto* f = reinterpret_cast<MapFn*>(compile_map(
        name, i32_type, i32_type, [p](llvm::IRBuilder<>& b, llvm::Value* rows, llvm::Value* seed, llvm::Value* i) {
          llvm::Value* keep =
              cpu::emit_dropout_keep(b, p, seed, b.getInt32(1), b.getInt32(3), rows, b.CreateTrunc(i, b.getInt32Ty()));
          return b.CreateZExt(keep, llvm::FixedVectorType::get(b.getInt32Ty(), kLanes));
        }));
    ASSERT_NE(f, nullptr);
    std::vector<std::uint32_t> rows(1 << 14), got(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::uint32_t>(i * 7);
    const std::uint64_t seed = 987654321;
    f(rows.data(), got.data(), static_cast<std::int64_t>(rows.size()), static_cast<std::int64_t>(seed));
    std::size_t differ = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      // col = the chunk's first index (a scalar column per 16 lanes, as a key in the kernel)
      const auto col = static_cast<std::uint32_t>(i / kLanes * kLanes);
      differ += (got[i] != 0) != dropout_keep(p, seed, 1, 3, rows[i], col);
    }
    EXPECT_EQ(differ, 0u) << "p = " << p;
  }
}

TEST(IrUtil, TransposeSquareTransposesBlocksOfEveryVectorWidth) {
  // The attention kernel packs Qᵀ and stores O through it: a wrong stage would swap features or
  // rows there. Here each width on its own, against the transpose of distinct values.
  for (int n : {2, 4, 8, 16}) {
    auto ctx = std::make_unique<llvm::LLVMContext>();
    const std::string name = "transpose_" + std::to_string(n);
    auto mod = std::make_unique<llvm::Module>(name, *ctx);
    llvm::IRBuilder<> b(*ctx);
    auto* ptr = b.getPtrTy();
    auto* fn = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), {ptr, ptr}, false),
                                      llvm::GlobalValue::ExternalLinkage, name, *mod);
    b.SetInsertPoint(llvm::BasicBlock::Create(*ctx, "entry", fn));
    llvm::Type* row_t = llvm::FixedVectorType::get(b.getInt32Ty(), static_cast<unsigned>(n));
    std::vector<llvm::Value*> rows;
    for (int r = 0; r < n; ++r)
      rows.push_back(
          b.CreateAlignedLoad(row_t, b.CreateConstGEP1_64(b.getInt32Ty(), fn->getArg(0), r * n), llvm::Align(4)));
    rows = cpu::ir::transpose_square(b, std::move(rows));
    for (int r = 0; r < n; ++r)
      b.CreateAlignedStore(rows[static_cast<std::size_t>(r)],
                           b.CreateConstGEP1_64(b.getInt32Ty(), fn->getArg(1), r * n), llvm::Align(4));
    b.CreateRetVoid();
    std::string error;
    ASSERT_TRUE(jit().add(std::move(mod), std::move(ctx), &error)) << error;
    auto* f = reinterpret_cast<void (*)(const std::int32_t*, std::int32_t*)>(jit().lookup_address(name, &error));
    ASSERT_NE(f, nullptr) << error;
    std::vector<std::int32_t> in(static_cast<std::size_t>(n * n)), out(in.size(), -1);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::int32_t>(1000 + 7 * i);
    f(in.data(), out.data());
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < n; ++c)
        EXPECT_EQ(out[static_cast<std::size_t>(r * n + c)], in[static_cast<std::size_t>(c * n + r)])
            << n << " x " << n << ": row " << r << ", lane " << c;
  }
}

TEST(JitApi, MissingSymbolIsAnErrorNotAnExit) {
  std::string error;
  EXPECT_EQ(jit().lookup_address("no_such_kernel", &error), nullptr);
  EXPECT_NE(error.find("no_such_kernel"), std::string::npos) << error;
}

TEST(JitApi, ModuleThatDoesNotVerifyIsRejected) {
  auto ctx = std::make_unique<llvm::LLVMContext>();
  auto mod = std::make_unique<llvm::Module>("broken", *ctx);
  llvm::IRBuilder<> b(*ctx);
  auto* fn = llvm::Function::Create(llvm::FunctionType::get(b.getInt32Ty(), false), llvm::GlobalValue::ExternalLinkage,
                                    "broken", *mod);
  b.SetInsertPoint(llvm::BasicBlock::Create(*ctx, "entry", fn));
  b.CreateRetVoid();  // wrong return type
  std::string error;
  EXPECT_FALSE(jit().add(std::move(mod), std::move(ctx), &error));
  EXPECT_NE(error.find("does not verify"), std::string::npos) << error;
}

TEST(JitApi, TargetIsTheHost) {
  EXPECT_EQ(jit().target().cpu, host_target().cpu);
  EXPECT_NE(jit().target_key().find(host_target().cpu), std::string::npos);
}

}  // namespace
}  // namespace qkv::codegen
