// codegen/cpu/kernels/rowwise_kernel.hpp — the row-wise kernels' IR generator (private to codegen):
// rowwise.hpp's drivers run them in-process, the AOT compiler (aot.cpp) calls them from
// generated code. The five functions and their signatures are listed at the top of
// rowwise_kernel.cpp (qkv_layer_norm, qkv_gelu, qkv_silu, qkv_relu, qkv_add).
#pragma once

#include <string>

#include <qkv/codegen/target.hpp>
#include <qkv/ir/dtype.hpp>

namespace llvm {
class Module;
}  // namespace llvm

namespace qkv::codegen::cpu {

/// Adds qkv_layer_norm, qkv_gelu, qkv_silu, qkv_relu and qkv_add, compiled for `host`, to
/// `module`, every array of them stored as `storage` (f32, f16 or bf16; rowwise_kernel_name
/// names them): a half-precision element is widened to f32 as it is loaded and a result rounded
/// (to nearest even) as it is stored; the arithmetic between is the f32 kernels'.
void emit_rowwise_kernels(llvm::Module& module, const HostTarget& host, DType storage = DType::f32);

/// The name of row-wise kernel `base` (e.g. "qkv_gelu") for arrays stored as `storage`: base for
/// f32, base + "_bf16" / "_f16" for the others.
std::string rowwise_kernel_name(const std::string& base, DType storage);

}  // namespace qkv::codegen::cpu
