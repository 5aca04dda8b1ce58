// qkv/codegen/lowering/storage.hpp — how every backend stores a value of each dtype, and which
// kernels read and write half-precision values themselves: the one place that says so (no LLVM).
//
// bool is one byte per element (0 / 1); f16 and bf16 are stored as themselves, two bytes (the
// IEEE binary16 bits, the top half of an f32); every other dtype is computed and stored as f32
// (integer inputs are converted on the way in; the reference interpreter does the same).
#pragma once

#include <cstddef>

#include <qkv/codegen/lowering/select.hpp>
#include <qkv/ir/dtype.hpp>
#include <qkv/ir/graph.hpp>

namespace qkv::codegen {

/// The dtype a value of dtype `t` is stored as by the compiled backends.
inline DType storage_dtype(DType t) {
  return t == DType::boolean || t == DType::f16 || t == DType::bf16 ? t : DType::f32;
}

/// Bytes per element as stored.
inline std::size_t storage_bytes(DType t) { return dtype_size(storage_dtype(t)); }

/// Whether the kernel of node `id` reads its f16 / bf16 inputs (half_operand) and writes an
/// f16 / bf16 value (half_native) itself; the pass legalize_dtypes converts the other operands to
/// f32 and, where the node is not native, computes it in f32 and rounds its value back. Native:
/// leaves and views (no code), convert, the strided copies and update_slice (they move elements
/// without arithmetic), and a fused attention whose q, k, v and output are all bf16 (its mod's
/// tensors are read as f32). A linear layer on the GEMM / GEMV kernels reads bf16 x and W itself
/// (both bf16; vdpbf16ps where the host has it) and writes f32, which is rounded after it: the
/// K blocks' partial sums stay f32.
inline bool half_native(const Graph& lowered, int id) {
  const Node& n = lowered.node(id);
  switch (select_kernel(lowered, id)) {
    case KernelKind::leaf:
    case KernelKind::view:
    case KernelKind::convert:
    case KernelKind::strided_copy:
    case KernelKind::update_slice:
      return true;
    case KernelKind::fused_attention:
      return n.dtype == DType::bf16 && lowered.node(n.inputs[0]).dtype == DType::bf16 &&
             lowered.node(n.inputs[1]).dtype == DType::bf16 && lowered.node(n.inputs[2]).dtype == DType::bf16;
    default:
      return false;
  }
}
inline bool half_operand(const Graph& lowered, int id, std::size_t input) {
  const Node& n = lowered.node(id);
  if (select_kernel(lowered, id) == KernelKind::gemm)
    return input < 2 && lowered.node(n.inputs[0]).dtype == DType::bf16 &&
           lowered.node(n.inputs[1]).dtype == DType::bf16;
  return half_native(lowered, id) && (n.op != Op::fused_attention || input < 3);
}

}  // namespace qkv::codegen
