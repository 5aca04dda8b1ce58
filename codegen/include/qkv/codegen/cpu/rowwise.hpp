// qkv/codegen/cpu/rowwise.hpp — JIT-compiled row-wise and elementwise fp32 kernels: layer norm
// over the contiguous (last) axis, exact-form GELU, ReLU and an equal-shape add.
//
//   // y[r, :] = (x[r, :] − mean) / sqrt(var + eps) · gamma + beta, for rows r in [0, rows)
//   qkv::codegen::cpu::run_layer_norm(x, gamma, beta, y, rows, n, 1e-5);
//   qkv::codegen::cpu::run_gelu(x, y, count);         // 0.5·x·(1 + erf(x/√2))
//
// All four are generated as LLVM IR on host-width vectors (a vector loop, then a scalar tail),
// compiled once per process and target into their own JIT, and split into contiguous blocks of
// rows / elements on the persistent thread pool the attention kernel and the GEMM use.
//
// Numerics: layer norm accumulates in fp32, two passes (mean, then Σ(x − mean)²: the biased
// variance PyTorch uses), eps added inside the square root. GELU evaluates Φ(−|x|) = ½·erfc(|x|/√2)
// with a Chebyshev fit of erfc (fractional error ~1.2e-7) and the IR exp of vector_math.hpp, then
// x·Φ(x) = x − x·Φ(−|x|) for x > 0 and x·Φ(−|x|) otherwise: max abs error ~3e-7 over all x.
// ReLU maps NaN to NaN and −0 to +0 like the reference interpreter.
#pragma once

#include <cstdint>

namespace qkv::codegen::cpu {

/// Layer norm of each contiguous row of n floats of x into y (which may alias x), with gamma and
/// beta of n floats, on `threads` threads (<= 0: one per hardware thread). Throws
/// std::invalid_argument for negative sizes or a needed null pointer, and std::runtime_error
/// when the kernels cannot be compiled.
void run_layer_norm(const float* x, const float* gamma, const float* beta, float* y, std::int64_t rows, std::int64_t n,
                    double eps, int threads = 0);

/// y[i] = gelu(x[i]) (exact erf form), i in [0, count); y may alias x.
void run_gelu(const float* x, float* y, std::int64_t count, int threads = 0);

/// y[i] = max(x[i], 0) (NaN stays NaN), i in [0, count); y may alias x.
void run_relu(const float* x, float* y, std::int64_t count, int threads = 0);

/// y[i] = a[i] + b[i], i in [0, count) (equal shapes: the residual add); y may alias a or b.
void run_add(const float* a, const float* b, float* y, std::int64_t count, int threads = 0);

}  // namespace qkv::codegen::cpu
