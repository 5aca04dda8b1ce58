// qkv/codegen/passes/legalize_dtypes.hpp — f16 / bf16 values through kernels that compute in f32.
//
// A node's dtype is how its value is stored (lowering/storage.hpp). The kernels that read and
// write half-precision values themselves are listed there (half_native); around every other
// node this pass puts conversions: its f16 / bf16 inputs are converted to f32, it computes and
// stores f32, and a convert node rounds its value back to the dtype the graph gave it, which
// its consumers and the graph's outputs then read. The values the graph holds (and the
// interpreter computes) are unchanged; only the code between them does its arithmetic in f32.
#pragma once

#include <qkv/ir/graph.hpp>

namespace qkv::codegen {

Graph legalize_dtypes(const Graph& g);

}  // namespace qkv::codegen
