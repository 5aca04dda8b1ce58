// Mod expressions as IR: values (emit_mod) and block bounds (emit_mod_classify). The interval
// rules are mod_bounds' (qkv/ir/mod_expr.hpp), in f32 with the NaN-propagating llvm.minimum /
// llvm.maximum so that an unknown bound never decides.
#include "llvm/mod_ir.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Intrinsics.h>

#include "llvm/ir_util.hpp"
#include "llvm/vector_math.hpp"

#include <qkv/ir/error.hpp>

namespace qkv::codegen {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Splats a scalar to the other operand's vector width when one of the two is a vector.
std::pair<llvm::Value*, llvm::Value*> unify(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
  auto* vx = llvm::dyn_cast<llvm::FixedVectorType>(x->getType());
  auto* vy = llvm::dyn_cast<llvm::FixedVectorType>(y->getType());
  if (vx && !vy) y = b.CreateVectorSplat(vx->getNumElements(), y);
  if (vy && !vx) x = b.CreateVectorSplat(vy->getNumElements(), x);
  return {x, y};
}

llvm::Value* fconst(llvm::Type* like, double v) { return llvm::ConstantFP::get(like, v); }

llvm::Value* minimum(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
  return b.CreateBinaryIntrinsic(llvm::Intrinsic::minimum, x, y);
}
llvm::Value* maximum(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
  return b.CreateBinaryIntrinsic(llvm::Intrinsic::maximum, x, y);
}

}  // namespace

std::vector<unsigned> mod_deps(const ModExpr& e, const std::string& query_axis, const std::string& key_axis) {
  std::vector<unsigned> d(e.nodes.size(), 0);
  for (std::size_t i = 0; i < e.nodes.size(); ++i) {
    const ModNode& n = e.nodes[i];
    unsigned x = 0;
    if (n.op == ModOp::score) x = kDepScore;
    if (n.op == ModOp::index || n.op == ModOp::position) {
      if (n.axis == query_axis) x |= kDepQuery;
      if (n.axis == key_axis) x |= kDepKey;
    }
    for (int o : {n.a, n.b, n.c})
      if (o >= 0) x |= d[static_cast<std::size_t>(o)];
    for (int o : n.at) x |= d[static_cast<std::size_t>(o)];
    d[i] = x;
  }
  return d;
}

ModAnalysis analyse_mod(const ModExpr& e, const std::string& query_axis, const std::string& key_axis) {
  ModAnalysis a;
  a.deps = mod_deps(e, query_axis, key_axis);
  a.reach.assign(e.nodes.size(), false);
  for (int root : {e.score, e.keep}) {
    const auto r = mod_reachable(e, root);
    for (std::size_t i = 0; i < r.size(); ++i) a.reach[i] = a.reach[i] || r[i];
  }
  if (e.score >= 0) {
    const ModNode& n = e.nodes[static_cast<std::size_t>(e.score)];
    auto is_score = [&](int id) { return id >= 0 && e.nodes[static_cast<std::size_t>(id)].op == ModOp::score; };
    auto free = [&](int id) { return id >= 0 && !(a.deps[static_cast<std::size_t>(id)] & kDepScore); };
    if (n.op == ModOp::add && is_score(n.a) && free(n.b)) a.score_add = n.b;
    if (n.op == ModOp::add && is_score(n.b) && free(n.a)) a.score_add = n.a;
    if (n.op == ModOp::sub && is_score(n.a) && free(n.b)) {
      a.score_add = n.b;
      a.score_add_sign = -1.0;
    }
    // −X: the sign; A · B with A free of the key (ALiBi's slope): A a factor computed once per
    // task or row, folded with the sign and log2 e, so the entry pays one fma for it.
    while (a.score_add >= 0 && e.nodes[static_cast<std::size_t>(a.score_add)].op == ModOp::neg) {
      a.score_add = e.nodes[static_cast<std::size_t>(a.score_add)].a;
      a.score_add_sign = -a.score_add_sign;
    }
    if (a.score_add >= 0 && e.nodes[static_cast<std::size_t>(a.score_add)].op == ModOp::mul) {
      const ModNode& m = e.nodes[static_cast<std::size_t>(a.score_add)];
      auto keyless = [&](int id) { return !(a.deps[static_cast<std::size_t>(id)] & kDepKey); };
      if (keyless(m.a) && !keyless(m.b)) {
        a.score_add_factor = m.a;
        a.score_add = m.b;
      } else if (keyless(m.b) && !keyless(m.a)) {
        a.score_add_factor = m.b;
        a.score_add = m.a;
      }
    }
  }
  return a;
}

llvm::Type* mod_element_type(llvm::IRBuilder<>& b, DType t) {
  switch (t) {
    case DType::f32:
      return b.getFloatTy();
    case DType::f64:
      return b.getDoubleTy();
    case DType::boolean:
      return b.getInt8Ty();
    case DType::i32:
      return b.getInt32Ty();
    case DType::i64:
      return b.getInt64Ty();
    default:
      throw std::invalid_argument("codegen: a mod loads a tensor of dtype " + std::string(dtype_name(t)) +
                                  "; convert it to f32");
  }
}

llvm::Value* mod_element_to_f32(llvm::IRBuilder<>& b, llvm::Value* x, DType t) {
  llvm::Type* f = b.getFloatTy();
  if (auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(x->getType()))
    f = llvm::FixedVectorType::get(f, vt->getNumElements());
  switch (t) {
    case DType::f32:
      return x;
    case DType::f64:
      return b.CreateFPTrunc(x, f);
    case DType::boolean:
      return b.CreateUIToFP(b.CreateICmpNE(x, llvm::Constant::getNullValue(x->getType())), f);
    default:
      return b.CreateSIToFP(x, f);
  }
}

llvm::Value* ModLeaves::exp(llvm::Value* /*x*/) { return nullptr; }
llvm::Value* ModLeaves::log(llvm::Value* /*x*/) { return nullptr; }
llvm::Value* ModLeaves::exp2(llvm::Value* /*x*/) { return nullptr; }
llvm::Value* ModLeaves::score_log2() { return nullptr; }

llvm::Value* Log2ScoreLeaves::score() {
  if (!log2_) internal_error(std::string(kernel_) + ": the keep predicate of a mod may not read the score");
  if (!nat_) nat_ = b_.CreateFMul(log2_, fconst(log2_->getType(), kLn2), "score_nat");
  return nat_;
}

namespace {

/// 1 / (e + 1) for a finite e >= 0 (the caller keeps it finite), as a reciprocal estimate refined
/// once (arcp, ninf: rcp14 + Newton on x86). tanh a = 1 − 2 / (e^(2a) + 1).
llvm::Value* recip_plus_one(llvm::IRBuilder<>& b, llvm::Value* e) {
  llvm::Type* t = e->getType();
  llvm::Value* q = b.CreateFDiv(fconst(t, 1.0), b.CreateFAdd(e, fconst(t, 1.0)));
  if (auto* div = llvm::dyn_cast<llvm::Instruction>(q)) {
    div->setHasAllowReciprocal(true);
    div->setHasNoInfs(true);
  }
  return q;
}

/// Whether node n is c · tanh(score / d) (mods::softcap: d = c), with c and d.
bool softcap_form(const ModExpr& e, const ModNode& n, double& c, double& d) {
  auto constant = [&](int id, double& v) {
    const ModNode& k = e.nodes[static_cast<std::size_t>(id)];
    v = k.value;
    return k.op == ModOp::constant;
  };
  if (n.op != ModOp::mul) return false;
  int t = -1;
  if (constant(n.a, c))
    t = n.b;
  else if (constant(n.b, c))
    t = n.a;
  if (t < 0 || e.nodes[static_cast<std::size_t>(t)].op != ModOp::tanh) return false;
  const ModNode& q = e.nodes[static_cast<std::size_t>(e.nodes[static_cast<std::size_t>(t)].a)];
  return q.op == ModOp::div && e.nodes[static_cast<std::size_t>(q.a)].op == ModOp::score && constant(q.b, d) &&
         d != 0.0 && std::isfinite(2.0 / d);
}

/// k · tanh(x·ln 2 / d) = k − 2k / (2^(2x/d) + 1) from the score in log2 units x, with 2x/d
/// clamped to at most 64 (tanh is 1 in f32 long before; a NaN passes) and no clamp below (2^x is
/// 0 there: tanh = −1). One 2^x, one refined reciprocal, one fma.
llvm::Value* softcap_from_log2(llvm::IRBuilder<>& b, llvm::Value* x, double d, double k, ModLeaves& leaves) {
  llvm::Type* ty = x->getType();
  llvm::Value* u = b.CreateFMul(x, fconst(ty, 2.0 / d));
  llvm::Value* hi = fconst(ty, 64.0);
  u = b.CreateSelect(b.CreateFCmpOGT(u, hi), hi, u);
  llvm::Value* ex = leaves.exp2(u);
  if (!ex) ex = cpu::emit_exp2(b, u, /*no_overflow=*/true);
  return b.CreateIntrinsic(llvm::Intrinsic::fmuladd, {ty},
                           {recip_plus_one(b, ex), fconst(ty, -2.0 * k), fconst(ty, k)});
}

/// Node n = c · tanh(score / d) in nats when the kernel has the score in log2 units (nullptr
/// otherwise).
llvm::Value* emit_softcap(llvm::IRBuilder<>& b, const ModExpr& e, const ModNode& n, ModLeaves& leaves) {
  double c = 0.0, d = 0.0;
  if (!softcap_form(e, n, c, d)) return nullptr;
  llvm::Value* x = leaves.score_log2();
  return x ? softcap_from_log2(b, x, d, c, leaves) : nullptr;
}

}  // namespace

llvm::Value* mod_clamp_index(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* extent_f32) {
  llvm::Value* hi = b.CreateFSub(extent_f32, fconst(extent_f32->getType(), 1.0));
  hi = b.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, hi, fconst(hi->getType(), 0.0));
  auto [xx, hh] = unify(b, b.CreateUnaryIntrinsic(llvm::Intrinsic::trunc, x), hi);
  // maxnum/minnum return the other operand for NaN: NaN → 0.
  llvm::Value* c = b.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, xx, fconst(xx->getType(), 0.0));
  c = b.CreateBinaryIntrinsic(llvm::Intrinsic::minnum, c, hh);
  llvm::Type* i64 = b.getInt64Ty();
  if (auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(c->getType()))
    i64 = llvm::FixedVectorType::get(i64, vt->getNumElements());
  return b.CreateFPToSI(c, i64);
}

std::optional<IrInterval> tile_axis_range(llvm::IRBuilder<>& b, const ModExpr& e, const std::string& query_axis,
                                          const std::string& key_axis, const TileSpan& t, const std::string& axis,
                                          bool position) {
  auto span = [&](llvm::Value* first, llvm::Value* end) {
    llvm::Type* f32 = b.getFloatTy();
    llvm::Value* last = b.CreateSub(end, llvm::ConstantInt::get(end->getType(), 1));
    return IrInterval{b.CreateSIToFP(first, f32), b.CreateSIToFP(last, f32)};
  };
  if (axis == key_axis) return span(t.k0, t.k_end);
  if (axis != query_axis) return std::nullopt;
  IrInterval r = span(t.q0, t.q_end);
  if (position && e.shifts(axis)) {
    llvm::Value* off = b.CreateFSub(t.len_k, t.len_q);
    r = {b.CreateFAdd(r.lo, off), b.CreateFAdd(r.hi, off)};
  }
  return r;
}

llvm::Value* emit_softcap_log2(llvm::IRBuilder<>& b, const ModExpr& e, int root, ModLeaves& leaves) {
  double c = 0.0, d = 0.0;
  if (root < 0 || !softcap_form(e, e.nodes[static_cast<std::size_t>(root)], c, d)) return nullptr;
  llvm::Value* x = leaves.score_log2();
  return x ? softcap_from_log2(b, x, d, c * kLog2e, leaves) : nullptr;
}

namespace {

llvm::Value* exp_of(llvm::IRBuilder<>& b, llvm::Value* x, ModLeaves& leaves) {
  llvm::Value* e = leaves.exp(x);
  return e ? e : cpu::emit_exp(b, x);
}

/// 1 / (1 + e^−x) from e = e^−|x| <= 1 (no overflow): 1 / (1 + e) for x >= 0, e / (1 + e) below,
/// so the tail keeps its relative accuracy (sigmoid −100 is 3.7e−44, not 0 or 1/overflow).
llvm::Value* emit_sigmoid(llvm::IRBuilder<>& b, llvm::Value* x, ModLeaves& leaves) {
  llvm::Type* t = x->getType();
  llvm::Value* e = exp_of(b, b.CreateFNeg(b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x)), leaves);
  llvm::Value* s = b.CreateFDiv(fconst(t, 1.0), b.CreateFAdd(fconst(t, 1.0), e));
  return b.CreateSelect(b.CreateFCmpOLT(x, fconst(t, 0.0)), b.CreateFMul(e, s), s);
}

/// erf x: below |x| = 0.5 its Taylor series to x^13 (relative error < 1e−8, so erf of a tiny x
/// keeps its digits); above, 1 − erfc(|x|) with Numerical Recipes' erfc (t = 1 / (1 + z/2),
/// erfc z = t·e^(−z² + P(t)), fractional error < 1.2e−7); the sign of x; NaN stays NaN.
llvm::Value* emit_erf(llvm::IRBuilder<>& b, llvm::Value* x, ModLeaves& leaves) {
  llvm::Type* t = x->getType();
  auto c = [&](double v) { return fconst(t, v); };
  auto fma = [&](llvm::Value* p, llvm::Value* q, llvm::Value* r) {
    return b.CreateIntrinsic(llvm::Intrinsic::fmuladd, {t}, {p, q, r});
  };
  llvm::Value* z = b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x);
  // Series: 2/√π · z · Σ (−1)^n z^(2n) / (n! (2n+1)), n = 0..6, Horner in z².
  llvm::Value* z2 = b.CreateFMul(z, z);
  llvm::Value* s = c(1.0 / 9360.0);
  for (const double k : {-1.0 / 1320.0, 1.0 / 216.0, -1.0 / 42.0, 1.0 / 10.0, -1.0 / 3.0, 1.0}) s = fma(s, z2, c(k));
  llvm::Value* small = b.CreateFMul(b.CreateFMul(s, z), c(1.1283791670955126));  // 2/√π
  // Numerical Recipes' erfcc.
  llvm::Value* tt = b.CreateFDiv(c(1.0), fma(z, c(0.5), c(1.0)));
  llvm::Value* p = c(0.17087277);
  for (const double k :
       {-0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418, 0.37409196, 1.00002368, -1.26551223})
    p = fma(p, tt, c(k));
  llvm::Value* erfc = b.CreateFMul(tt, exp_of(b, b.CreateFSub(p, z2), leaves));
  llvm::Value* large = b.CreateFSub(c(1.0), erfc);
  llvm::Value* r = b.CreateSelect(b.CreateFCmpOLT(z, c(0.5)), small, large);
  return b.CreateBinaryIntrinsic(llvm::Intrinsic::copysign, r, x);
}

/// x^y as C's pow for the cases a model meets: e^(y·ln|x|) through exp2/log2; x^0 = 1 and 1^y = 1
/// (even for NaN); 0^y = 0 (y > 0) or +inf (y < 0); a negative x with an integral y takes the
/// sign of y's parity, with any other y it is NaN (−inf: +inf or +0).
llvm::Value* emit_pow(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y, ModLeaves& leaves) {
  llvm::Type* t = x->getType();
  auto c = [&](double v) { return fconst(t, v); };
  llvm::Value* ax = b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x);
  llvm::Value* l2 = b.CreateFMul(y, cpu::emit_log2(b, ax));
  llvm::Value* e2 = leaves.exp2(l2);
  if (!e2) e2 = cpu::emit_exp2(b, l2);
  // Whether y is integral, and odd, by a round trip through i32 below 2^23 (above, every float is
  // an even integer) — no floor(), which baseline x86-64 would call from libm.
  llvm::Type* it = b.getInt32Ty();
  if (auto* vt = llvm::dyn_cast<llvm::VectorType>(t)) it = llvm::VectorType::get(it, vt);
  llvm::Value* small = b.CreateFCmpOLT(b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, y), c(8388608.0));
  llvm::Value* yi = b.CreateFPToSI(b.CreateSelect(small, y, c(0.0)), it);
  llvm::Value* integral = b.CreateSelect(small, b.CreateFCmpOEQ(b.CreateSIToFP(yi, t), y), b.CreateFCmpORD(y, y));
  llvm::Value* odd =
      b.CreateAnd(b.CreateAnd(small, integral),
                  b.CreateICmpNE(b.CreateAnd(yi, llvm::ConstantInt::get(it, 1)), llvm::Constant::getNullValue(it)));
  llvm::Value* negative = b.CreateFCmpOLT(x, c(0.0));
  llvm::Value* r = b.CreateSelect(odd, b.CreateFNeg(e2), e2);
  // (−inf)^y: +inf or +0 unless y is an odd integer, as C's pow.
  llvm::Value* keeps = b.CreateOr(integral, b.CreateFCmpOEQ(x, c(-std::numeric_limits<double>::infinity())));
  r = b.CreateSelect(negative, b.CreateSelect(keeps, r, c(std::numeric_limits<double>::quiet_NaN())), e2);
  llvm::Value* one = b.CreateOr(b.CreateFCmpOEQ(y, c(0.0)), b.CreateFCmpOEQ(x, c(1.0)));
  return b.CreateSelect(one, c(1.0), r);
}

}  // namespace

llvm::Value* emit_mod(llvm::IRBuilder<>& b, const ModExpr& e, int root, ModLeaves& leaves,
                      std::vector<llvm::Value*>& cache) {
  cache.resize(e.nodes.size(), nullptr);
  if (llvm::Value* v = cache[static_cast<std::size_t>(root)]) return v;
  const ModNode& n = e.nodes[static_cast<std::size_t>(root)];
  auto x = [&](int id) { return emit_mod(b, e, id, leaves, cache); };
  // A number where a boolean is due (a literal true / false is a constant): non-zero is true.
  auto truth = [&](int id) {
    llvm::Value* v = x(id);
    if (v->getType()->getScalarType()->isFloatingPointTy())
      v = b.CreateFCmpUNE(v, llvm::Constant::getNullValue(v->getType()));
    return v;
  };
  auto bin = [&](auto&& f) {
    auto [l, r] = unify(b, x(n.a), x(n.b));
    return f(l, r);
  };
  llvm::Value* out = nullptr;
  switch (n.op) {
    case ModOp::score:
      out = leaves.score();
      break;
    case ModOp::index:
      out = leaves.index(n.axis);
      break;
    case ModOp::position:
      out = leaves.position(n.axis);
      break;
    case ModOp::length:
      out = leaves.length(n.axis);
      break;
    case ModOp::constant:
      out = llvm::ConstantFP::get(b.getFloatTy(), n.value);
      break;
    case ModOp::load: {
      std::vector<llvm::Value*> at;
      for (std::size_t k = 0; k < n.at.size(); ++k) at.push_back(mod_clamp_index(b, x(n.at[k]), leaves.extent(n, k)));
      out = leaves.load(n, at);
      break;
    }
    case ModOp::add:
      out = bin([&](auto l, auto r) { return b.CreateFAdd(l, r); });
      break;
    case ModOp::sub:
      out = bin([&](auto l, auto r) { return b.CreateFSub(l, r); });
      break;
    case ModOp::mul:
      out = emit_softcap(b, e, n, leaves);
      if (!out) out = bin([&](auto l, auto r) { return b.CreateFMul(l, r); });
      break;
    case ModOp::div: {
      // By a constant (softcap's s / c): a multiplication by 1/c, rounded once (within 1.5 ulp
      // of the division, which costs an order of magnitude more).
      const ModNode& rhs = e.nodes[static_cast<std::size_t>(n.b)];
      const double inv = rhs.op == ModOp::constant && rhs.value != 0.0 ? 1.0 / rhs.value : 0.0;
      if (inv != 0.0 && std::isfinite(inv) && std::isfinite(static_cast<float>(inv))) {
        llvm::Value* l = x(n.a);
        out = b.CreateFMul(l, fconst(l->getType(), inv));
      } else {
        out = bin([&](auto l, auto r) { return b.CreateFDiv(l, r); });
      }
      break;
    }
    case ModOp::min:
      out = bin([&](auto l, auto r) { return b.CreateBinaryIntrinsic(llvm::Intrinsic::minnum, l, r); });
      break;
    case ModOp::max:
      out = bin([&](auto l, auto r) { return b.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, l, r); });
      break;
    case ModOp::neg:
      out = b.CreateFNeg(x(n.a));
      break;
    case ModOp::abs:
      out = b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x(n.a));
      break;
    case ModOp::exp:
      out = exp_of(b, x(n.a), leaves);
      break;
    case ModOp::log: {
      llvm::Value* a = x(n.a);
      out = leaves.log(a);
      if (!out) out = b.CreateFMul(cpu::emit_log2(b, a), fconst(a->getType(), kLn2));
      break;
    }
    case ModOp::tanh: {
      // tanh x = 1 − 2 / (e^(2x) + 1) on x clamped into [−9, 9] (tanh 9 rounds to 1 in f32; a
      // NaN passes the clamp), so e^(2x) is finite (recip_plus_one). Absolute error ~2e-7.
      llvm::Value* a = x(n.a);
      llvm::Type* t = a->getType();
      llvm::Value* lo = fconst(t, -9.0);
      llvm::Value* hi = fconst(t, 9.0);
      a = b.CreateSelect(b.CreateFCmpOLT(a, lo), lo, a);
      a = b.CreateSelect(b.CreateFCmpOGT(a, hi), hi, a);
      llvm::Value* two = b.CreateFMul(a, fconst(t, 2.0));
      out = b.CreateIntrinsic(llvm::Intrinsic::fmuladd, {t},
                              {recip_plus_one(b, exp_of(b, two, leaves)), fconst(t, -2.0), fconst(t, 1.0)});
      break;
    }
    case ModOp::sqrt:
      out = b.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x(n.a));
      break;
    case ModOp::rsqrt: {
      llvm::Value* a = x(n.a);
      out = b.CreateFDiv(fconst(a->getType(), 1.0), b.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, a));
      break;
    }
    case ModOp::sigmoid:
      out = emit_sigmoid(b, x(n.a), leaves);
      break;
    case ModOp::erf:
      out = emit_erf(b, x(n.a), leaves);
      break;
    case ModOp::pow:
      out = bin([&](auto l, auto r) { return emit_pow(b, l, r, leaves); });
      break;
    case ModOp::lt:
      out = bin([&](auto l, auto r) { return b.CreateFCmpOLT(l, r); });
      break;
    case ModOp::le:
      out = bin([&](auto l, auto r) { return b.CreateFCmpOLE(l, r); });
      break;
    case ModOp::gt:
      out = bin([&](auto l, auto r) { return b.CreateFCmpOGT(l, r); });
      break;
    case ModOp::ge:
      out = bin([&](auto l, auto r) { return b.CreateFCmpOGE(l, r); });
      break;
    case ModOp::eq:
      out = bin([&](auto l, auto r) { return b.CreateFCmpOEQ(l, r); });
      break;
    case ModOp::ne:
      out = bin([&](auto l, auto r) { return b.CreateFCmpUNE(l, r); });
      break;
    case ModOp::logical_and: {
      auto [l, r] = unify(b, truth(n.a), truth(n.b));
      out = b.CreateAnd(l, r);
      break;
    }
    case ModOp::logical_or: {
      auto [l, r] = unify(b, truth(n.a), truth(n.b));
      out = b.CreateOr(l, r);
      break;
    }
    case ModOp::logical_not:
      out = b.CreateNot(truth(n.a));
      break;
    case ModOp::where: {
      // Splat whichever of the three is a scalar when another is a vector.
      auto [l, r] = unify(b, x(n.b), x(n.c));
      auto [c, l2] = unify(b, truth(n.a), l);
      auto [c2, r2] = unify(b, c, r);
      auto [l3, r3] = unify(b, l2, r2);
      out = b.CreateSelect(c2, l3, r3);
      break;
    }
  }
  cache[static_cast<std::size_t>(root)] = out;
  return out;
}

IrInterval emit_load_bounds(llvm::IRBuilder<>& b, const ModExpr& e, const std::vector<unsigned>& deps, const ModNode& n,
                            const std::vector<IrInterval>& at, const std::vector<llvm::Value*>& extent_f32,
                            const std::function<llvm::Value*(const std::vector<llvm::Value*>&)>& load,
                            const ModLoop& loop) {
  int ranging = -1, count = 0;
  for (std::size_t d = 0; d < n.at.size(); ++d) {
    if (deps[static_cast<std::size_t>(n.at[d])] & (kDepQuery | kDepKey)) {
      ranging = static_cast<int>(d);
      ++count;
    }
  }
  if (count > 1) return {};
  if (count == 1) {
    const ModOp op = e.nodes[static_cast<std::size_t>(n.at[static_cast<std::size_t>(ranging)])].op;
    if (op != ModOp::index && op != ModOp::position) return {};  // not a contiguous range of indices
  }
  std::vector<llvm::Value*> idx;
  for (std::size_t d = 0; d < n.at.size(); ++d) idx.push_back(mod_clamp_index(b, at[d].lo, extent_f32[d]));
  if (count == 0) {
    llvm::Value* x = load(idx);
    return {x, x};
  }
  const auto r = static_cast<std::size_t>(ranging);
  llvm::Value* hi = b.CreateAdd(mod_clamp_index(b, at[r].hi, extent_f32[r]), b.getInt64(1));
  llvm::Type* f = b.getFloatTy();
  const std::vector<llvm::Value*> mm =
      loop(idx[r], hi, {llvm::ConstantFP::get(f, kInf), llvm::ConstantFP::get(f, -kInf)},
           [&](llvm::Value* i, const std::vector<llvm::Value*>& in) {
             std::vector<llvm::Value*> at_i = idx;
             at_i[r] = i;
             llvm::Value* x = load(at_i);
             return std::vector<llvm::Value*>{minimum(b, in[0], x), maximum(b, in[1], x)};
           });
  return {mm[0], mm[1]};
}

IrInterval ModBoundsLeaves::load(const ModNode& /*n*/, const std::vector<IrInterval>& /*at*/) { return {}; }

std::pair<llvm::Value*, llvm::Value*> emit_mod_classify(llvm::IRBuilder<>& b, const ModExpr& e,
                                                        ModBoundsLeaves& leaves) {
  llvm::Type* f = b.getFloatTy();
  auto c = [&](double v) { return llvm::ConstantFP::get(f, v); };
  const std::vector<bool> used = mod_reachable(e, e.keep);
  const std::vector<bool> bools = mod_bool_nodes(e);
  // Numbers: intervals; booleans: (always, never) as i1.
  std::vector<IrInterval> num(e.nodes.size());
  std::vector<std::pair<llvm::Value*, llvm::Value*>> tri(e.nodes.size());
  const IrInterval unbounded{c(-kInf), c(kInf)};
  llvm::Value* no = b.getFalse();
  auto lo4 = [&](llvm::Value* p, llvm::Value* q, llvm::Value* r, llvm::Value* s) {
    return minimum(b, minimum(b, p, q), minimum(b, r, s));
  };
  auto hi4 = [&](llvm::Value* p, llvm::Value* q, llvm::Value* r, llvm::Value* s) {
    return maximum(b, maximum(b, p, q), maximum(b, r, s));
  };
  // A NaN bound means "unknown": widen it to unbounded (a NaN never compares true below).
  auto clean = [&](IrInterval r) -> IrInterval {
    llvm::Value* nan = b.CreateFCmpUNO(r.lo, r.hi);
    return {b.CreateSelect(nan, c(-kInf), r.lo), b.CreateSelect(nan, c(kInf), r.hi)};
  };
  for (std::size_t i = 0; i < e.nodes.size(); ++i) {
    if (!used[i]) continue;
    const ModNode& n = e.nodes[i];
    auto A = [&] { return num[static_cast<std::size_t>(n.a)]; };
    auto B = [&] { return num[static_cast<std::size_t>(n.b)]; };
    // A number used as a boolean (a literal): always if its interval excludes 0, never if it is 0.
    auto tri_of = [&](int id) -> std::pair<llvm::Value*, llvm::Value*> {
      const auto& t = tri[static_cast<std::size_t>(id)];
      if (t.first) return t;
      const IrInterval v = num[static_cast<std::size_t>(id)];
      return {b.CreateOr(b.CreateFCmpOGT(v.lo, c(0.0)), b.CreateFCmpOLT(v.hi, c(0.0))),
              b.CreateAnd(b.CreateFCmpOEQ(v.lo, c(0.0)), b.CreateFCmpOEQ(v.hi, c(0.0)))};
    };
    auto TA = [&] { return tri_of(n.a); };
    auto TB = [&] { return tri_of(n.b); };
    IrInterval r = unbounded;
    std::pair<llvm::Value*, llvm::Value*> t{no, no};
    const bool is_bool = bools[i];
    switch (n.op) {
      case ModOp::score:
        break;
      case ModOp::index:
        r = leaves.index(n.axis);
        break;
      case ModOp::position:
        r = leaves.position(n.axis);
        break;
      case ModOp::length: {
        llvm::Value* l = leaves.length(n.axis);
        r = {l, l};
        break;
      }
      case ModOp::constant:
        r = {c(n.value), c(n.value)};
        break;
      case ModOp::load: {
        std::vector<IrInterval> at;
        for (int k : n.at) at.push_back(num[static_cast<std::size_t>(k)]);
        r = leaves.load(n, at);
        if (!r.lo) r = unbounded;
        break;
      }
      case ModOp::add:
        r = {b.CreateFAdd(A().lo, B().lo), b.CreateFAdd(A().hi, B().hi)};
        break;
      case ModOp::sub:
        r = {b.CreateFSub(A().lo, B().hi), b.CreateFSub(A().hi, B().lo)};
        break;
      case ModOp::mul: {
        llvm::Value* p[4] = {b.CreateFMul(A().lo, B().lo), b.CreateFMul(A().lo, B().hi), b.CreateFMul(A().hi, B().lo),
                             b.CreateFMul(A().hi, B().hi)};
        r = {lo4(p[0], p[1], p[2], p[3]), hi4(p[0], p[1], p[2], p[3])};
        break;
      }
      case ModOp::div:
        break;
      case ModOp::min:
        r = {minimum(b, A().lo, B().lo), minimum(b, A().hi, B().hi)};
        break;
      case ModOp::max:
        r = {maximum(b, A().lo, B().lo), maximum(b, A().hi, B().hi)};
        break;
      case ModOp::neg:
        r = {b.CreateFNeg(A().hi), b.CreateFNeg(A().lo)};
        break;
      case ModOp::abs: {
        const IrInterval a = A();
        llvm::Value* pos = b.CreateFCmpOGE(a.lo, c(0.0));
        llvm::Value* neg = b.CreateFCmpOLE(a.hi, c(0.0));
        llvm::Value* mx = maximum(b, b.CreateFNeg(a.lo), a.hi);
        r.lo = b.CreateSelect(pos, a.lo, b.CreateSelect(neg, b.CreateFNeg(a.hi), c(0.0)));
        r.hi = b.CreateSelect(pos, a.hi, b.CreateSelect(neg, b.CreateFNeg(a.lo), mx));
        // NaN bounds: neither select fires, mx is NaN → cleaned below.
        break;
      }
      case ModOp::exp:
      case ModOp::log:
      case ModOp::tanh:
      case ModOp::sqrt:
      case ModOp::rsqrt:
      case ModOp::sigmoid:
      case ModOp::erf:
      case ModOp::pow:
        break;  // monotone or not, the kernels' approximations are not checked for monotonicity: unbounded
      case ModOp::lt:
        t = {b.CreateFCmpOLT(A().hi, B().lo), b.CreateFCmpOGE(A().lo, B().hi)};
        break;
      case ModOp::le:
        t = {b.CreateFCmpOLE(A().hi, B().lo), b.CreateFCmpOGT(A().lo, B().hi)};
        break;
      case ModOp::gt:
        t = {b.CreateFCmpOGT(A().lo, B().hi), b.CreateFCmpOLE(A().hi, B().lo)};
        break;
      case ModOp::ge:
        t = {b.CreateFCmpOGE(A().lo, B().hi), b.CreateFCmpOLT(A().hi, B().lo)};
        break;
      case ModOp::eq:
      case ModOp::ne: {
        llvm::Value* point = b.CreateAnd(b.CreateAnd(b.CreateFCmpOEQ(A().lo, A().hi), b.CreateFCmpOEQ(B().lo, B().hi)),
                                         b.CreateFCmpOEQ(A().lo, B().lo));
        llvm::Value* apart = b.CreateOr(b.CreateFCmpOLT(A().hi, B().lo), b.CreateFCmpOLT(B().hi, A().lo));
        t = n.op == ModOp::eq ? std::pair{point, apart} : std::pair{apart, point};
        break;
      }
      case ModOp::logical_and:
        t = {b.CreateAnd(TA().first, TB().first), b.CreateOr(TA().second, TB().second)};
        break;
      case ModOp::logical_or:
        t = {b.CreateOr(TA().first, TB().first), b.CreateAnd(TA().second, TB().second)};
        break;
      case ModOp::logical_not:
        t = {TA().second, TA().first};
        break;
      case ModOp::where: {
        const auto cnd = TA();
        if (is_bool) {
          const auto x = TB(), y = tri_of(n.c);
          // always: (c always ∧ x always) ∨ (c never ∧ y always) ∨ (x always ∧ y always)
          t.first = b.CreateOr(b.CreateOr(b.CreateAnd(cnd.first, x.first), b.CreateAnd(cnd.second, y.first)),
                               b.CreateAnd(x.first, y.first));
          t.second = b.CreateOr(b.CreateOr(b.CreateAnd(cnd.first, x.second), b.CreateAnd(cnd.second, y.second)),
                                b.CreateAnd(x.second, y.second));
        } else {
          const IrInterval x = B(), y = num[static_cast<std::size_t>(n.c)];
          llvm::Value* lo = minimum(b, x.lo, y.lo);
          llvm::Value* hi = maximum(b, x.hi, y.hi);
          r.lo = b.CreateSelect(cnd.first, x.lo, b.CreateSelect(cnd.second, y.lo, lo));
          r.hi = b.CreateSelect(cnd.first, x.hi, b.CreateSelect(cnd.second, y.hi, hi));
        }
        break;
      }
    }
    if (is_bool) {
      tri[i] = t;
    } else {
      num[i] = clean(r);
    }
  }
  const auto& t = tri[static_cast<std::size_t>(e.keep)];
  if (t.first) return t;
  const IrInterval v = num[static_cast<std::size_t>(e.keep)];
  return {b.CreateOr(b.CreateFCmpOGT(v.lo, c(0.0)), b.CreateFCmpOLT(v.hi, c(0.0))),
          b.CreateAnd(b.CreateFCmpOEQ(v.lo, c(0.0)), b.CreateFCmpOEQ(v.hi, c(0.0)))};
}

llvm::Value* modified_score_log2(llvm::IRBuilder<>& b, const ModExpr& e, const ModAnalysis& info, llvm::Value* s,
                                 ModLeaves& leaves, const std::function<llvm::Value*(int, llvm::Value*)>& value) {
  if (e.score < 0) return s;
  auto c = [&](double v) { return llvm::ConstantFP::get(s->getType(), v); };
  if (info.score_add >= 0) {
    llvm::Value* factor = c(info.score_add_sign * kLog2e);
    if (info.score_add_factor >= 0) factor = b.CreateFMul(value(info.score_add_factor, nullptr), factor);
    return b.CreateIntrinsic(llvm::Intrinsic::fmuladd, {s->getType()}, {value(info.score_add, nullptr), factor, s});
  }
  if (llvm::Value* capped = emit_softcap_log2(b, e, e.score, leaves)) {
    if (capped->getType() != s->getType())
      capped = b.CreateVectorSplat(llvm::cast<llvm::FixedVectorType>(s->getType())->getNumElements(), capped);
    return capped;
  }
  return b.CreateFMul(value(e.score, s), c(kLog2e));
}

std::vector<ModTensorIn> mod_tensors(llvm::IRBuilder<>& b, const std::vector<cpu::ModTensor>& tensors,
                                     llvm::Value* keep, llvm::Value* bias, llvm::Value* table, llvm::Value* extents,
                                     llvm::Value* batch, llvm::Value* len_q, llvm::Value* len_k) {
  llvm::Type* ptr = b.getPtrTy();
  llvm::Type* i64 = b.getInt64Ty();
  std::uint64_t captured = 0, ext_at = 0;
  std::vector<ModTensorIn> out;
  for (const cpu::ModTensor& t : tensors) {
    ModTensorIn in;
    switch (t.source) {
      case cpu::ModTensor::Source::key_keep:
        in.base = keep;
        in.extent = {batch, len_k};
        break;
      case cpu::ModTensor::Source::bias:
        in.base = bias;
        in.extent = {len_q, len_k};
        break;
      case cpu::ModTensor::Source::captured:
        in.base = b.CreateLoad(ptr, b.CreateConstInBoundsGEP1_64(ptr, table, captured++), "tensor");
        for (int d = 0; d < t.rank; ++d)
          in.extent.push_back(b.CreateLoad(i64, b.CreateConstInBoundsGEP1_64(i64, extents, ext_at++)));
        break;
    }
    in.stride.assign(in.extent.size(), b.getInt64(1));
    for (std::size_t d = in.extent.size(); d-- > 1;) in.stride[d - 1] = b.CreateMul(in.stride[d], in.extent[d]);
    for (llvm::Value* e : in.extent) in.extent_f32.push_back(b.CreateSIToFP(e, b.getFloatTy()));
    out.push_back(std::move(in));
  }
  return out;
}

llvm::Value* mod_element_offset(llvm::IRBuilder<>& b, const ModTensorIn& t, const std::vector<llvm::Value*>& index,
                                int lanes) {
  auto splat = [&](llvm::Value* x) { return b.CreateVectorSplat(static_cast<unsigned>(lanes), x); };
  llvm::Value* off = b.getInt64(0);
  for (std::size_t d = 0; d < index.size(); ++d) {
    llvm::Value* i = index[d];
    llvm::Value* s = t.stride[d];
    if (i->getType()->isVectorTy()) {
      s = splat(s);
      if (!off->getType()->isVectorTy()) off = splat(off);
    } else if (off->getType()->isVectorTy()) {
      i = splat(i);
      s = splat(s);
    }
    off = b.CreateAdd(off, b.CreateMul(i, s));
  }
  return off;
}

llvm::Value* load_mod_element(llvm::IRBuilder<>& b, const ModTensorIn& t, DType dtype,
                              const std::vector<llvm::Value*>& index, int lanes) {
  llvm::Value* off = mod_element_offset(b, t, index, lanes);
  llvm::Type* et = mod_element_type(b, dtype);
  llvm::Value* x = nullptr;
  if (off->getType()->isVectorTy()) {
    llvm::Type* vt = llvm::FixedVectorType::get(et, static_cast<unsigned>(lanes));
    llvm::Value* ptrs = b.CreateGEP(et, t.base, off);
    x = b.CreateMaskedGather(vt, ptrs, llvm::Align(static_cast<unsigned>(dtype_size(dtype))));
  } else {
    x = b.CreateLoad(et, b.CreateGEP(et, t.base, off));
  }
  return mod_element_to_f32(b, x, dtype);
}

llvm::Value* mod_axis_length(llvm::IRBuilder<>& b, const cpu::ModAxes& axes, const std::string& axis,
                             llvm::Value* len_qf, llvm::Value* len_kf, llvm::Value* nbatch) {
  if (axis == axes.query) return len_qf;
  if (axis == axes.key) return len_kf;
  if (axis == axes.batch) return b.CreateSIToFP(nbatch, b.getFloatTy());
  for (const auto& h : axes.heads)
    if (h.name == axis) return llvm::ConstantFP::get(b.getFloatTy(), static_cast<double>(h.extent));
  internal_error("attention kernel: a mod names the axis `" + axis + "`, which the scores do not have");
}

llvm::Value* mod_head_coordinate(llvm::IRBuilder<>& b, const cpu::ModAxes& axes, const std::string& axis,
                                 llvm::Value* head) {
  for (const auto& h : axes.heads) {
    if (h.name != axis) continue;
    llvm::Value* c = b.CreateURem(b.CreateUDiv(head, cpu::ir::i64c(b, h.stride)), cpu::ir::i64c(b, h.extent));
    return b.CreateSIToFP(c, b.getFloatTy());
  }
  return nullptr;
}

}  // namespace qkv::codegen
