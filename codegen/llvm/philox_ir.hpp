// codegen/llvm/philox_ir.hpp — Philox4x32-10 as IR: the twin of qkv::philox4x32
// (runtime/src/rng.cpp), so a kernel's dropout mask equals the reference interpreter's bit for bit.
#pragma once

#include <array>

#include <llvm/IR/IRBuilder.h>

namespace qkv::codegen::cpu {

/// One Philox4x32-10 block. The counter words are i32 or <N x i32> (all the same type; uniform
/// words may be splats); `key` is an i64 scalar. Returns the four output words, of the counter's type.
std::array<llvm::Value*, 4> emit_philox4x32(llvm::IRBuilder<>& b, std::array<llvm::Value*, 4> counter,
                                            llvm::Value* key);

/// dropout_keep(p, seed, batch, head, row, col) for every lane: uniform(row, col, head, batch)
/// >= float(p), where uniform = (word0 >> 8) · 2^-24. Counter words as above; returns i1 / <N x i1>.
llvm::Value* emit_dropout_keep(llvm::IRBuilder<>& b, double p, llvm::Value* seed, llvm::Value* batch, llvm::Value* head,
                               llvm::Value* row, llvm::Value* col);

}  // namespace qkv::codegen::cpu
