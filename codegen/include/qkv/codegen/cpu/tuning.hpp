// qkv/codegen/cpu/tuning.hpp — how the CPU kernels are blocked for a target: the one table, keyed
// by the vector width and by how wide the FMA pipes are (no LLVM).
//
// The register blockings were measured (docs/performance.md, "Tuning per host"): where 512-bit
// FMAs are split over two 256-bit pipes (Zen 4) the fused attention's Q·Kᵀ is bound by its FMAs
// and 4 query vectors × 4 keys is best; with two full-width 512-bit pipes (Zen 5) the FMAs go
// twice as fast and the broadcasts of K and the loads of Qᵀ become the limit, so fewer query
// vectors against more keys per broadcast (3 × 8) and longer key tiles win (+10–17 % on one
// core). The bf16 kernel (vdpbf16ps) keeps 4 × 4 but on tiles of 128 keys there (+3–7 %: the
// per-tile rescale of the output and the packing of V's pairs half as often). Hosts not in the
// table get the blocking of their vector width. The explicit fields of AttentionSpec / GemmSpec
// still win over it.
#pragma once

#include <string>
#include <string_view>

#include <qkv/codegen/target.hpp>

namespace qkv::codegen::cpu {

struct KernelTuning {
  std::string name;  // "avx512-full-width", "avx512", "avx2", "sse", "neon"
  std::string why;   // the property of the target that chose it
  // The fused attention (KernelConfig's fields): f32 storage, then bf16.
  int query_vectors = 4, qk_keys = 4, pv_dims = 4, key_tile = 64;
  int bf16_query_vectors = 4, bf16_qk_keys = 4, bf16_pv_dims = 4, bf16_key_tile = 64;
  // The GEMM's micro-tile (rows × col_vectors vectors) and K blocks (elements; bf16 pairs pack
  // twice as many in the same bytes).
  int gemm_rows = 12, gemm_col_vectors = 2, gemm_k_block = 256, gemm_k_block_bf16 = 512;
  // A second micro-tile for calls of few rows (a batched decode step: 16 rows are one tile of 12
  // and one of 4 that costs 12 — f16 decode of 16 sequences 159 -> 215 tokens/s with 8); 0: none.
  int gemm_small_rows = 8;
  // The integer GEMM of quantized weights (int8_dot_products): rows × 2 vectors of int32 sums, as
  // many f32 accumulators, 2 loads of the panel and 2 of its scales in the register file; K
  // blocks of this many entries (a 32-column panel's block: 16 KiB).
  int gemm_int8_rows = 6, gemm_int8_k_block = 512;
};

/// Whether `host` enables `feature` (LLVM's spelling, e.g. "+avx512f").
inline bool has_feature(const HostTarget& host, std::string_view feature) {
  for (const auto& f : host.features)
    if (f == feature) return true;
  return false;
}

/// Whether kernels `lanes` f32 wide run bf16 products on vdpbf16ps (AVX512-BF16 and 16 lanes;
/// otherwise bf16 is widened to f32 as it is loaded).
inline bool bf16_dot_products(const HostTarget& host, int lanes) {
  return lanes == 16 && has_feature(host, "+avx512bf16");
}

/// Whether kernels `lanes` f32 wide multiply 8-bit integers four products a lane on vpdpbusd
/// (AVX512-VNNI with 16 lanes; AVX-VNNI, or AVX512-VNNI with AVX512-VL, with 8): the quantized
/// linear layers' GEMM then runs on 8-bit activations (docs/semantics.md, "Quantized weights").
inline bool int8_dot_products(const HostTarget& host, int lanes) {
  if (lanes == 16) return has_feature(host, "+avx512vnni") && has_feature(host, "+avx512bw");
  return lanes == 8 &&
         (has_feature(host, "+avxvnni") || (has_feature(host, "+avx512vnni") && has_feature(host, "+avx512vl")));
}

/// Whether `host` has two full-width 512-bit FMA pipes per core (measured: znver5).
inline bool full_width_avx512(const HostTarget& host) { return host.cpu == "znver5"; }

/// The tuning for kernels `lanes` f32 wide (the spec's vector width, or the host's) on `host`.
inline KernelTuning kernel_tuning(const HostTarget& host, int lanes) {
  const bool avx512 = has_feature(host, "+avx512f");
  KernelTuning t;
  if (lanes >= 16 && avx512 && full_width_avx512(host)) {
    t.name = "avx512-full-width";
    t.why = host.cpu + ": two full-width 512-bit FMA pipes per core";
    t.query_vectors = 3;
    t.qk_keys = 8;
    t.key_tile = 128;
    t.bf16_key_tile = 128;
  } else if (lanes >= 16 && avx512) {
    t.name = "avx512";
    t.why = host.cpu + ": AVX-512 (512-bit FMAs on split or unknown pipes)";
  } else if (lanes == 4 && host.triple.starts_with("aarch64")) {
    // NEON: 4 lanes like SSE, but 32 vector registers (SSE has 16): the blocking of the 32-register
    // AVX-512 row, 16 attention accumulators (enough to cover a 4-cycle FMA on two pipes, which
    // the SSE row's 2 × 2 cannot) and a 12 × 8 GEMM tile (24 accumulators, 2 loads of B, a
    // broadcast). Chosen by register count; not yet timed on ARM hardware (docs/aot.md).
    t.name = "neon";
    t.why = host.cpu + ": 4-lane vectors, 32 registers";
  } else if (lanes >= 8) {
    t.name = "avx2";
    t.why = host.cpu + ": 8-lane vectors";
    t.query_vectors = t.bf16_query_vectors = 2;
    t.gemm_rows = 6;  // 16 registers: 12 accumulators, 2 loads of B, a broadcast
    t.gemm_small_rows = 0;
    t.gemm_int8_rows = 3;
  } else {
    t.name = "sse";
    t.why = host.cpu + ": 4-lane vectors";
    t.query_vectors = t.bf16_query_vectors = 2;
    t.qk_keys = t.bf16_qk_keys = 2;
    t.pv_dims = t.bf16_pv_dims = 2;
    t.key_tile = t.bf16_key_tile = 32;
    t.gemm_rows = 6;
    t.gemm_small_rows = 0;
    t.gemm_int8_rows = 3;
  }
  return t;
}

}  // namespace qkv::codegen::cpu
