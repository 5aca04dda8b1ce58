// codegen/llvm/mod_ir.hpp — a mod expression (qkv/ir/mod_expr.hpp) as LLVM IR, for both targets.
//
// The kernels supply the leaves (the score, the coordinates along the axes, the lengths, loads)
// as f32 values — scalars, or vectors when lanes run over entries (the CPU kernel's lanes are
// query rows) — and emit_mod builds the arithmetic, splatting a scalar operand where the other
// is a vector. Booleans are i1 (or vectors of i1). The same expression gives its bounds over a
// block of entries (emit_mod_classify), by the interval rules of mod_bounds in mod_expr.hpp.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <llvm/IR/IRBuilder.h>

#include <qkv/codegen/cpu/attention.hpp>
#include <qkv/ir/dtype.hpp>
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

/// What a kernel needs to know of an expression before emitting it (the same for both targets).
struct ModAnalysis {
  std::vector<unsigned> deps;  // mod_deps
  std::vector<bool> reach;     // the nodes the score or keep roots read
  /// score' = score + sign · nodes[score_add] with that node free of the score: added in the
  /// kernels' log2 units with no conversion; −1 otherwise.
  int score_add = -1;
  double score_add_sign = 1.0;
  /// score' = score + sign · nodes[score_add_factor] · nodes[score_add] when the added term is a
  /// product with one factor free of the key (computed outside the key loop); −1: no factor.
  int score_add_factor = -1;
};
ModAnalysis analyse_mod(const ModExpr& e, const std::string& query_axis, const std::string& key_axis);

/// How a kernel loads an element of a mod tensor of dtype `t` (f32, f64, bool, i32, i64; the
/// others throw std::invalid_argument), and that element as f32 (booleans as 0 / 1).
llvm::Type* mod_element_type(llvm::IRBuilder<>& b, DType t);
llvm::Value* mod_element_to_f32(llvm::IRBuilder<>& b, llvm::Value* x, DType t);

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
  /// e^x and ln x for the target; nullptr (the default) takes the CPU's vector polynomials
  /// (emit_exp, emit_log2: no library calls).
  virtual llvm::Value* exp(llvm::Value* x);
  virtual llvm::Value* log(llvm::Value* x);
  /// 2^x for the target (nullptr: the CPU's emit_exp2).
  virtual llvm::Value* exp2(llvm::Value* x);
  /// The score in log2 units (score · log2 e), when that is how the kernel holds it (nullptr:
  /// not available). A softcap c · tanh(score / d) then needs no conversion and one 2^x.
  virtual llvm::Value* score_log2();
};

/// Leaves of an attention kernel, which holds the score in log2 units (score · log2 e, the
/// queries pre-scaled): score() is it in nats, converted once on first use; null: the keep
/// predicate, which may not read the score (`kernel` names the kernel in that error).
class Log2ScoreLeaves : public ModLeaves {
 public:
  Log2ScoreLeaves(llvm::IRBuilder<>& b, llvm::Value* score_log2, const char* kernel)
      : b_(b), log2_(score_log2), kernel_(kernel) {}
  llvm::Value* score() final;
  llvm::Value* score_log2() final { return log2_; }

 private:
  llvm::IRBuilder<>& b_;
  llvm::Value* log2_;
  llvm::Value* nat_ = nullptr;
  const char* kernel_;
};

/// The value of node `root`, computing what it needs into `cache` (indexed by node id; null =
/// not computed yet). Values a caller put in the cache are used as they are.
llvm::Value* emit_mod(llvm::IRBuilder<>& b, const ModExpr& e, int root, ModLeaves& leaves,
                      std::vector<llvm::Value*>& cache);

/// When node `root` is a softcap c · tanh(score / d) and the leaves have the score in log2 units:
/// its value in log2 units (c · log2 e · tanh(...), no conversion either way); else nullptr.
llvm::Value* emit_softcap_log2(llvm::IRBuilder<>& b, const ModExpr& e, int root, ModLeaves& leaves);

/// A block's bounds of one number-valued node: f32 scalars.
struct IrInterval {
  llvm::Value* lo = nullptr;
  llvm::Value* hi = nullptr;
};

/// A tile's bounds of the coordinate along `axis` in both attention kernels: queries
/// [q0, q_end), keys [k0, k_end) (i64), as f32; positions of a shifted query axis
/// (ModExpr::shifts) moved by S − L (`len_q`, `len_k`: f32). Nullopt for any other axis (a single
/// value per tile, the kernel's own).
struct TileSpan {
  llvm::Value *q0, *q_end, *k0, *k_end, *len_q, *len_k;
};
std::optional<IrInterval> tile_axis_range(llvm::IRBuilder<>& b, const ModExpr& e, const std::string& query_axis,
                                          const std::string& key_axis, const TileSpan& t, const std::string& axis,
                                          bool position);

class ModBoundsLeaves {
 public:
  virtual ~ModBoundsLeaves() = default;
  virtual IrInterval index(const std::string& axis) = 0;     // the block's range of the coordinate
  virtual IrInterval position(const std::string& axis) = 0;  // aligned
  virtual llvm::Value* length(const std::string& axis) = 0;  // f32 scalar
  /// Bounds of a load given its indices' bounds; the default is unbounded.
  virtual IrInterval load(const ModNode& n, const std::vector<IrInterval>& at);
};

/// The kernels' bounds of a load over a block (their ModBoundsLeaves::load): one load when no
/// index ranges over the block; when exactly one does and it is a coordinate (an index or
/// position leaf: a contiguous range), the min and max of the tensor over that range, by a scan
/// (document ids: a tile inside one document gives a point); otherwise unbounded. `deps` are
/// mod_deps of `e`; `extent_f32` the tensor's extents; `load` reads an element (i64 indices) as
/// f32; `loop` is the target's counted loop with carried values.
using ModLoopBody = std::function<std::vector<llvm::Value*>(llvm::Value* i, const std::vector<llvm::Value*>& carried)>;
using ModLoop = std::function<std::vector<llvm::Value*>(llvm::Value* begin, llvm::Value* end,
                                                        std::vector<llvm::Value*> init, const ModLoopBody& body)>;
IrInterval emit_load_bounds(llvm::IRBuilder<>& b, const ModExpr& e, const std::vector<unsigned>& deps, const ModNode& n,
                            const std::vector<IrInterval>& at, const std::vector<llvm::Value*>& extent_f32,
                            const std::function<llvm::Value*(const std::vector<llvm::Value*>&)>& load,
                            const ModLoop& loop);

/// Whether the keep predicate holds for every entry of the block (first) or for none (second),
/// as i1 scalars; both false: the block is partial. e.keep must be set.
std::pair<llvm::Value*, llvm::Value*> emit_mod_classify(llvm::IRBuilder<>& b, const ModExpr& e,
                                                        ModBoundsLeaves& leaves);

/// f32 index value → in-range i64 index: trunc, clamp to [0, extent − 1] (NaN → 0). Scalars or
/// vectors.
llvm::Value* mod_clamp_index(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* extent_f32);

/// The modified score of one entry (scalar or vector) in log2 units, from its score `s` in log2
/// units (the attention kernels' queries are pre-scaled by log2 e): with a score_add term,
/// s ± log2 e·[factor·]term; a softcap at the root, in log2 units directly (`leaves` hold the
/// entry with its score in log2 units); otherwise the expression in nats, times log2 e.
/// `value(root, score)` evaluates a node for the entry (score: s, or null when it needs none)
/// and returns it in the type of s. s itself when the expression has no score modification.
llvm::Value* modified_score_log2(llvm::IRBuilder<>& b, const ModExpr& e, const ModAnalysis& info, llvm::Value* s,
                                 ModLeaves& leaves, const std::function<llvm::Value*(int, llvm::Value*)>& value);

// --- the mod's tensors and axes as both attention kernels (CPU, NVPTX) see them

/// A tensor the mod reads: base pointer, extents (i64 and f32) and row-major strides.
struct ModTensorIn {
  llvm::Value* base = nullptr;
  std::vector<llvm::Value*> extent, extent_f32, stride;
};

/// The mod's tensors (EffectiveMod::tensors, in order): key_keep [B, S] at `keep`, bias [L, S]
/// at `bias`, or the next captured tensor of the pointer table `table` with its extents (i64,
/// rank of each) from `extents`. `table` and `extents` are read only for captured tensors.
std::vector<ModTensorIn> mod_tensors(llvm::IRBuilder<>& b, const std::vector<cpu::ModTensor>& tensors,
                                     llvm::Value* keep, llvm::Value* bias, llvm::Value* table, llvm::Value* extents,
                                     llvm::Value* batch, llvm::Value* len_q, llvm::Value* len_k);

/// The row-major offset of `t`'s element at `index` (one i64 per axis, scalars or <lanes x i64>
/// vectors): a vector when any index is one.
llvm::Value* mod_element_offset(llvm::IRBuilder<>& b, const ModTensorIn& t, const std::vector<llvm::Value*>& index,
                                int lanes);

/// The element of `t` at `index` (one i64 per axis, in range; scalars, or <lanes x i64> vectors
/// where the index varies over the lanes — a gather), as f32.
llvm::Value* load_mod_element(llvm::IRBuilder<>& b, const ModTensorIn& t, DType dtype,
                              const std::vector<llvm::Value*>& index, int lanes);

/// The length of a mod axis in this call: L, S, B, or a head axis's extent (f32).
llvm::Value* mod_axis_length(llvm::IRBuilder<>& b, const cpu::ModAxes& axes, const std::string& axis,
                             llvm::Value* len_qf, llvm::Value* len_kf, llvm::Value* nbatch);

/// The coordinate along head axis `axis` of flat query head `head` (i64), as f32; nullptr when
/// `axis` is not a head axis.
llvm::Value* mod_head_coordinate(llvm::IRBuilder<>& b, const cpu::ModAxes& axes, const std::string& axis,
                                 llvm::Value* head);

}  // namespace qkv::codegen
