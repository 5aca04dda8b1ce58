// codegen/llvm/mod_ir.hpp — a mod expression (qkv/ir/mod_expr.hpp) as LLVM IR, for both targets.
//
// The kernels supply the leaves (the score, the coordinates along the axes, the lengths, loads)
// as f32 values — scalars, or vectors when lanes run over entries (the CPU kernel's lanes are
// query rows) — and emit_mod builds the arithmetic, splatting a scalar operand where the other
// is a vector. Booleans are i1 (or vectors of i1). The same expression gives its bounds over a
// block of entries (emit_mod_classify), by the interval rules of mod_bounds in mod_expr.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <llvm/IR/IRBuilder.h>

#include <qkv/ir/mod_expr.hpp>

namespace qkv::codegen {

/// What each node depends on, as bits: so a kernel can compute it at the right loop level.
enum ModDep : unsigned {
  kDepQuery = 1,  // the query coordinate
  kDepKey = 2,    // the key coordinate
  kDepScore = 4,  // the score itself
};
/// Per node, the ModDep bits of the node and everything it reads.
std::vector<unsigned> mod_deps(const ModExpr& e, const std::string& query_axis, const std::string& key_axis);

/// The leaves of an expression, as a kernel computes them.
class ModLeaves {
 public:
  virtual ~ModLeaves() = default;
  virtual llvm::Value* score() = 0;                            // f32
  virtual llvm::Value* index(const std::string& axis) = 0;     // f32: the coordinate
  virtual llvm::Value* position(const std::string& axis) = 0;  // f32: aligned for the query axis
  virtual llvm::Value* length(const std::string& axis) = 0;    // f32 scalar
  /// The element of the node's tensor at the given indices (i64 scalars or vectors, already
  /// rounded toward zero and clamped into range by emit_mod), as f32.
  virtual llvm::Value* load(const ModNode& n, const std::vector<llvm::Value*>& at) = 0;
  /// The tensor's extent along axis k, as f32 (for the clamp).
  virtual llvm::Value* extent(const ModNode& n, std::size_t k) = 0;
  /// e^x and ln x for the target; nullptr (the default) takes the CPU's vector polynomial for
  /// exp and llvm.log for log.
  virtual llvm::Value* exp(llvm::Value* x);
  virtual llvm::Value* log(llvm::Value* x);
};

/// The value of node `root`, computing what it needs into `cache` (indexed by node id; null =
/// not computed yet). Values a caller put in the cache are used as they are.
llvm::Value* emit_mod(llvm::IRBuilder<>& b, const ModExpr& e, int root, ModLeaves& leaves,
                      std::vector<llvm::Value*>& cache);

/// A block's bounds of one number-valued node: f32 scalars.
struct IrInterval {
  llvm::Value* lo = nullptr;
  llvm::Value* hi = nullptr;
};

class ModBoundsLeaves {
 public:
  virtual ~ModBoundsLeaves() = default;
  virtual IrInterval index(const std::string& axis) = 0;     // the block's range of the coordinate
  virtual IrInterval position(const std::string& axis) = 0;  // aligned
  virtual llvm::Value* length(const std::string& axis) = 0;  // f32 scalar
  /// Bounds of a load given its indices' bounds; the default is unbounded.
  virtual IrInterval load(const ModNode& n, const std::vector<IrInterval>& at);
};

/// Whether the keep predicate holds for every entry of the block (first) or for none (second),
/// as i1 scalars; both false: the block is partial. e.keep must be set.
std::pair<llvm::Value*, llvm::Value*> emit_mod_classify(llvm::IRBuilder<>& b, const ModExpr& e,
                                                        ModBoundsLeaves& leaves);

/// f32 index value → in-range i64 index: trunc, clamp to [0, extent − 1] (NaN → 0). Scalars or
/// vectors.
llvm::Value* mod_clamp_index(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* extent_f32);

}  // namespace qkv::codegen
