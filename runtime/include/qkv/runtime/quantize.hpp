// qkv/runtime/quantize.hpp — weight-only quantization: linear layers' weights stored as 8-bit
// integers with one f16 scale per group of consecutive inputs (the layout of llama.cpp's Q8_0:
// groups of 32, 8.5 bits a weight), read by the linear kernels as stored (docs/semantics.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <qkv/ir/graph.hpp>
#include <qkv/runtime/interpreter.hpp>

namespace qkv {

/// Q8_0's group: 32 consecutive entries of a row share a scale.
inline constexpr std::int64_t kQ8Group = 32;

/// A weight [rows, K] quantized: q (i8, [rows, K]) and scales (f16, [rows, ceil(K / group)]).
struct QuantizedWeight {
  NdArray q, scales;
};

/// Round to nearest (absmax) quantization of a float weight (f32 / f16 / bf16, rank 2): per group,
/// scale = max |w| / 127 rounded to f16, q = round(w / scale) (ties away from zero), so that
/// q · scale is the nearest multiple of the stored scale. A group of zeros has scale 0. Throws
/// InputError naming `what` and the entry for a NaN or infinite weight.
QuantizedWeight quantize_q8(const NdArray& w, std::int64_t group, const std::string& what);

/// What quantize_linear_weights changed.
struct QuantizedModel {
  Graph graph;
  std::vector<std::string> weights;  // the quantized parameters' names, in graph order
  std::int64_t bytes_before = 0, bytes_after = 0;
};

/// The model with the weight of every linear layer that is a fed rank-2 float parameter [out, in],
/// read by linear layers only, stored quantized: the parameter `name` becomes `name.q8` (i8) and
/// `name.q8_scale` (f16) read by a dequantize node (Op::dequantize), and its feed is replaced by
/// those two. Other weights (embeddings, norms, biases, a table tied to an embedding) are kept.
QuantizedModel quantize_linear_weights(const Graph& g, Feeds& feeds, std::int64_t group = kQ8Group);

}  // namespace qkv
