// codegen/cpu/kernels/attention_kernel.hpp — the IR generator of the fused attention kernel (private).
//
// The generated function processes one task, a block of query rows of one (batch, head):
//
//   void qkv_attention_<hash>(const AttentionArgs* args, i64 batch, i64 head, i64 q_begin)
//
// rows [q_begin, q_begin + query_rows) ∩ [0, L). Vector lanes run over *query rows*: Qᵀ is
// packed per task (and pre-multiplied by scale·log2 e), K and V are read in place with scalar
// broadcasts, so the online softmax needs no horizontal reduction and nothing is packed per key.
// Per K/V tile of `key_tile` keys: S = Q·Kᵀ in register blocks of qk_keys × query_vectors
// vectors → masks → tile max → exp2 → P (into a stack tile) → O += P·V in register blocks of
// pv_dims × query_vectors vectors, the accumulator rescaled by exp2(m_old − m_new) as it is
// loaded. Tiles wholly above the causal diagonal are not visited; only tiles that cross it (or
// run past S) carry element-wise masks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <qkv/codegen/cpu/attention.hpp>
#include <qkv/codegen/target.hpp>

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace qkv::codegen::cpu {

/// The register blocking of one kernel (AttentionSpec's tiling fields, resolved for a target).
struct KernelConfig {
  int lanes = 16;         // f32 per vector
  int query_vectors = 4;  // R: query rows per task = R · lanes
  int key_tile = 64;      // T: keys per online-softmax step (multiple of qk_keys)
  int qk_keys = 4;        // Ck: Q·Kᵀ block = Ck keys × R vectors of queries
  int pv_dims = 4;        // Dc: P·V block = Dc value columns × R vectors of queries
  std::string cpu;        // "target-cpu" / "target-features" of the generated function
  std::string features;
  /// x86: the kernel sets MXCSR's flush-to-zero bit while it runs (and restores the caller's).
  /// Scores pushed far below the row's max (ALiBi over thousands of keys) otherwise make the
  /// rescaled output accumulators denormal, and each denormal result costs a microcode assist:
  /// +20 % time measured for ALiBi at N = 4096, against +2–5 % with it.
  bool flush_denormals = false;
  /// bf16 storage on a host with AVX512-BF16: Q·Kᵀ and P·V by vdpbf16ps (two products per f32
  /// lane per instruction) on pairs — Qᵀ packed as (d, d+1) pairs of bf16, K read as pairs in
  /// place, P rounded to bf16 and V repacked per tile as (key, key+1) pairs. Otherwise bf16 values
  /// are converted to f32 as they are loaded and the kernel computes as for f32.
  bool dpbf16 = false;
  /// The softmax's 2^x by vrndscaleps + vscalefps (emit_exp2_scalef: 9 vector operations where
  /// the portable form takes 12): 16 lanes of AVX-512, with flush_denormals (under which both
  /// forms give the same values).
  bool scalef_exp2 = false;

  [[nodiscard]] int query_rows() const { return lanes * query_vectors; }
};

/// Blocking for `spec` on `host`: the spec's non-zero tiling fields win; the rest is chosen from
/// the vector width and register count (32 registers with AVX-512, 16 otherwise).
KernelConfig choose_kernel_config(const AttentionSpec& spec, const HostTarget& host);

/// A module holding one function `name` with the signature above.
std::unique_ptr<llvm::Module> build_attention_module(llvm::LLVMContext& context, const AttentionSpec& spec,
                                                     const KernelConfig& config, const std::string& name);

/// Adds the function `name` to an existing module (the AOT compiler puts every kernel in one).
void emit_attention_kernel(llvm::Module& module, const AttentionSpec& spec, const KernelConfig& config,
                           const std::string& name);

/// The C type of the generated function.
using AttentionKernelFn = void(const AttentionArgs* args, std::int64_t batch, std::int64_t head, std::int64_t q_begin);

}  // namespace qkv::codegen::cpu
