// codegen/cpu/kernels/rowwise_kernel.hpp — the row-wise kernels' IR generator (private to codegen):
// rowwise.hpp's drivers run them in-process, the AOT compiler (aot.cpp) calls them from
// generated code. The four functions and their signatures are listed at the top of
// rowwise_kernel.cpp (qkv_layer_norm, qkv_gelu, qkv_relu, qkv_add).
#pragma once

#include <qkv/codegen/target.hpp>

namespace llvm {
class Module;
}  // namespace llvm

namespace qkv::codegen::cpu {

/// Adds qkv_layer_norm, qkv_gelu, qkv_relu and qkv_add, compiled for `host`, to `module`.
void emit_rowwise_kernels(llvm::Module& module, const HostTarget& host);

}  // namespace qkv::codegen::cpu
