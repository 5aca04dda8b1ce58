// codegen/llvm/ir_int.hpp — i64 values being built as IR, with C++'s arithmetic (private).
//
// Sizes in a compiled graph are either known when the code is generated (static extents, sizes
// the code is specialised on) or run-time arguments. Code written over ir::Int handles both: the
// builder folds constants as it goes, so fully static sizes give the constants a specialised
// compiler would have written, and dynamic ones give the run-time arithmetic. The scheduling
// policies (schedule.hpp) are templates over the integer type, so the C++ drivers (int64) and the
// generated code (ir::Int) share one formula.
#pragma once

#include <cstdint>
#include <optional>

#include <llvm/IR/Constants.h>
#include <llvm/IR/IRBuilder.h>

namespace qkv::codegen::cpu::ir {

class Bool;

/// A signed i64 at the builder's insertion point.
class Int {
 public:
  Int(llvm::IRBuilder<>& b, llvm::Value* v) : b_(&b), v_(v) {}
  Int(llvm::IRBuilder<>& b, std::int64_t c) : b_(&b), v_(b.getInt64(static_cast<std::uint64_t>(c))) {}
  [[nodiscard]] llvm::Value* v() const { return v_; }
  [[nodiscard]] llvm::IRBuilder<>& b() const { return *b_; }
  [[nodiscard]] std::optional<std::int64_t> constant() const {
    if (auto* c = llvm::dyn_cast<llvm::ConstantInt>(v_)) return c->getSExtValue();
    return std::nullopt;
  }
  [[nodiscard]] Int c(std::int64_t x) const { return Int(*b_, x); }

 private:
  llvm::IRBuilder<>* b_;
  llvm::Value* v_;
};

/// An i1 at the builder's insertion point.
class Bool {
 public:
  Bool(llvm::IRBuilder<>& b, llvm::Value* v) : b_(&b), v_(v) {}
  [[nodiscard]] llvm::Value* v() const { return v_; }
  [[nodiscard]] std::optional<bool> constant() const {
    if (auto* c = llvm::dyn_cast<llvm::ConstantInt>(v_)) return !c->isZero();
    return std::nullopt;
  }
  friend Bool operator&&(Bool x, Bool y) { return {*x.b_, x.b_->CreateAnd(x.v_, y.v_)}; }
  friend Bool operator||(Bool x, Bool y) { return {*x.b_, x.b_->CreateOr(x.v_, y.v_)}; }

 private:
  llvm::IRBuilder<>* b_;
  llvm::Value* v_;
};

#define QKV_IR_INT_OP(op, make)                                                         \
  inline Int operator op(Int x, Int y) { return Int(x.b(), x.b().make(x.v(), y.v())); } \
  inline Int operator op(Int x, std::int64_t y) { return x op x.c(y); }                 \
  inline Int operator op(std::int64_t x, Int y) { return y.c(x) op y; }
QKV_IR_INT_OP(+, CreateAdd)
QKV_IR_INT_OP(-, CreateSub)
QKV_IR_INT_OP(*, CreateMul)
QKV_IR_INT_OP(/, CreateSDiv)
QKV_IR_INT_OP(%, CreateSRem)
#undef QKV_IR_INT_OP

#define QKV_IR_CMP_OP(op, make)                                                           \
  inline Bool operator op(Int x, Int y) { return Bool(x.b(), x.b().make(x.v(), y.v())); } \
  inline Bool operator op(Int x, std::int64_t y) { return x op x.c(y); }                  \
  inline Bool operator op(std::int64_t x, Int y) { return y.c(x) op y; }
QKV_IR_CMP_OP(<, CreateICmpSLT)
QKV_IR_CMP_OP(<=, CreateICmpSLE)
QKV_IR_CMP_OP(>, CreateICmpSGT)
QKV_IR_CMP_OP(>=, CreateICmpSGE)
QKV_IR_CMP_OP(==, CreateICmpEQ)
QKV_IR_CMP_OP(!=, CreateICmpNE)
#undef QKV_IR_CMP_OP

inline Int pick(Bool c, Int x, Int y) { return Int(x.b(), x.b().CreateSelect(c.v(), x.v(), y.v())); }
inline Int pick(Bool c, Int x, std::int64_t y) { return pick(c, x, x.c(y)); }
inline Int pick(Bool c, std::int64_t x, Int y) { return pick(c, y.c(x), y); }

inline Int imin(Int x, Int y) { return pick(x < y, x, y); }
inline Int imin(Int x, std::int64_t y) { return imin(x, x.c(y)); }
inline Int imin(std::int64_t x, Int y) { return imin(y.c(x), y); }
inline Int imax(Int x, Int y) { return pick(x > y, x, y); }
inline Int imax(Int x, std::int64_t y) { return imax(x, x.c(y)); }
inline Int imax(std::int64_t x, Int y) { return imax(y.c(x), y); }

}  // namespace qkv::codegen::cpu::ir
