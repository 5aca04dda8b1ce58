// codegen/cpu/kernels/decode_kernel.hpp — the split-KV ("flash-decoding") attention kernel for a
// few query rows against many keys (private).
//
// The fused kernel puts query rows in its vector lanes: at decode (L = 1) fifteen of sixteen
// lanes would idle. This kernel puts *keys* in the lanes and runs one task per
//
//   unit  = (batch, kv head, block of `rows` query heads of that kv head's group, query row i)
//   chunk = keys [c·chunk_len, (c + 1)·chunk_len) ∩ [0, S)
//
// so each K/V row of a chunk is loaded once for every query head of the block (GQA: the whole
// group). Per tile of `key_tile` keys, in groups of `lanes` keys:
//   scores   for each key, the products q_r · K[key] of the block's rows as lane-wise partial
//            sums (d in the lanes), then a transposing tree of shuffles and adds that leaves
//            the group's `lanes` scores of row r in one vector (keys in the lanes)
//   mods     the effective mod with the key coordinate a vector, the query's a scalar
//   softmax  online, per row: a scalar running max m and a vector running sum l (log2 units)
//   P·V      O_r += p_r[key] · V[key] in blocks of pv_vectors vectors of value columns × rows
// A chunk then writes either the finished rows (one chunk: out = O / l, lse) or its partial
// result (m, l, O unnormalised) to a workspace, and the merge function combines the chunks of
// a unit by their log-sum-exp: M = max_c m_c, w_c = 2^(m_c − M), out = Σ w_c O_c / Σ w_c l_c.
// The split (schedule.hpp, split_kv) depends only on the sizes, never on the thread count.
// bf16 storage (spec.storage): V rows (and K rows, see below) are loaded as 16-bit vectors and
// widened as loaded (exact); everything after — scores, softmax, P, the accumulators and the
// chunks' partial records — is f32, and only the output is rounded to bf16, at its store
// (nearest even). With AVX512-BF16 and dk a multiple of 2·lanes, Q·K runs on vdpbf16ps over
// pairs of features as stored (exact products summed in f32; the scores scaled after).
#pragma once

#include <cstdint>
#include <string>

#include <qkv/codegen/cpu/attention.hpp>

#include "cpu/kernels/attention_kernel.hpp"

namespace llvm {
class Module;
}  // namespace llvm

namespace qkv::codegen::cpu {

struct DecodeConfig {
  int lanes = 16;            // keys per score vector
  int rows = 1;              // query heads per unit: a divisor of the group size, at most kDecodeMaxRows
  int key_tile = 64;         // keys per online-softmax step, a multiple of lanes
  int pv_vectors = 4;        // value-column vectors per P·V register block
  std::int64_t nblocks = 1;  // head blocks per kv head: group / rows
};

/// Most query heads one unit carries (the scores' registers: rows × lanes partial vectors).
inline constexpr int kDecodeMaxRows = 16;

/// Whether the decode kernel can compute `spec` at all (its static conditions): no weights and
/// no dropout (the fused kernel does those), a positive limit on L (spec.decode_queries >= 0),
/// head widths that are whole vectors of `config.lanes` floats, a power-of-two width, and q, k,
/// v, out stored as f32 or bf16.
bool decode_kernel_supported(const AttentionSpec& spec, const KernelConfig& config);

/// The most query rows a call may have for the decode kernel to run it (0: never).
std::int64_t decode_max_queries(const AttentionSpec& spec, const KernelConfig& config);

DecodeConfig choose_decode_config(const AttentionSpec& spec, const KernelConfig& config);

/// Adds to `module` the kernel `name` and its merge `name`_merge:
///   void name(const AttentionArgs* args, i64 unit, i64 chunk, i64 chunk_len, i64 chunks, float* partials)
///   void name_merge(const AttentionArgs* args, i64 unit, i64 chunks, const float* partials)
/// units are numbered ((batch · Hkv + kv head) · nblocks + head block) · L + i. partials null:
/// the task is the unit's only chunk and writes its rows to args.out (and args.lse); else it
/// writes record (unit · rows + r) · chunks + chunk of decode_record_floats(spec) floats
/// [m, l, O[0..dv)] per row r, and name_merge reads them all.
void emit_decode_kernels(llvm::Module& module, const AttentionSpec& spec, const KernelConfig& config,
                         const std::string& name);

using DecodeKernelFn = void(const AttentionArgs* args, std::int64_t unit, std::int64_t chunk, std::int64_t chunk_len,
                            std::int64_t chunks, float* partials);
using DecodeMergeFn = void(const AttentionArgs* args, std::int64_t unit, std::int64_t chunks, const float* partials);

}  // namespace qkv::codegen::cpu
