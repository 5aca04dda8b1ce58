// qkv/codegen/cpu/run_attention.hpp — run the fused attention kernel on the host CPU.
//
//   qkv::codegen::cpu::AttentionSpec spec{.dk = 64, .dv = 64, .hq = 8, .hkv = 8, .causal = true};
//   qkv::codegen::cpu::AttentionArgs args{.q = q, .k = k, .v = v, .out = out, .batch = 1, .len_q = n, .len_k = n};
//   qkv::codegen::cpu::run_attention(spec, args);       // all hardware threads
//
// The first call with a spec generates the kernel's LLVM IR, optimises it for the host CPU and
// JIT-compiles it (tens of milliseconds); later calls with an equal spec on the same target use
// the in-memory kernel cache. Work is split into tasks of (batch, head, block of query rows),
// handed out heaviest first on a persistent thread pool.
#pragma once

#include <cstdint>
#include <string>

#include <qkv/codegen/cpu/attention.hpp>

namespace qkv::codegen::cpu {

/// Computes `out` (and `weights` if the spec asks) as described in attention.hpp, on `threads`
/// threads (<= 0: one per hardware thread). Throws std::invalid_argument when the spec or the
/// arguments are inconsistent (a required pointer is null, hq % hkv != 0, dropout_p outside
/// [0, 1), negative sizes, L or S >= 2^31), std::runtime_error when the kernel cannot be compiled.
void run_attention(const AttentionSpec& spec, const AttentionArgs& args, int threads = 0);

/// What preparing a kernel cost, and how it is blocked.
struct KernelInfo {
  std::string name;          // the JIT symbol, qkv_attention_<spec hash>
  bool cached = false;       // found in the cache (no compilation)
  double build_ms = 0;       // generating the IR
  double compile_ms = 0;     // -O3 pipeline + machine code (LLJIT), including the lookup
  double jit_create_ms = 0;  // creating the process's JIT, when this call did it
  int vector_floats = 0;     // lanes per vector
  int query_rows = 0;        // query rows per task
  int key_tile = 0;          // keys per tile
  bool dpbf16 = false;       // bf16 storage on vdpbf16ps (else converted to f32 as loaded)
};

/// Gets the kernel for `spec` from the cache or compiles it (what run_attention does first).
KernelInfo prepare_attention(const AttentionSpec& spec);

/// Drops every cached kernel and the JIT that holds their code, so that the next prepare is
/// cold. Not to be called while another thread is inside run_attention.
void clear_attention_cache();

/// The kernel's LLVM IR as text: as generated, or after the -O3 pipeline (for inspection/tests).
std::string attention_kernel_ir(const AttentionSpec& spec, bool optimized);

}  // namespace qkv::codegen::cpu
