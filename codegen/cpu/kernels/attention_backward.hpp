// codegen/cpu/kernels/attention_backward.hpp — the fused attention backward's generator (private):
// one function per spec, a task (batch, kv head, chunk of key blocks) per call.
#pragma once

#include <cstdint>
#include <string>

#include <qkv/codegen/cpu/run_attention_backward.hpp>

#include "cpu/kernels/attention_kernel.hpp"

namespace llvm {
class Module;
}  // namespace llvm

namespace qkv::codegen::cpu {

struct BackwardConfig {
  KernelConfig base;              // lanes, target CPU and features, denormal flushing
  int rows = 32;                  // Br: query rows per block
  int keys = 64;                  // Bc: keys per block (a multiple of lanes)
  int mr = 6, nr = 2;             // register block of the matrix products: mr rows × nr vectors
  std::int64_t dkp = 0, dvp = 0;  // head widths rounded up to whole vectors
  /// bf16 storage on vdpbf16ps (AVX512-BF16, head widths of whole vectors): the five products
  /// multiply bf16 pairs — q, k, v and dO as stored, P and dS rounded to bf16 — into f32 sums.
  bool dpbf16 = false;
};

BackwardConfig choose_backward_config(const AttentionSpec& spec, const HostTarget& host);

/// Emits `name`: void(const AttentionBackwardArgs*, i64 batch, i64 kv_head, i64 chunk).
void emit_attention_backward(llvm::Module& module, const AttentionSpec& spec, const BackwardConfig& config,
                             const std::string& name);

using AttentionBackwardFn = void(const AttentionBackwardArgs* args, std::int64_t batch, std::int64_t kv_head,
                                 std::int64_t chunk);

}  // namespace qkv::codegen::cpu
