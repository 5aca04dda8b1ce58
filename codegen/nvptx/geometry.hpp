// codegen/nvptx/geometry.hpp — the resolved tiling of the GPU kernels: thread mapping, shared
// memory layout and launch rules (no LLVM: the launch helpers use it too). Private to codegen.
#pragma once

#include <cstdint>
#include <string>

#include <qkv/codegen/nvptx.hpp>

namespace qkv::codegen::nvptx::detail {

/// The attention kernel's tiling, resolved from an AttentionKernel request.
///
/// Thread mapping. A block has `warps` warps and handles block_q = 4·warps·R query rows; warp w
/// owns the local rows [4R·w, 4R·(w+1)). Lane = 8·rg + kg (rg = lane / 8 in 0..3, kg = lane % 8):
///   - its R query rows are 4R·w + rg + 4i, i < R (interleaved: rg varies fastest);
///   - its KJ = block_k / 8 keys of each tile are kg + 8j, j < KJ (S micro-tile R × KJ);
///   - its value columns are t·8·wv + kg·wv + e, t < TC, e < wv (O micro-tile R × TC·wv).
/// So the 8 lanes sharing rg hold whole rows: row max/sum are butterfly shuffles over lane bits 0..2.
///
/// Shared memory (f32, dynamic, every region 16-byte aligned), strides chosen so that the
/// micro-tile loads of a warp touch distinct banks (row strides ≡ 4 mod 8 words for 4-wide loads,
/// odd for scalar loads):
///   Q [block_q][qk_stride]  the block's queries · scale · log2 e (rows past L are 0)
///   K [block_k][qk_stride]  one key tile (keys past S are 0)
///   V [block_k][v_stride]   one value tile; v_stride = TC·8·wv >= dv, columns past dv are 0
///   P [block_q][p_stride]   the tile's probabilities, each warp its own rows
struct AttentionGeometry {
  int block_q = 64, block_k = 64, threads = 128;
  int warps = 4;
  int rows_per_thread = 4;  // R
  int keys_per_thread = 8;  // KJ
  int wk = 4;               // floats per shared load along dk (4 when dk % 4 == 0, else 1)
  int wv = 4;               // floats per shared load along dv (4 when dv % 4 == 0, else 1)
  int col_chunks = 2;       // TC
  int qk_stride = 68, v_stride = 64, p_stride = 68;
  std::int64_t q_offset = 0, k_offset = 0, v_offset = 0, p_offset = 0;  // in floats
  std::int64_t shared_floats = 0;
  [[nodiscard]] int shared_bytes() const { return static_cast<int>(shared_floats * 4); }

  /// spec.storage == bf16: the tensor-core kernel (attention_mma_ptx.cpp). Warp w owns the 16
  /// local rows [16w, 16w + 16); block_q = 16·warps, block_k a multiple of 16. Shared memory
  /// holds bf16 rows: Q [block_q][qk_stride], K [block_k][qk_stride], V [block_k][v_stride] with
  /// strides in bf16 elements (dk + 8, dv + 8: rows 16 bytes apart mod 128, so the 8 row
  /// addresses of an ldmatrix hit distinct banks); the offsets stay in floats. No P region.
  bool mma = false;
};

/// Validates the request (and its spec) and resolves it; throws std::runtime_error.
AttentionGeometry attention_geometry(const AttentionKernel& request);
/// Why the bf16 tensor-core kernel cannot compute `request` (empty: it can).
std::string mma_attention_unsupported(const AttentionKernel& request);

/// The backward kernels' tiling (attention_backward_ptx.cpp), resolved from a request. The score
/// micro-tile is the forward's: warp w owns the block's query rows [4R·w, 4R·(w+1)), lane
/// 8·rg + kg its rows 4R·w + rg + 4i (i < R) and its keys kg + 8j (j < KJ = block_k / 8). A
/// thread's dQ (dq) or dK / dV (dkdv) columns are t·8·w + kg·w + e (t < TC, e < w, as the
/// forward's O); the dkdv kernel's key rows are 4·Rk·w + rg + 4i (i < Rk = block_k / (4·warps)).
///
/// Shared memory (f32, every region 16-byte aligned): Q [block_q][k_stride] (· scale) and
/// dO [block_q][v_stride], K [block_k][k_stride] and V [block_k][v_stride]; then dq: dS
/// [block_q][block_k + 4]; dkdv: Pᵀ and dSᵀ [block_k][block_q + 4]. A d-wide row's stride is
/// TC·8·w + w (w = 4 when d % 4 == 0, else 1): the column chunks fit, and 8 rows' loads touch
/// distinct banks.
struct BackwardGeometry {
  bool dkdv = false;
  int block_q = 64, block_k = 32, threads = 128, warps = 4;
  int rows_per_thread = 4;  // R
  int keys_per_thread = 4;  // KJ
  int key_rows = 0;         // Rk (dkdv)
  int wk = 4, wv = 4;       // floats per shared load along dk, dv
  int tck = 2, tcv = 2;     // column chunks along dk, dv
  int k_stride = 68, v_stride = 68, t_stride = 36;
  std::int64_t q_offset = 0, do_offset = 0, k_offset = 0, v_offset = 0, t0_offset = 0, t1_offset = 0;
  std::int64_t shared_floats = 0;
  [[nodiscard]] int shared_bytes() const { return static_cast<int>(shared_floats * 4); }

  /// spec.storage == bf16: the tensor-core kernels (attention_backward_mma_ptx.cpp). Warp w owns
  /// 16 rows of the block's own tile — dq: query rows (block_q = 16·warps), dkdv: keys (block_k =
  /// 16·warps) — and sweeps the other's tiles (a multiple of 16 rows up to 128). Shared memory
  /// holds bf16 rows: Q [block_q][k_stride], dO [block_q][v_stride], K [block_k][k_stride], V
  /// [block_k][v_stride], strides in bf16 elements (dk + 8, dv + 8: an ldmatrix's 8 row addresses
  /// hit distinct banks), offsets in floats; no t0 / t1 (P and dS stay in registers). R, KJ, Rk,
  /// w and tc are unused.
  bool mma = false;

  /// Part::dtensor (attention_backward_common.hpp): the dkdv kernel's tiling (block_k sets the slot
  /// count), no shared memory, grid (kDtensorBlocks, 1, 1).
  bool dtensor = false;
  /// dkdv with spec.tensor_grads: a tile's entries (block_q · block_k) and the scratch region of
  /// their values (f32), offsets (i64) and one f32 per warp, at grad_offset floats.
  int grad_entries = 0;
  std::int64_t grad_offset = 0;
};

/// The dtensor kernel's grid: blocks of a grid-stride loop over each tensor's elements.
constexpr int kDtensorBlocks = 64;

/// Why the bf16 tensor-core backward cannot compute `request` (empty: it can).
std::string mma_attention_backward_unsupported(const AttentionBackwardKernel& request);

/// Validates the request (and its spec) and resolves it; throws std::runtime_error.
BackwardGeometry attention_backward_geometry(const AttentionBackwardKernel& request);
std::string attention_backward_params();

/// Dynamic shared memory an sm allows per block after the opt-in (bytes).
int max_shared_bytes(int sm);

/// Throws std::runtime_error unless `sm` is one emit_ptx supports.
void check_sm(int sm);

/// Throws unless threads is a multiple of 32 in [32, limit].
void check_threads(int threads, int limit, const char* what);

/// The C-like parameter lists of the kernels (also their PTX header comment).
std::string attention_params();
std::string decode_attention_params();
std::string decode_merge_params();
/// Why DecodeAttentionKernel cannot compute `spec` (empty: it can).
std::string decode_unsupported(const cpu::AttentionSpec& spec);
std::string linear_params();
std::string layer_norm_params();
std::string elementwise_params();
std::string strided_copy_params();

}  // namespace qkv::codegen::nvptx::detail
