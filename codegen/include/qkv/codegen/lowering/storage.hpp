// qkv/codegen/lowering/storage.hpp — how every backend stores a value of each dtype, and which
// kernels read and write half-precision values themselves: the one place that says so (no LLVM).
//
// bool is one byte per element (0 / 1); f16 and bf16 are stored as themselves, two bytes (the
// IEEE binary16 bits, the top half of an f32); every other dtype is computed and stored as f32
// (the reference interpreter does the same), except that the CPU backend reads integer inputs as
// the integers they are (integer_array: token ids, positions, document ids).
#pragma once

#include <cstddef>

#include <qkv/codegen/lowering/select.hpp>
#include <qkv/ir/dtype.hpp>
#include <qkv/ir/graph.hpp>

namespace qkv::codegen {

/// The dtype a value of dtype `t` is stored as by the compiled backends.
inline DType storage_dtype(DType t) {
  return t == DType::boolean || t == DType::f16 || t == DType::bf16 || t == DType::i8 ? t : DType::f32;
}

/// Bytes per element as stored.
inline std::size_t storage_bytes(DType t) { return dtype_size(storage_dtype(t)); }

/// Whether node `id` is an integer array the CPU backend reads as the caller stores it (int32_t /
/// int64_t, never floats): an i32 / i64 input or parameter, or a view of one. Such a node has no
/// arena slot (it is the caller's array); every other integer value is computed in f32.
inline bool integer_array(const Graph& lowered, int id) {
  const Node& n = lowered.node(id);
  if (!is_integer(n.dtype)) return false;
  if (is_array_leaf(n)) return true;
  return is_view(n.op) && !n.inputs.empty() && integer_array(lowered, n.inputs[0]);
}

/// The dtype the CPU backend stores node `id` as: storage_dtype, except for an integer array.
inline DType cpu_storage_dtype(const Graph& lowered, int id) {
  return integer_array(lowered, id) ? lowered.node(id).dtype : storage_dtype(lowered.node(id).dtype);
}

/// Whether every input of node `id` is stored as its value is (the row-wise kernels take one
/// element type for all their arrays).
inline bool stored_alike(const Graph& lowered, int id) {
  const Node& n = lowered.node(id);
  for (int in : n.inputs)
    if (storage_dtype(lowered.node(in).dtype) != storage_dtype(n.dtype)) return false;
  return true;
}

/// Whether the kernel of node `id` reads its f16 / bf16 inputs (half_operand) and writes an
/// f16 / bf16 value (half_native) itself; the pass legalize_dtypes converts the other operands to
/// f32 and, where the node is not native, computes it in f32 and rounds its value back.
///
/// Native: leaves and views (no code), convert, the strided copies and update_slice (they move
/// elements without arithmetic); the element-wise and row-wise kernels, which widen each element
/// to f32 as they load it and round their value once as they store it — bit for bit what the
/// conversions around an f32 kernel would give, at a half of the bytes moved (the activations,
/// adds and layer norm over rows on the row-wise kernels when all their arrays share one dtype;
/// broadcasting arithmetic, masks, score mods, dropout, softmax, logsumexp, argmax, layer norm
/// along another axis, RMSNorm, RoPE and dequantize (its scales) with any mix); an embedding whose table is stored as
/// its value (rows copied); and a fused attention whose q, k, v and output are all bf16 (its mod's tensors are read as
/// f32), and likewise its backward (q, k, v, out, d_out and dQ bf16; dK and dV its companions, bf16). A linear layer on
/// the GEMM / GEMV kernels reads bf16 x and W itself (both bf16; vdpbf16ps where the host has it) and writes f32, which
/// is rounded after it: the K blocks' partial sums stay f32; so does a contraction of two bf16 operands that the GEMM
/// runs (contract_gemm_roles), and the sums of a fill (contract_fill_sums) read their x as stored.
inline bool half_native(const Graph& lowered, int id) {
  const Node& n = lowered.node(id);
  switch (select_kernel(lowered, id)) {
    case KernelKind::leaf:
    case KernelKind::view:
    case KernelKind::convert:
    case KernelKind::strided_copy:
    case KernelKind::update_slice:
    case KernelKind::fill:
    case KernelKind::broadcast_binary:
    case KernelKind::causal:
    case KernelKind::dropout:
    case KernelKind::score_mod:
    case KernelKind::softmax:
    case KernelKind::logsumexp:
    case KernelKind::argmax:
    case KernelKind::layer_norm_strided:
    case KernelKind::rms_norm:
    case KernelKind::rope:
    case KernelKind::dequantize:            // f16 / bf16 scales widened as loaded
    case KernelKind::dequantize_in_linear:  // likewise, by the linear kernels
      return true;
    case KernelKind::unary:
    case KernelKind::add_same:
    case KernelKind::layer_norm_rows:
      return stored_alike(lowered, id);
    case KernelKind::embedding:
      return storage_dtype(lowered.node(n.inputs[0]).dtype) == storage_dtype(n.dtype);
    case KernelKind::fused_attention:  // q, k, v and out all bf16, or all f16
      return (n.dtype == DType::bf16 || n.dtype == DType::f16) && lowered.node(n.inputs[0]).dtype == n.dtype &&
             lowered.node(n.inputs[1]).dtype == n.dtype && lowered.node(n.inputs[2]).dtype == n.dtype;
    case KernelKind::attention_backward:  // q, k, v, out and d_out bf16 (lse and the mod's tensors f32)
      if (n.dtype != DType::bf16 || n.inputs.size() < 5) return false;
      for (std::size_t k = 0; k < 5; ++k)
        if (lowered.node(n.inputs[k]).dtype != DType::bf16) return false;
      return true;
    case KernelKind::attention_grads:  // dK and dV as their backward stores them
      return n.op != Op::attention_dtensor && half_native(lowered, n.inputs[0]) && n.dtype == DType::bf16;
    default:
      return false;
  }
}
inline bool half_operand(const Graph& lowered, int id, std::size_t input) {
  const Node& n = lowered.node(id);
  const KernelKind kind = select_kernel(lowered, id);
  if (kind == KernelKind::gemm)  // x and W both bf16, or both f16 (widened as loaded)
    return input < 2 &&
           (lowered.node(n.inputs[0]).dtype == DType::bf16 || lowered.node(n.inputs[0]).dtype == DType::f16) &&
           lowered.node(n.inputs[1]).dtype == lowered.node(n.inputs[0]).dtype;
  if (kind == KernelKind::contract) {
    if (contract_fill_sums(lowered, id)) return input < 2;  // x read as stored; the fill never read
    // on the GEMM kernel (emit_contract_on_gemm) when both are bf16
    return input < 2 && lowered.node(n.inputs[0]).dtype == DType::bf16 &&
           lowered.node(n.inputs[1]).dtype == DType::bf16 && contract_gemm_roles(lowered, id).has_value();
  }
  return half_native(lowered, id) && (n.op != Op::fused_attention || input < 3) &&
         (n.op != Op::fused_attention_backward || input < 5);
}

}  // namespace qkv::codegen
