// qkv/codegen/cpu/attention.hpp — what the fused CPU attention kernel computes, and on what.
//
// One forward attention, fused (FlashAttention's algorithm: K/V streamed in tiles, online
// softmax, the L×S matrix never stored unless the weights are asked for):
//
//   s[b,h,i,j] = scale · Σ_d q[b,h,i,d] · k[b,h/G,j,d]            G = hq / hkv (GQA; MQA: hkv = 1)
//              + bias[i,j]                                          (if spec.bias)
//              → −inf where key_keep[b,j] == 0                       (if spec.key_padding)
//              → −inf where j > i (top-left) or j > i + S − L        (if spec.causal; `align`)
//              → spec.mod: s' = score expression, −inf where the keep expression is false
//                (qkv/ir/mod_expr.hpp; its loads read args.tensors)
// The flags causal / key_padding / bias are shorthands: the kernel turns them into terms of one
// expression (effective_mod) and has a single code path for every modification.
//   p[b,h,i,:] = softmax_j(s[b,h,i,:])        a row with no visible key: all zeros, never NaN
//   p          = dropout(p)                   keep iff qkv::dropout_keep(p, seed, b, h, i, j);
//                                             kept entries scaled by 1/(1 − dropout_p)
//   out[b,h,i,:] = Σ_j p[b,h,i,j] · v[b,h/G,j,:]      weights[b,h,i,j] = p (after dropout)
//
// These are the pinned semantics of the reference interpreter (docs/semantics.md) for the graph
// contract<HeadDim> → scaled → biased / masked / causal → softmax<Key> → dropout → contract<Key>,
// with the dropout index convention (batch, head, row, col) = (b, h, i, j), h the query head.
// Arithmetic is fp32 with fp32 accumulation — P·V summed per tile of keys from zero, each tile's sum
// added to the output by Fast2Sum with its rounding error kept (the fused kernel), or per tile and
// per chunk merged by log-sum-exp (the split-KV kernel), so a long row's error stays within 2 ×
// PyTorch fp32's (tests/numerics/test_long_rows.cpp); exp is a vector polynomial (rel. error ~2e-7) whose
// results below 2^-126 flush to zero.
//
// No LLVM here: the kernel generator and the JIT stay in codegen's .cpp files.
#pragma once

#include <cstddef>
#include <cstdint>

#include <string>
#include <vector>

#include <qkv/ir/dtype.hpp>
#include <qkv/ir/mod_expr.hpp>

namespace qkv::codegen::cpu {

/// How the axis names of a mod expression map onto the kernel's (batch, head, query, key):
/// a head axis's coordinate is (h / stride) % extent of the flat query head h.
struct ModAxes {
  std::string batch = "b", query = "q", key = "k";
  struct Head {
    std::string name;
    std::int64_t stride = 1, extent = 1;
    friend bool operator==(const Head&, const Head&) = default;
  };
  std::vector<Head> heads;  // empty: one axis "h" spanning all query heads
  friend bool operator==(const ModAxes&, const ModAxes&) = default;
};

/// Where a load of the mod expression reads: args.tensors[k] for captured tensor k (row-major,
/// its extents at args.extents[offset...]), or the shorthand masks.
struct ModTensor {
  enum class Source : std::uint8_t { captured, key_keep, bias } source = Source::captured;
  DType dtype = DType::f32;
  int rank = 1;
  friend bool operator==(const ModTensor&, const ModTensor&) = default;
};

/// Everything the generated code is specialised on. Two equal specs share one compiled kernel
/// (per host target); the sizes that vary from call to call (batch, L, S) and the dropout seed
/// are run-time arguments in AttentionArgs.
struct AttentionSpec {
  std::int64_t dk = 64;  // query/key head width
  std::int64_t dv = 64;  // value head width (may differ from dk)
  std::int64_t hq = 1;   // query heads
  std::int64_t hkv = 1;  // key/value heads; hq % hkv == 0, query head h reads kv head h / (hq / hkv)
  /// Factor applied to q·k. 0 means the default 1/sqrt(dk).
  double scale = 0.0;
  bool causal = false;
  CausalAlign align = CausalAlign::top_left;  // only read when causal (and only matters when L != S)
  bool key_padding = false;    // AttentionArgs::key_keep is a u8 keep-mask [B, S] (non-zero = may attend)
  bool bias = false;           // AttentionArgs::bias is an f32 additive mask [L, S], broadcast over B and H
  double dropout_p = 0.0;      // in [0, 1); 0 compiles no dropout code at all
  bool write_weights = false;  // also write the attention weights [B, Hq, L, S] (two passes over K)
  bool write_lse = false;      // also write the log-sum-exp of each row's modified scores [B, Hq, L]
  /// How q, k, v and out are stored: f32, or bf16 (the scores, the softmax and the accumulators
  /// stay f32; the fused kernel on a host with AVX512-BF16 rounds P to bf16 for P·V, as
  /// FlashAttention does, the split-KV decode kernel keeps P f32 and rounds only the output;
  /// weights and lse stay f32).
  DType storage = DType::f32;
  /// Score / mask modifications (after the flags above); loads read `tensors` (load input k =
  /// tensors[k]).
  ModExpr mod;
  ModAxes axes;
  std::vector<ModTensor> tensors;
  /// The backward only: the tensors (spec.tensors indices) whose gradients it computes, through
  /// the loads of the mod's score part. Each is summed into partial copies, one per slot, then
  /// added in slot order (deterministic, no atomics): a slot runs over the batch, the kv head
  /// and the chunk of keys of the task — over those of them two tasks could share an entry in
  /// (per_*; false where every load indexes the tensor along that coordinate itself).
  struct TensorGrad {
    int tensor = 0;
    bool per_batch = true, per_kv_head = true, per_chunk = true;
    friend bool operator==(const TensorGrad&, const TensorGrad&) = default;
  };
  std::vector<TensorGrad> tensor_grads;

  // --- tiling: 0 = chosen for the host (see choose_kernel_config in codegen/cpu/kernels). Exposed
  // for tuning and for tests that want to force odd shapes through small tiles.
  int vector_floats = 0;  // f32 lanes per vector (16 = AVX-512, 8 = AVX2, 4 = SSE)
  int query_vectors = 0;  // query rows per task = query_vectors · vector_floats (lanes are queries)
  int key_tile = 0;       // keys per K/V tile (one online-softmax step); a multiple of qk_keys
  int qk_keys = 0;        // keys per Q·Kᵀ register block (accumulators: qk_keys × query_vectors)
  int pv_dims = 0;        // value columns per P·V register block (accumulators: pv_dims × query_vectors)
  /// The split-KV decode kernel (keys in the lanes, the query heads of a GQA group together, the
  /// keys split into chunks merged by their log-sum-exp) runs the calls with L <= decode_queries:
  /// 0 = the default (4), −1 = never. It needs no weights, no dropout and head widths that are
  /// whole vectors; otherwise the fused kernel runs every call.
  int decode_queries = 0;
  int decode_chunk = 0;  // keys per split-KV chunk (0: chosen from S and the number of tasks)

  /// The factor actually applied: `scale`, or 1/sqrt(dk) when it is 0.
  [[nodiscard]] double effective_scale() const;
  /// A stable 64-bit hash of every field (FNV-1a), part of the kernel cache key.
  [[nodiscard]] std::uint64_t hash() const;
  friend bool operator==(const AttentionSpec&, const AttentionSpec&) = default;
};

/// The tensors of one call, contiguous row-major; q, k, v and out hold floats, or the bits of
/// bf16 values (uint16_t) when spec.storage is bf16; the others are f32 (or u8) always:
///   q [B, Hq, L, Dk], k [B, Hkv, S, Dk], v [B, Hkv, S, Dv], out [B, Hq, L, Dv],
///   except that K and V may be the first S rows of [B, Hkv, kv_rows, D] (a KV cache of that
///   capacity, read in place: head (b, h) starts at row (b·Hkv + h)·kv_rows),
///   weights [B, Hq, L, S] (only with spec.write_weights; every entry is written),
///   lse [B, Hq, L] (only with spec.write_lse),
///   key_keep [B, S] u8 (only with spec.key_padding), bias [L, S] f32 (only with spec.bias).
/// The generated code reads this struct directly: its layout is part of the kernel ABI.
struct AttentionArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* weights = nullptr;
  const std::uint8_t* key_keep = nullptr;
  const float* bias = nullptr;
  const void* const* tensors = nullptr;   // spec.tensors' captured data, in order
  const std::int64_t* extents = nullptr;  // their extents, concatenated (rank of each)
  std::int64_t batch = 0;
  std::int64_t len_q = 0;    // L
  std::int64_t len_k = 0;    // S
  std::uint64_t seed = 0;    // dropout seed (the Philox key)
  float* lse = nullptr;      // [B, Hq, L] (only with spec.write_lse): ln Σ_j e^{s'_ij}, −inf for an empty row
  std::int64_t kv_rows = 0;  // rows per K/V head as stored (>= S); 0: S (dense)
};

/// Floats per partial result of the split-KV decode kernels (CPU and PTX) for one query row and
/// one chunk of keys: the row's max in log2 units, its sum of 2^(s − max) and the dv outputs
/// Σ 2^(s − max)·v, unnormalised — what their merges combine.
inline std::int64_t decode_record_floats(const AttentionSpec& spec) { return spec.dv + 2; }

/// The one expression the kernel computes: the flags' terms (bias, key padding, causal) followed
/// by spec.mod, over spec.axes' names, with tensors() listing where each load reads.
struct EffectiveMod {
  ModExpr expr;
  std::vector<ModTensor> tensors;
  ModAxes axes;
};
[[nodiscard]] EffectiveMod effective_mod(const AttentionSpec& spec);

/// Whether the work per query block grows with the query (causal-like: the keep predicate
/// relates query and key positions): tasks are then handed out heaviest first.
[[nodiscard]] bool triangular_work(const AttentionSpec& spec);

/// FLOPs of the forward pass as the benchmarks count them: 4·B·Hq·L·S·D, D = (dk + dv) / 2;
/// half of that for causal attention with L == S.
[[nodiscard]] double attention_flops(const AttentionSpec& spec, std::int64_t batch, std::int64_t len_q,
                                     std::int64_t len_k);

}  // namespace qkv::codegen::cpu
