// codegen/llvm/ir_util.hpp — small helpers for emitting LLVM IR with an IRBuilder: counted
// loops with loop-carried SSA values, entry-block allocas, constants. Private to codegen.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <llvm/IR/IRBuilder.h>

namespace qkv::codegen::cpu::ir {

/// The body of a counted loop: given the induction variable and the current values of the
/// loop-carried variables, emit the body at the builder's insertion point (it may create
/// blocks) and return the values for the next iteration (same count and types).
using LoopBody = std::function<std::vector<llvm::Value*>(llvm::Value* i, const std::vector<llvm::Value*>& carried)>;

/// What the optimiser may do to a loop. Loops whose bodies are already unrolled and vectorised
/// by the generator say `as_written`: unrolling them again only grows the code (and the JIT's
/// compile time) without making it faster.
enum class Unroll { allowed, as_written };

/// for (i = begin; i < end; i += step) — i64, signed compare, guarded (zero trips allowed) and
/// rotated (one compare per iteration, at the latch). Returns the carried values after the loop
/// (their initial values when it runs zero times); the builder is left in the exit block.
std::vector<llvm::Value*> emit_loop(llvm::IRBuilder<>& b, llvm::Value* begin, llvm::Value* end, std::int64_t step,
                                    std::vector<llvm::Value*> init, const LoopBody& body, const llvm::Twine& name,
                                    Unroll unroll = Unroll::as_written);

/// The same without carried values.
void emit_loop(llvm::IRBuilder<>& b, llvm::Value* begin, llvm::Value* end, std::int64_t step,
               const std::function<void(llvm::Value* i)>& body, const llvm::Twine& name,
               Unroll unroll = Unroll::as_written);

/// An alloca of `count` elements of `type` in the function's entry block (where SROA and
/// mem2reg look for them), aligned to `align` bytes.
llvm::AllocaInst* entry_alloca(llvm::IRBuilder<>& b, llvm::Type* type, std::uint64_t count, std::uint64_t align,
                               const llvm::Twine& name);

inline llvm::Value* i64c(llvm::IRBuilder<>& b, std::int64_t v) { return b.getInt64(static_cast<std::uint64_t>(v)); }

}  // namespace qkv::codegen::cpu::ir
