// The JIT'd row-wise / elementwise kernels of rowwise.hpp: their IR generator, the (one per
// process and target) JIT that holds them, and the drivers that split calls on the thread pool.
//
// One module, five functions over [begin, end) of rows or elements:
//
//   void qkv_layer_norm(const float* x, const float* gamma, const float* beta, float* y,
//                       i64 n, float eps, i64 r0, i64 r1)
//     per row: Σx (vector accumulator + scalar tail) → mean; Σ(x − mean)² → var;
//              y = (x − mean)·(1/sqrt(var + eps))·gamma + beta
//   void qkv_gelu(const float* x, float* y, i64 i0, i64 i1)
//   void qkv_relu(const float* x, float* y, i64 i0, i64 i1)
//   void qkv_silu(const float* x, float* y, i64 i0, i64 i1)
//   void qkv_add(const float* a, const float* b, float* y, i64 i0, i64 i1)
//
// Every loop is a host-width vector loop over whole vectors followed by a scalar loop over the
// rest; the element functions are written once on a `float` or `<N x float>` type. The same five
// are emitted per storage dtype (rowwise_kernel_name: `qkv_gelu_bf16`, …), their pointers then
// to uint16_t bits: loads widen to f32, stores round once, the arithmetic is the same.
#include <qkv/codegen/cpu/rowwise.hpp>

#include <algorithm>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <qkv/codegen/jit.hpp>
#include <qkv/codegen/lowering/storage.hpp>

#include "cpu/kernels/rowwise_kernel.hpp"
#include "cpu/thread_pool.hpp"
#include "llvm/ir_util.hpp"
#include "llvm/vector_math.hpp"

namespace qkv::codegen::cpu {

namespace {

using LayerNormFn = void(const float*, const float*, const float*, float*, std::int64_t, float, std::int64_t,
                         std::int64_t);
using UnaryFn = void(const float*, float*, std::int64_t, std::int64_t);
using BinaryFn = void(const float*, const float*, float*, std::int64_t, std::int64_t);

class RowwiseEmitter {
 public:
  RowwiseEmitter(llvm::Module& module, const HostTarget& host, DType storage)
      : module_(module), ctx_(module.getContext()), b_(ctx_), host_(host), storage_(storage) {
    lanes_ = std::max(host.vector_floats, 4);
    f32_ = b_.getFloatTy();
    half_ = storage == DType::f16 || storage == DType::bf16;
    elem_ = half_ ? static_cast<llvm::Type*>(b_.getInt16Ty()) : f32_;
    i64_ = b_.getInt64Ty();
    ptr_ = b_.getPtrTy();
    vf_ = llvm::FixedVectorType::get(f32_, static_cast<unsigned>(lanes_));
    features_ = joined_features(host);
  }

  void emit_all() {
    emit_layer_norm();
    emit_unary("qkv_gelu", [this](llvm::Value* x) { return gelu(x); });
    emit_unary("qkv_silu", [this](llvm::Value* x) {
      // x / (1 + e^−x); e^−x = +inf (x below about −88, −inf included) gives −0, the limit.
      llvm::Type* t = x->getType();
      llvm::Value* e = emit_exp(b_, b_.CreateFNeg(x));
      llvm::Value* y = b_.CreateFDiv(x, b_.CreateFAdd(e, fc(t, 1.0)));
      return b_.CreateSelect(b_.CreateFCmpOEQ(e, fc(t, std::numeric_limits<double>::infinity())), fc(t, -0.0), y);
    });
    emit_unary("qkv_relu", [this](llvm::Value* x) {
      // x > 0 or NaN (unordered) keeps x; everything else (−0 included) becomes +0.
      return b_.CreateSelect(b_.CreateFCmpUGT(x, zero(x->getType())), x, zero(x->getType()));
    });
    emit_binary("qkv_add", [this](llvm::Value* x, llvm::Value* y) { return b_.CreateFAdd(x, y); });
  }

 private:
  llvm::Value* c64(std::int64_t v) { return ir::i64c(b_, v); }
  static llvm::Constant* fc(llvm::Type* t, double v) { return llvm::ConstantFP::get(t, v); }
  static llvm::Constant* zero(llvm::Type* t) { return llvm::ConstantFP::get(t, 0.0); }

  llvm::Function* begin_function(const std::string& name, llvm::ArrayRef<llvm::Type*> params) {
    fn_ = ir::declare_kernel(module_, b_, rowwise_kernel_name(name, storage_), params.vec(), host_.cpu, features_,
                             lanes_, /*args_param=*/false);
    return fn_;
  }

  /// The first index in [begin, end) from which fewer than a whole vector is left.
  llvm::Value* vector_end(llvm::Value* begin, llvm::Value* end) {
    llvm::Value* len = b_.CreateSub(end, begin);
    return b_.CreateAdd(begin, b_.CreateSub(len, b_.CreateSRem(len, c64(lanes_))), "vec_end");
  }

  /// Element(s) i of an array as f32 (t: float or the vector type), widened from the storage.
  llvm::Value* load(llvm::Type* t, llvm::Value* base, llvm::Value* i) {
    llvm::Type* stored = !half_            ? t
                         : t->isVectorTy() ? llvm::FixedVectorType::get(elem_, static_cast<unsigned>(lanes_))
                                           : elem_;
    llvm::Value* v = b_.CreateAlignedLoad(stored, b_.CreateInBoundsGEP(elem_, base, i), align());
    return ir::from_storage(b_, v, storage_);
  }
  void store(llvm::Value* v, llvm::Value* base, llvm::Value* i) {
    b_.CreateAlignedStore(ir::to_storage(b_, v, storage_), b_.CreateInBoundsGEP(elem_, base, i), align());
  }
  llvm::Align align() const { return llvm::Align(half_ ? 2 : 4); }

  /// Horizontal sum of a vector (a shuffle tree).
  llvm::Value* hsum(llvm::Value* v) {
    for (int w = lanes_; w > 1; w /= 2) {
      std::vector<int> lo, hi;
      for (int l = 0; l < w / 2; ++l) {
        lo.push_back(l);
        hi.push_back(l + w / 2);
      }
      v = b_.CreateFAdd(b_.CreateShuffleVector(v, lo), b_.CreateShuffleVector(v, hi));
    }
    return b_.CreateExtractElement(v, static_cast<std::uint64_t>(0));
  }

  /// Σ f(x[k]) over k in [0, n): a vector accumulator over whole vectors, then the scalar rest.
  llvm::Value* row_sum(llvm::Value* row, llvm::Value* n, llvm::Value* vec_end,
                       const std::function<llvm::Value*(llvm::Value* acc, llvm::Value* x)>& step, const char* name) {
    auto vsum = ir::emit_loop(
        b_, c64(0), vec_end, lanes_, {zero(vf_)},
        [&](llvm::Value* k, const std::vector<llvm::Value*>& acc) {
          return std::vector<llvm::Value*>{step(acc[0], load(vf_, row, k))};
        },
        name);
    auto total = ir::emit_loop(
        b_, vec_end, n, 1, {hsum(vsum[0])},
        [&](llvm::Value* k, const std::vector<llvm::Value*>& acc) {
          return std::vector<llvm::Value*>{step(acc[0], load(f32_, row, k))};
        },
        name);
    return total[0];
  }

  void emit_layer_norm() {
    begin_function("qkv_layer_norm", {ptr_, ptr_, ptr_, ptr_, i64_, f32_, i64_, i64_});
    llvm::Value *x = fn_->getArg(0), *gamma = fn_->getArg(1), *beta = fn_->getArg(2), *y = fn_->getArg(3);
    llvm::Value *n = fn_->getArg(4), *eps = fn_->getArg(5), *r0 = fn_->getArg(6), *r1 = fn_->getArg(7);
    llvm::Value* vec_end = vector_end(c64(0), n);
    llvm::Value* inv_n = b_.CreateFDiv(fc(f32_, 1.0), b_.CreateSIToFP(n, f32_), "inv_n");
    ir::emit_loop(
        b_, r0, r1, 1,
        [&](llvm::Value* r) {
          llvm::Value* off = b_.CreateMul(r, n);
          llvm::Value* xr = b_.CreateGEP(elem_, x, off, "x_row");
          llvm::Value* yr = b_.CreateGEP(elem_, y, off, "y_row");
          llvm::Value* sum =
              row_sum(xr, n, vec_end, [&](llvm::Value* acc, llvm::Value* v) { return b_.CreateFAdd(acc, v); }, "sum");
          llvm::Value* mean = b_.CreateFMul(sum, inv_n, "mean");
          llvm::Value* mean_v = b_.CreateVectorSplat(static_cast<unsigned>(lanes_), mean);
          llvm::Value* ss = row_sum(
              xr, n, vec_end,
              [&](llvm::Value* acc, llvm::Value* v) {
                llvm::Value* d = b_.CreateFSub(v, v->getType()->isVectorTy() ? mean_v : mean);
                return b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {v->getType()}, {d, d, acc});
              },
              "sumsq");
          llvm::Value* var = b_.CreateFMul(ss, inv_n, "var");
          llvm::Value* sd = b_.CreateIntrinsic(llvm::Intrinsic::sqrt, {f32_}, {b_.CreateFAdd(var, eps)});
          llvm::Value* inv_std = b_.CreateFDiv(fc(f32_, 1.0), sd, "inv_std");
          llvm::Value* inv_v = b_.CreateVectorSplat(static_cast<unsigned>(lanes_), inv_std);
          auto normalise = [&](llvm::Type* t, llvm::Value* k) {
            const bool vec = t->isVectorTy();
            llvm::Value* d = b_.CreateFSub(load(t, xr, k), vec ? mean_v : mean);
            llvm::Value* z = b_.CreateFMul(d, vec ? inv_v : inv_std);
            store(b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {t}, {z, load(t, gamma, k), load(t, beta, k)}), yr, k);
          };
          ir::emit_loop(b_, c64(0), vec_end, lanes_, [&](llvm::Value* k) { normalise(vf_, k); }, "norm");
          ir::emit_loop(b_, vec_end, n, 1, [&](llvm::Value* k) { normalise(f32_, k); }, "norm_tail");
        },
        "row");
    b_.CreateRetVoid();
  }

  /// GELU: c = Φ(−|x|) = ½·erfc(|x|/√2) (Numerical Recipes' erfcc: t = 1/(1 + z/2),
  /// erfc(z) = t·exp(−z² + P(t)), fractional error < 1.2e-7), then x − x·c for x > 0, x·c otherwise.
  llvm::Value* gelu(llvm::Value* x) {
    llvm::Type* t = x->getType();
    auto fma = [&](llvm::Value* a, llvm::Value* m, llvm::Value* c) {
      return b_.CreateIntrinsic(llvm::Intrinsic::fma, {t}, {a, m, c});
    };
    llvm::Value* ax = b_.CreateIntrinsic(llvm::Intrinsic::fabs, {t}, {x});
    llvm::Value* z = b_.CreateFMul(ax, fc(t, 0.70710678118654752440));
    llvm::Value* tt = b_.CreateFDiv(fc(t, 1.0), fma(fc(t, 0.5), z, fc(t, 1.0)));
    static constexpr double kP[] = {0.17087277,  -0.82215223, 1.48851587, -1.13520398, 0.27886807,
                                    -0.18628806, 0.09678418,  0.37409196, 1.00002368,  -1.26551223};
    llvm::Value* p = fc(t, kP[0]);
    for (std::size_t i = 1; i < std::size(kP); ++i) p = fma(p, tt, fc(t, kP[i]));
    llvm::Value* e = emit_exp(b_, fma(b_.CreateFNeg(z), z, p));
    llvm::Value* c = b_.CreateFMul(b_.CreateFMul(tt, e), fc(t, 0.5));
    // c == 0 (|x| past ~13, or infinite): the small term is 0, so gelu(+inf) = +inf; a NaN
    // (unordered compare) stays NaN.
    llvm::Value* small = b_.CreateSelect(b_.CreateFCmpUGT(c, zero(t)), b_.CreateFMul(x, c), zero(t));
    return b_.CreateSelect(b_.CreateFCmpOGT(x, zero(t)), b_.CreateFSub(x, small), small);
  }

  void emit_unary(const std::string& name, const std::function<llvm::Value*(llvm::Value*)>& f) {
    begin_function(name, {ptr_, ptr_, i64_, i64_});
    llvm::Value *x = fn_->getArg(0), *y = fn_->getArg(1), *i0 = fn_->getArg(2), *i1 = fn_->getArg(3);
    llvm::Value* vec_end = vector_end(i0, i1);
    ir::emit_loop(b_, i0, vec_end, lanes_, [&](llvm::Value* i) { store(f(load(vf_, x, i)), y, i); }, "vec");
    ir::emit_loop(b_, vec_end, i1, 1, [&](llvm::Value* i) { store(f(load(f32_, x, i)), y, i); }, "tail");
    b_.CreateRetVoid();
  }

  void emit_binary(const std::string& name, const std::function<llvm::Value*(llvm::Value*, llvm::Value*)>& f) {
    begin_function(name, {ptr_, ptr_, ptr_, i64_, i64_});
    llvm::Value *a = fn_->getArg(0), *bb = fn_->getArg(1), *y = fn_->getArg(2);
    llvm::Value *i0 = fn_->getArg(3), *i1 = fn_->getArg(4);
    llvm::Value* vec_end = vector_end(i0, i1);
    ir::emit_loop(
        b_, i0, vec_end, lanes_, [&](llvm::Value* i) { store(f(load(vf_, a, i), load(vf_, bb, i)), y, i); }, "vec");
    ir::emit_loop(
        b_, vec_end, i1, 1, [&](llvm::Value* i) { store(f(load(f32_, a, i), load(f32_, bb, i)), y, i); }, "tail");
    b_.CreateRetVoid();
  }

  llvm::Module& module_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const HostTarget& host_;
  DType storage_;
  bool half_ = false;
  llvm::Type* elem_ = nullptr;  // the stored element: float, or i16 for f16 / bf16 bits
  std::string features_;
  int lanes_ = 4;
  llvm::Type *f32_ = nullptr, *i64_ = nullptr, *ptr_ = nullptr;
  llvm::FixedVectorType* vf_ = nullptr;
  llvm::Function* fn_ = nullptr;
};

}  // namespace

void emit_rowwise_kernels(llvm::Module& module, const HostTarget& host, DType storage) {
  RowwiseEmitter(module, host, storage).emit_all();
}

std::string rowwise_kernel_name(const std::string& base, DType storage) {
  const DType s = storage_dtype(storage);
  return s == DType::bf16 ? base + "_bf16" : s == DType::f16 ? base + "_f16" : base;
}

namespace {

// ------------------------------------------------------------------------------------------------
// the kernels, compiled once

struct Kernels {
  std::unique_ptr<Jit> jit;
  int lanes = 4;
  LayerNormFn* layer_norm = nullptr;
  UnaryFn* gelu = nullptr;
  UnaryFn* relu = nullptr;
  BinaryFn* add = nullptr;
};

template <class Fn>
Fn* find(Jit& jit, const char* name) {
  std::string error;
  Fn* fn = jit.lookup<Fn>(name, &error);
  if (!fn) throw std::runtime_error(std::string("rowwise kernels: ") + error);
  return fn;
}

const Kernels& kernels() {
  static std::mutex mutex;
  static std::unique_ptr<Kernels> ready;
  std::lock_guard<std::mutex> lock(mutex);
  if (ready) return *ready;
  auto k = std::make_unique<Kernels>();
  std::string error;
  k->jit = Jit::create(&error);
  if (!k->jit) throw std::runtime_error("rowwise kernels: " + error);
  auto context = std::make_unique<llvm::LLVMContext>();
  auto module = std::make_unique<llvm::Module>("qkv_rowwise", *context);
  emit_rowwise_kernels(*module, k->jit->target());
  k->lanes = std::max(k->jit->target().vector_floats, 4);
  if (!k->jit->add(std::move(module), std::move(context), &error))
    throw std::runtime_error("rowwise kernels: " + error);
  k->layer_norm = find<LayerNormFn>(*k->jit, "qkv_layer_norm");
  k->gelu = find<UnaryFn>(*k->jit, "qkv_gelu");
  k->relu = find<UnaryFn>(*k->jit, "qkv_relu");
  k->add = find<BinaryFn>(*k->jit, "qkv_add");
  ready = std::move(k);
  return *ready;
}

[[noreturn]] void invalid(const char* fn, const std::string& what) {
  throw std::invalid_argument(std::string(fn) + ": " + what);
}

int workers(int threads) {
  return threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

/// Calls body(begin, end) over [0, total) in blocks of `grain` units (a multiple of `align`),
/// at most 4 per thread; inline when one block covers everything.
template <class Body>
void split(std::int64_t total, std::int64_t grain, std::int64_t align, int threads, const Body& body) {
  const std::int64_t want = 4 * static_cast<std::int64_t>(workers(threads));
  std::int64_t block = std::max(grain, (total + want - 1) / want);
  block = (block + align - 1) / align * align;
  const std::int64_t tasks = (total + block - 1) / block;
  if (tasks <= 1 || workers(threads) == 1) {
    body(std::int64_t{0}, total);
    return;
  }
  ThreadPool::shared().run(tasks, threads, [&](std::int64_t t) { body(t * block, std::min(total, (t + 1) * block)); });
}

void run_unary(const char* name, UnaryFn* Kernels::* which, const float* x, float* y, std::int64_t count, int threads) {
  if (count < 0) invalid(name, "count must not be negative");
  if (count == 0) return;
  if (!x || !y) invalid(name, "x and y must not be null");
  const Kernels& k = kernels();
  UnaryFn* fn = k.*which;
  split(count, 16384, k.lanes, threads, [&](std::int64_t i0, std::int64_t i1) { fn(x, y, i0, i1); });
}

}  // namespace

void run_layer_norm(const float* x, const float* gamma, const float* beta, float* y, std::int64_t rows, std::int64_t n,
                    double eps, int threads) {
  if (rows < 0 || n < 0) invalid("run_layer_norm", "rows and n must not be negative");
  if (rows == 0 || n == 0) return;
  if (!x || !gamma || !beta || !y) invalid("run_layer_norm", "x, gamma, beta and y must not be null");
  const Kernels& k = kernels();
  LayerNormFn* fn = k.layer_norm;
  const auto e = static_cast<float>(eps);
  split(rows, std::max<std::int64_t>(1, 16384 / n), 1, threads,
        [&](std::int64_t r0, std::int64_t r1) { fn(x, gamma, beta, y, n, e, r0, r1); });
}

void run_gelu(const float* x, float* y, std::int64_t count, int threads) {
  run_unary("run_gelu", &Kernels::gelu, x, y, count, threads);
}

void run_relu(const float* x, float* y, std::int64_t count, int threads) {
  run_unary("run_relu", &Kernels::relu, x, y, count, threads);
}

void run_add(const float* a, const float* b, float* y, std::int64_t count, int threads) {
  if (count < 0) invalid("run_add", "count must not be negative");
  if (count == 0) return;
  if (!a || !b || !y) invalid("run_add", "a, b and y must not be null");
  const Kernels& k = kernels();
  BinaryFn* fn = k.add;
  split(count, 16384, k.lanes, threads, [&](std::int64_t i0, std::int64_t i1) { fn(a, b, y, i0, i1); });
}

}  // namespace qkv::codegen::cpu
