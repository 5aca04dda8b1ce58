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

/// q · scale per entry, as f32 [rows, K] (what Op::dequantize computes).
NdArray dequantize_q8(const QuantizedWeight& w, std::int64_t group);

/// The suffixes of a weight stored quantized, in feeds and in checkpoints: `name.q8` (i8) and
/// `name.q8_scale` (f16).
inline constexpr const char* kQ8Suffix = ".q8";
inline constexpr const char* kQ8ScaleSuffix = ".q8_scale";

/// What quantize_linear_weights changed.
struct QuantizedModel {
  Graph graph;
  std::vector<std::string> weights;                // the quantized parameters' names, in graph order
  std::int64_t bytes_before = 0, bytes_after = 0;  // the quantized weights' bytes in f32, and now
};

/// The names of the parameters quantize_linear_weights quantizes: rank-2 float parameters [out, in]
/// that only linear layers read, as their weight (not embeddings, norms, biases, nor a table tied
/// to an embedding), in graph order.
std::vector<std::string> quantizable_linear_weights(const Graph& g);

/// The feeds `name.q8` and `name.q8_scale` of a float weight (quantize_q8), for quantizing each
/// weight as it is loaded (the unquantized copy never all resident at once).
void add_q8_feeds(Feeds& feeds, const std::string& name, const NdArray& w, std::int64_t group = kQ8Group);
/// The feeds `name.q8` and `name.q8_scale` of a weight quantized already (a q8 checkpoint's).
void add_q8_feeds(Feeds& feeds, const std::string& name, QuantizedWeight w);

/// The model with each quantizable linear weight stored quantized: the parameter `name` becomes
/// `name.q8` (i8) and `name.q8_scale` (f16) read by a dequantize node (Op::dequantize). A fed float
/// weight is quantized and its feed replaced by those two; a weight fed already quantized (those
/// two feeds, add_q8_feeds) is taken as it is (InputError if their shapes do not fit). A weight
/// fed neither way is left as it is (its missing feed is the backend's error).
QuantizedModel quantize_linear_weights(const Graph& g, Feeds& feeds, std::int64_t group = kQ8Group);

}  // namespace qkv
