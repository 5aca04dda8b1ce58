// qkv/codegen/nvptx.hpp — GPU kernels generated as LLVM IR for nvptx64-nvidia-cuda and emitted
// as PTX text (sm_80 / sm_90), plus a ptxas wrapper that reports registers, shared memory, spills.
//
//   using namespace qkv::codegen::nvptx;
//   AttentionKernel a;  a.spec.dk = a.spec.dv = 64;  a.spec.hq = 8;  a.spec.hkv = 2;  a.spec.causal = true;
//   PtxKernel k = emit_ptx(a, 90);                    // k.ptx: the module; k.name: its .entry
//   Dim3 grid = attention_grid(a, batch, len_q);      // launch k.name with grid, (k.block_x, k.block_y,
//                                                     // k.block_z) and k.shared_bytes dynamic smem
//   std::string why;
//   if (auto r = run_ptxas(k.ptx, 90, &why)) ... r->registers, r->spill_stores ...
//
// Every kernel is fp32 (but the attention's bf16 storage) and takes plain device pointers (4-byte alignment suffices)
// and i64 sizes, in the order documented at each request type below; the launcher passes them as kernel parameters in
// that order. Every emitted PTX starts with comment lines
//   // qkv kernel: <C-like signature>
//   // launch: grid <rule> block (x,y,z) dynamic shared <bytes> B
// A grid with a zero extent means "nothing to do": do not launch it.
//
// Errors (a spec that cannot be generated, an sm that is not supported, a module that does not
// verify, a backend failure) are thrown as std::runtime_error with a message; nothing aborts.
// No LLVM here: the generators live in codegen/nvptx.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include <qkv/codegen/cpu/attention.hpp>

namespace qkv::codegen::nvptx {

/// A CUDA launch extent.
struct Dim3 {
  std::int64_t x = 1, y = 1, z = 1;
  friend bool operator==(const Dim3&, const Dim3&) = default;
};

/// Fused attention forward (FlashAttention-2 style), with exactly the semantics of
/// qkv/codegen/cpu/attention.hpp (GQA, key padding, bias, causal alignment, the mod expression —
/// score modifications and keep predicates over any of the score's axes, loads of captured
/// tensors —, dropout with the same Philox mask, rows with no visible key → zeros, optional
/// weights). K/V tiles whose entries the keep predicate rejects for the whole block are skipped.
///
///   void name(const float* q, const float* k, const float* v, float* out, float* weights,
///             const uint8_t* key_keep, const float* bias, const void* const* tensors,
///             const int64_t* extents, i64 batch, i64 len_q, i64 len_k, i64 seed)
///
/// — AttentionArgs' fields in order; weights / key_keep / bias are read only when the spec asks
/// for them (pass null otherwise). tensors / extents (device memory, read only when spec.tensors
/// has captured tensors): the device address of each captured tensor of spec.tensors in order
/// (row-major, of its dtype; bool one byte per element), and their extents concatenated (rank of
/// each). out must not overlap the inputs. Specs the kernel cannot evaluate (a keep predicate
/// that reads the score, a 16-bit float tensor, an axis the scores lack) are refused by
/// attention_shared_bytes / attention_grid / emit_ptx alike.
///
/// spec.storage == bf16: q, k, v, out hold bf16 bits (uint16, 16-byte aligned) and the kernel runs
/// on tensor cores (mma.sync m16n8k16 bf16 → fp32, ldmatrix; codegen/nvptx/attention_mma_ptx.cpp)
/// with the CPU kernel's bf16 semantics: scores, softmax and accumulators fp32, P rounded to bf16
/// for P·V, out rounded to bf16, lse f32. It refuses write_weights, dropout and head widths that
/// are not multiples of 16 in [16, 128] (attention_supported says why); block_q is 16 rows per
/// warp (0 or 16·threads/32), block_k a multiple of 16 up to 128 (0: 64), threads at most 256.
/// grid (ceil(L / block_q), Hq, B), block (threads, 1, 1), dynamic shared memory shared_bytes
/// (attention_shared_bytes; above 48 KiB the launcher must first raise
/// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to it). L = 0 or B = 0: nothing to launch.
struct AttentionKernel {
  cpu::AttentionSpec spec;  // the CPU tiling fields (vector_floats, …) are ignored
  /// Query rows per block. 0: 64 when dv <= 128, else 32. Must be a multiple of 4·(threads / 32)
  /// with at most 8 rows per thread.
  int block_q = 0;
  /// Keys per K/V tile (one online-softmax step). 0: 64 when dk, dv <= 64, else 32. A multiple of 8,
  /// at most 128.
  int block_k = 0;
  /// Threads per block: a multiple of 32, at most 512 (4 warps by default).
  int threads = 128;
  // Each thread carries R·(block_k/8 + ~dv/8) fp32 accumulators, R = block_q / (4·warps); more
  // than 160 is refused (ptxas would spill): lower block_q for wide heads. The kernels are
  // annotated .maxntid threads and .minnctapersm 1, so ptxas may use up to 255 registers.
  friend bool operator==(const AttentionKernel&, const AttentionKernel&) = default;
};

/// The fused attention backward (FlashAttention-2's algorithm: fp32 FMA, or with bf16 storage
/// mma.sync on tensor cores, sm_80+) of the forward
/// AttentionKernel computes, with the semantics of qkv/codegen/cpu/run_attention_backward.hpp:
/// P = exp(f(s) − lse) recomputed tile by tile from the forward's log-sum-exp, D = rowsum(dO ∘ O),
/// dV = Pᵀ dO, dS = P ∘ (dP − D) ∘ f'(s), dQ = scale · dS K, dK = scale · dSᵀ Q — score mods
/// differentiated in the kernel (mod_with_derivatives), dropout replayed from the forward's Philox
/// counters, GQA summed over the group's query heads straight into the kv head's dK / dV, tiles
/// the keep predicate never keeps skipped. Two kernels (`part`), launched in this order:
///   dq:   one block per (query tile, query head, batch): D of its rows (written to delta), then
///         its dQ over the key tiles in order;
///   dkdv: one block per (key tile, kv head, batch): its keys' dK and dV over the group's query
///         heads and the query tiles in order (reads delta).
/// Deterministic by construction: every output element is summed by one thread in a fixed
/// order — no atomics, no partial buffers.
///
///   void name(const float* q, const float* k, const float* v, const float* out,
///             const float* d_out, const float* lse, float* delta, float* dq, float* dk, float* dv,
///             const uint8_t* key_keep, const float* bias, const void* const* tensors,
///             const int64_t* extents, i64 batch, i64 len_q, i64 len_k, i64 seed)
///
/// q, k, v, out, d_out, dq, dk, dv as in AttentionBackwardArgs (bf16 storage: bf16 bits, 16-byte
/// aligned; P and dS rounded to bf16 for the products, each gradient rounded once — the CPU
/// kernel's vdpbf16ps rule); lse and delta [B, Hq, L], f32; the mod's tables as for
/// AttentionKernel. A part reads or writes only what it needs (dq: no dk / dv; dkdv: no out, dq).
/// Refused (attention_backward_supported says why): f32 head widths past 256, bf16 head widths
/// that are not multiples of 16 in [16, 128].
/// The gradients of the tensors a mod reads (spec.tensor_grads, f32) take a third launch: dkdv
/// adds each block's share into its own slot of partial sums — a copy of the tensor per dkdv
/// block, ceil(S / block_k) · Hkv · B of them, whose buffers' addresses follow the extents in the
/// tensor table — and then `dtensor` (the same request with part = dtensor: the dkdv tiling,
/// no shared memory; grid (64, 1, 1)) sums the slots in slot order into slot 0, which is the
/// gradient. Deterministic, no atomics. bf16 tiles: dq blocks own 16 query rows a warp (block_q = 16·warps; block_k a
/// multiple of 16 up to 128, default 64, 32 past D = 64), dkdv blocks 16 keys a warp (block_q
/// likewise, default 32).
/// grid: dq (ceil(L / block_q), Hq, B), dkdv (ceil(S / block_k), Hkv, B) — attention_backward_grid;
/// block (threads, 1, 1), dynamic shared memory attention_backward_shared_bytes.
struct AttentionBackwardKernel {
  enum class Part { dq, dkdv, dtensor };
  cpu::AttentionSpec spec;  // the forward's spec (the CPU tiling fields are ignored)
  Part part = Part::dq;
  /// Query rows and keys per tile: 0 for the defaults (4 warps — dq: 64 × 32, 32 × 32 for heads
  /// wider than 64; dkdv: 32 × 32: its dK and dV rows, the dropout counters and the mod's values
  /// fill the registers). block_q a multiple of 4·warps with at most 8 rows per thread; block_k
  /// a multiple of 8 (dkdv: also of 4·warps) up to 128.
  int block_q = 0;
  int block_k = 0;
  int threads = 128;  // a multiple of 32, at most 512
  friend bool operator==(const AttentionBackwardKernel&, const AttentionBackwardKernel&) = default;
};

/// Split-KV ("flash-decoding") attention for a few query rows against many keys, with the
/// semantics of AttentionKernel for its spec (no weights, no dropout). One block per (key chunk,
/// unit), unit = (batch · Hkv + kv head) · L + i: the block carries the G = Hq / Hkv query heads of
/// the kv head's group for query row i, so each K/V row it reads serves all of them; its warps
/// take the chunk's keys in turn (lanes over the head dimension, scores by butterfly sums), keep
/// an online softmax per head in registers, and are combined through shared memory.
///
///   void name(const float* q, const float* k, const float* v, float* out, const uint8_t* key_keep,
///             const float* bias, const void* const* tensors, const int64_t* extents, i64 batch,
///             i64 len_q, i64 len_k, float* lse, i64 chunk_len, float* partials)
///
/// grid (chunks, B·Hkv·L, 1) and chunk_len from decode_split, block (threads, 1, 1), dynamic
/// shared memory shared_bytes. partials null (one chunk): the block writes out (and lse). Else it
/// writes record ((unit · G + r) · chunks + chunk) of cpu::decode_record_floats(spec) floats [m, l, O] per head r (m in
/// log2 units, O unnormalised) and DecodeMergeKernel finishes the rows.
struct DecodeAttentionKernel {
  cpu::AttentionSpec spec;  // the CPU tiling fields are ignored
  int threads = 128;        // a multiple of 32, at most 512
  friend bool operator==(const DecodeAttentionKernel&, const DecodeAttentionKernel&) = default;
};

/// The merge of DecodeAttentionKernel's chunks by their log-sum-exp: M = max m_c,
/// out = Σ 2^(m_c − M)·O_c / Σ 2^(m_c − M)·l_c (0 for a row with no visible key), lse.
///
///   void name(float* out, float* lse, const float* partials, i64 batch, i64 len_q, i64 chunks)
///
/// grid (B·Hkv·L, 1, 1), block (threads, 1, 1), no shared memory.
struct DecodeMergeKernel {
  cpu::AttentionSpec spec;
  int threads = 128;
  friend bool operator==(const DecodeMergeKernel&, const DecodeMergeKernel&) = default;
};

/// y[M,N] = x[M,K] · W[N,K]ᵀ + b[N] (nn.Linear's layout; b may be null), any M, N, K >= 0.
///
///   void name(const float* x, const float* w, const float* b, float* y, i64 m, i64 n, i64 k)
///
/// y must not overlap x, w or b. grid (ceil(M / block_m), ceil(N / block_n), 1) — M·N == 0:
/// nothing to launch — block (block_m / 8 · block_n / 4, 1, 1), no dynamic shared memory (the
/// tiles are static shared memory). Each thread computes an 8×4 micro-tile.
///
/// storage == bf16: x, w, b, y hold bf16 bits (uint16; any alignment of 2) and the kernel runs on
/// tensor cores (mma.sync m16n8k16 bf16 → fp32; codegen/nvptx/linear_mma_ptx.cpp): fp32 sums,
/// the bias added in fp32, y rounded to bf16 (nearest even) — a linear of bf16 tensors as the CPU
/// computes it, up to the order of the sums. block_m, block_n multiples of 16 in [16, 128],
/// block_k a multiple of 16 up to 64; block (2·block_m, 1, 1): warp w computes rows
/// [16w, 16w + 16) of the block. The CUDA backend's plan runs a linear of bf16 x and W on it
/// (cuda/plan.cpp, linear_bf16): the bias read as stored and y written as the bf16 value of the
/// convert legalize-dtypes put after the linear's f32 value.
struct LinearKernel {
  int block_m = 64;            // multiple of 8
  int block_n = 64;            // multiple of 4; (block_m / 8)·(block_n / 4) a multiple of 32, <= 1024
  int block_k = 16;            // depth of one shared-memory K slice
  DType storage = DType::f32;  // f32, or bf16 (tensor cores)
  friend bool operator==(const LinearKernel&, const LinearKernel&) = default;
};

/// Layer norm over the contiguous last axis, one warp per row, two passes (mean, then the biased
/// variance Σ(x − mean)²/n), eps inside the square root — as qkv::codegen::cpu::run_layer_norm.
///
///   void name(const float* x, const float* gamma, const float* beta, float* y, i64 rows, i64 n, float eps)
///
/// y may alias x. grid (ceil(rows / (threads / 32)), 1, 1), block (threads, 1, 1), no shared memory.
struct LayerNormKernel {
  int threads = 128;  // a multiple of 32, <= 1024: threads / 32 rows per block
  friend bool operator==(const LayerNormKernel&, const LayerNormKernel&) = default;
};

enum class ElementwiseOp : std::uint8_t {
  relu,   // y = max(a, 0): NaN stays NaN, −0 becomes +0 (the reference interpreter's relu)
  gelu,   // y = a·Φ(a), exact erf form (the CPU kernel's erfc fit, max abs error ~3e-7)
  add,    // y = a + b (equal sizes: the residual add)
  scale,  // y = a · factor (factor baked into the kernel)
};

/// An elementwise map over count floats, grid-stride loop.
///
///   void name(const float* a, const float* b_or_null, float* y, i64 count)
///
/// b is read only by `add`. y may alias a or b. Any grid.x >= 1 is correct:
/// elementwise_grid gives min(ceil(count / threads), 65535). count == 0: nothing to launch.
struct ElementwiseKernel {
  ElementwiseOp op = ElementwiseOp::relu;
  float factor = 1.0f;  // `scale` only
  int threads = 256;    // a multiple of 32, <= 1024
  friend bool operator==(const ElementwiseKernel&, const ElementwiseKernel&) = default;
};

/// dst[i] = src[offset + Σ_a coord_a(i) · stride_a], i in [0, count), where coord(i) is i
/// unravelled row-major over size_0 … size_{rank−1} (axis rank−1 fastest) and dst is contiguous:
/// permute, slice (offset + strides), broadcast (stride 0), one input of a concat along the
/// leading axis (dst offset by the launcher). Strides and offset are in elements and may be
/// negative; count must equal Π size_a.
///
///   void name(const float* src, float* dst, i64 count, i64 offset,
///             i64 size0, …, i64 size5, i64 stride0, …, i64 stride5)
///
/// Always 6 sizes and 6 strides; the kernel for `rank` reads the first `rank` of each (pass 1 and
/// 0 for the rest). Grid-stride like ElementwiseKernel (elementwise_grid).
struct StridedCopyKernel {
  int rank = 6;       // 1..6
  int threads = 256;  // a multiple of 32, <= 1024
  friend bool operator==(const StridedCopyKernel&, const StridedCopyKernel&) = default;
};

using KernelRequest = std::variant<AttentionKernel, LinearKernel, LayerNormKernel, ElementwiseKernel, StridedCopyKernel,
                                   DecodeAttentionKernel, DecodeMergeKernel, AttentionBackwardKernel>;

/// One emitted kernel: a PTX module holding the single .entry `name`.
struct PtxKernel {
  std::string name;       // the .entry (and the symbol to cuModuleGetFunction)
  std::string signature;  // C-like parameter list, as in the PTX's first comment line
  std::string grid_rule;  // the grid, in words (the *_grid functions compute it)
  std::string ptx;        // the module text
  int sm = 80;
  int block_x = 1, block_y = 1, block_z = 1;
  int shared_bytes = 0;         // dynamic shared memory to pass at launch
  int static_shared_bytes = 0;  // shared memory declared in the module (informative)
};

/// Generates, optimises (-O3 with the NVPTX target machine) and emits `request` for sm_<sm>
/// (80, 86, 87, 89 or 90). Throws std::runtime_error on any failure.
PtxKernel emit_ptx(const KernelRequest& request, int sm);

/// The kernel's LLVM IR as text, as generated (optimized = false) or after the -O3 pipeline.
std::string nvptx_ir(const KernelRequest& request, int sm, bool optimized = false);

/// The .entry name emit_ptx gives `request` (stable across runs; specs that differ get different names).
std::string kernel_name(const KernelRequest& request);

// --- launch geometry (grid extents; block and shared memory come with the PtxKernel)
Dim3 attention_grid(const AttentionKernel& kernel, std::int64_t batch, std::int64_t len_q);
Dim3 linear_grid(const LinearKernel& kernel, std::int64_t m, std::int64_t n);
Dim3 layer_norm_grid(const LayerNormKernel& kernel, std::int64_t rows);
Dim3 elementwise_grid(int threads, std::int64_t count);
/// Whether DecodeAttentionKernel can compute `spec` (no weights, no dropout, at most 32 query heads
/// per kv head and registers for their queries and outputs); else `*why` says why.
bool decode_attention_supported(const cpu::AttentionSpec& spec, std::string* why);
/// The query rows at most that the CUDA backend runs on the decode kernel.
inline constexpr std::int64_t kDecodeQueries = 4;
/// The decode kernel's split of S keys: about 256 blocks in all, chunks of at least 128 keys (a
/// multiple of 32), at most 64 per unit; S = 0: one chunk.
struct DecodeSplit {
  std::int64_t chunks = 1, chunk_len = 0;
};
DecodeSplit decode_split(const DecodeAttentionKernel& kernel, std::int64_t batch, std::int64_t len_q,
                         std::int64_t len_k);
Dim3 decode_grid(const DecodeAttentionKernel& kernel, std::int64_t batch, std::int64_t len_q, std::int64_t len_k);
Dim3 decode_merge_grid(const DecodeMergeKernel& kernel, std::int64_t batch, std::int64_t len_q);
/// The dynamic shared memory of the attention kernel (what PtxKernel::shared_bytes says).
int attention_shared_bytes(const AttentionKernel& kernel);
/// Whether emit_ptx can generate `kernel` (for bf16 storage: the tensor-core kernel's limits);
/// else `*why` (if non-null) says why.
bool attention_supported(const AttentionKernel& kernel, std::string* why);

/// The backward's grid for `kernel.part` (a zero extent: nothing to launch — dq with L = 0,
/// dkdv with S = 0, or B = 0).
Dim3 attention_backward_grid(const AttentionBackwardKernel& kernel, std::int64_t batch, std::int64_t len_q,
                             std::int64_t len_k);
int attention_backward_shared_bytes(const AttentionBackwardKernel& kernel);
/// Whether emit_ptx can generate `kernel`; else `*why` (if non-null) says why.
bool attention_backward_supported(const AttentionBackwardKernel& kernel, std::string* why);

/// What `ptxas -v` says about the (first) entry of a module.
struct PtxasReport {
  std::string function;
  int registers = 0;
  int shared_bytes = 0;  // static shared memory ("bytes smem"); dynamic shared memory is not counted
  int stack_bytes = 0;
  int spill_stores = 0;  // bytes
  int spill_loads = 0;   // bytes
  std::string log;       // ptxas' whole output
};

/// The ptxas used by run_ptxas: $QKV_PTXAS, else `ptxas` on PATH, else /usr/local/cuda/bin/ptxas
/// (the first that exists and is executable), or std::nullopt.
std::optional<std::string> find_ptxas();

/// Assembles `ptx` with `ptxas -v -arch=sm_<sm>` (into a temporary cubin, then removed). Returns
/// the report, or std::nullopt with `*error` (if non-null) set when ptxas is absent, fails to
/// run, or rejects the module (its output included).
std::optional<PtxasReport> run_ptxas(const std::string& ptx, int sm, std::string* error);

}  // namespace qkv::codegen::nvptx
