// qkv/codegen/cpu/run_attention_backward.hpp — the fused attention backward on the host CPU
// (FlashAttention-2's algorithm, fp32), for the forward attention.hpp describes.
//
//   AttentionBackwardArgs a;
//   a.forward = {.q = q, .k = k, .v = v, .out = o, .batch = B, .len_q = L, .len_k = S, .lse = lse};
//   a.d_out = dO; a.dq = dq; a.dk = dk; a.dv = dv;
//   run_attention_backward(spec, a);
//
// Given the forward's output O and log-sum-exp (spec.write_lse of the forward), it recomputes
// P = exp(s' − lse) tile by tile (never the L×S matrix), s' = f(s) the modified score of the raw
// s = scale · q·k, and computes, with D = rowsum(dO ∘ O):
//   dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − D) ∘ f'(s),  dQ = scale · dS K,  dK = scale · dSᵀ Q,
// dK and dV summed over the query heads that share a key/value head (GQA, no expanded copies).
// A row with no visible key has P = 0: zero, finite gradients.
//
// Deterministic by construction: the keys are cut into a number of chunks that depends on the
// shape only; a task (batch, kv head, chunk) owns the dK/dV rows of its keys and writes its own
// dQ partial sums, which are then added in chunk order. The result is bit-identical whatever
// the thread count. Tiles the mask never keeps (causal, windows, padding) are skipped, as in
// the forward.
//
// With dropout (spec.dropout_p, forward.seed) the forward's mask is replayed from its Philox
// counters: dV = (P ∘ Z)ᵀ dO, dS = P ∘ ((dP ∘ Z) − D), Z = keep / (1 − p).
//
// Covers: f32 or bf16 storage (spec.storage: q, k, v, out, d_out, dq, dk and dv as bf16 bits,
// widened to f32 as they are read, the gradients rounded once as they are written; lse and the
// mod's tensors f32), dropout, every mod (spec.causal, key_padding, bias, spec.mod with a
// score part differentiated symbolically: softcap, ALiBi, biases; no gradient for the tensors
// a mod reads), head widths up to 256. backward_unsupported() says why not
// otherwise; run_attention_backward then throws std::invalid_argument (the graph's gradient
// falls back to the unfused backward before it gets here: qkv/ir/grad.hpp).
#pragma once

#include <cstdint>
#include <string>

#include <qkv/codegen/cpu/attention.hpp>

namespace qkv::codegen::cpu {

/// The tensors of one backward call, contiguous row-major (the first eight as spec.storage):
///   forward.q [B, Hq, L, Dk], forward.k [B, Hkv, S, Dk], forward.v [B, Hkv, S, Dv],
///   forward.out [B, Hq, L, Dv] (the forward's output), forward.lse [B, Hq, L] (its log-sum-exp),
///   forward.key_keep / bias / tensors / extents as for the forward,
///   d_out [B, Hq, L, Dv] in; dq [B, Hq, L, Dk], dk [B, Hkv, S, Dk], dv [B, Hkv, S, Dv] out.
/// The generated code reads this struct directly (its layout is part of the kernel ABI); the
/// fields after dv are the driver's workspace.
struct AttentionBackwardArgs {
  AttentionArgs forward;
  const void* d_out = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  /// Per spec.tensor_grads entry: the gradient of that tensor (its extents as in
  /// forward.extents, row-major) out.
  float* const* dtensors = nullptr;
  // --- set by run_attention_backward
  const float* delta = nullptr;   // D [B, Hq, L]
  float* dq_partial = nullptr;    // [chunks, B, Hq, padded_rows, padded_dk]
  std::int64_t chunk_blocks = 0;  // key blocks per chunk
  std::int64_t padded_rows = 0;   // L rounded up to the query block
  std::int64_t chunks = 0;        // chunks of keys per (batch, kv head)
  /// Per spec.tensor_grads entry: its partial sums [slots][the tensor's entries], zeroed.
  float* const* tensor_partials = nullptr;
};

/// The number of partial copies of tensor gradient `t` (AttentionSpec::tensor_grads) for `batch`
/// and `chunks` chunks of keys: std::int64_t, or the generated code's sizes (codegen's ir::Int).
template <class I>
I tensor_grad_slots(const AttentionSpec::TensorGrad& t, const I& batch, std::int64_t hkv, const I& chunks) {
  const I one = chunks - chunks + 1;
  return (t.per_batch ? batch : one) * (t.per_kv_head ? hkv : 1) * (t.per_chunk ? chunks : one);
}

/// Empty when the backward kernel covers `spec`, else why not.
[[nodiscard]] std::string backward_unsupported(const AttentionSpec& spec);

/// Computes dq, dk and dv as above on `threads` threads (<= 0: one per hardware thread).
/// Throws std::invalid_argument for what it does not cover or inconsistent arguments.
void run_attention_backward(const AttentionSpec& spec, const AttentionBackwardArgs& args, int threads = 0);

/// FLOPs of the backward as the benchmarks count them: 2.5 × attention_flops (FlashAttention's
/// convention: five matrix products where the forward has two).
[[nodiscard]] double attention_backward_flops(const AttentionSpec& spec, std::int64_t batch, std::int64_t len_q,
                                              std::int64_t len_k);

/// The backward kernel's LLVM IR as text (for inspection and tests).
std::string attention_backward_kernel_ir(const AttentionSpec& spec, bool optimized);

}  // namespace qkv::codegen::cpu
