// qkv/runtime/quantize.hpp — weight-only quantization: linear layers' weights stored as 8-bit or
// 4-bit integers with one f16 scale per group of 32 consecutive inputs (the layouts of llama.cpp's
// Q8_0, 8.5 bits a weight, and Q4_0, 4.5 bits), read by the linear kernels as stored
// (docs/semantics.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <qkv/ir/graph.hpp>
#include <qkv/runtime/interpreter.hpp>

namespace qkv {

/// Q8_0's and Q4_0's group: 32 consecutive entries of a row share a scale.
inline constexpr std::int64_t kQuantGroup = 32;

/// How a weight is stored. q8: one int8 q per entry, W = q · scale. q4: two entries per byte of
/// q (Q4_0's order: in each group of G, byte j < G / 2 holds entry j in its low four bits and entry
/// j + G / 2 in its high four), W = (nibble − 8) · scale; a row's length a multiple of G.
enum class Quant : std::uint8_t { q8, q4 };

/// "q8" / "q4"; bits a stored entry; the parse of a name (nullopt for another).
std::string_view quant_name(Quant f);
int quant_bits(Quant f);
std::optional<Quant> parse_quant(std::string_view name);
/// The suffixes of a weight stored quantized, in feeds and in checkpoints: `name.q8` (i8) and
/// `name.q8_scale` (f16), or `name.q4` and `name.q4_scale`.
std::string quant_suffix(Quant f);
std::string quant_scale_suffix(Quant f);

/// A weight [rows, K] quantized: q (i8, [rows, K] for q8, [rows, K / 2] for q4) and scales (f16,
/// [rows, ceil(K / group)]).
struct QuantizedWeight {
  NdArray q, scales;
  Quant format = Quant::q8;
  /// K: the weight's columns.
  [[nodiscard]] std::int64_t columns() const { return q.shape.at(1) * (format == Quant::q4 ? 2 : 1); }
};

/// Whether a weight with rows of `k` entries can be stored as `f` in groups of `group` (q4: k a
/// multiple of the group, and the group even).
bool quantizable(Quant f, std::int64_t k, std::int64_t group);

/// The shapes q and the scales of a [rows, k] weight have stored as `f`.
std::vector<std::int64_t> quant_q_shape(Quant f, std::int64_t rows, std::int64_t k);
std::vector<std::int64_t> quant_scale_shape(std::int64_t rows, std::int64_t k, std::int64_t group);

/// Round to nearest quantization of a float weight (f32 / f16 / bf16, rank 2), per group:
/// q8 (absmax): scale = max |w| / 127 rounded to f16, q = round(w / scale) (ties away from zero);
/// q4 (Q4_0's): scale = m / −8 rounded to f16, m the entry of largest magnitude, q =
/// clamp(round(w / scale), −8, 7) — so that the largest entry is −8 · scale exactly and each q ·
/// scale is the nearest multiple of the stored scale in range. A group of zeros has scale 0.
/// Throws InputError naming `what` and the entry for a NaN or infinite weight, or a q4 row length
/// that is not a multiple of the group.
QuantizedWeight quantize_weight(const NdArray& w, Quant f, std::int64_t group, const std::string& what);

/// W per entry, as f32 [rows, K] (what Op::dequantize computes).
NdArray dequantize_weight(const QuantizedWeight& w, std::int64_t group);

/// A row of a quantized linear layer's input, rounded to 8 bits in place as every backend reads
/// it (docs/semantics.md, "Quantized weights"; llama.cpp's Q8_0 activations), per group of
/// `group` entries (the weight's; the last one may be short), all in f32: amax = max |x| (NaN if
/// an entry is), d = amax / 127, q = clamp(round(x · (127 / amax)), −127, 127) (0 where amax is
/// not > 0; ties away from zero), x = q · d.
void round_activations(float* x, std::int64_t k, std::int64_t group);

/// What quantize_linear_weights changed.
struct QuantizedModel {
  Graph graph;
  std::vector<std::string> weights;                // the quantized parameters' names, in graph order
  std::vector<Quant> formats;                      // how each of them is stored
  std::int64_t bytes_before = 0, bytes_after = 0;  // the quantized weights' bytes in f32, and now
};

/// The names of the parameters quantize_linear_weights quantizes: rank-2 float parameters [out, in]
/// that only linear layers read, as their weight (not embeddings, norms, biases, nor a table tied
/// to an embedding), in graph order.
std::vector<std::string> quantizable_linear_weights(const Graph& g);

/// What a list of formats holds, for a note: "q8", "q4", or "q4 (N of them q8)".
std::string quant_summary(const std::vector<Quant>& formats);

/// The format a weight of rows of `k` is stored in when `f` is asked for: q4 where it fits, else q8.
Quant quant_for(Quant f, std::int64_t k, std::int64_t group = kQuantGroup);

/// The feeds `name.q8` and `name.q8_scale` (or q4's) of a float weight (quantize_weight, in
/// quant_for's format), for quantizing each weight as it is loaded (the unquantized copy never all
/// resident at once).
void add_quantized_feeds(Feeds& feeds, const std::string& name, const NdArray& w, Quant f,
                         std::int64_t group = kQuantGroup);
/// The feeds of a weight quantized already (a quantized checkpoint's).
void add_quantized_feeds(Feeds& feeds, const std::string& name, QuantizedWeight w);

/// The model with each quantizable linear weight stored quantized: the parameter `name` becomes
/// `name.q8` (or `.q4`, i8) and `name.q8_scale` (f16) read by a dequantize node (Op::dequantize).
/// A fed float weight is quantized (quant_for(f)) and its feed replaced by those two; a weight fed
/// already quantized (add_quantized_feeds, either format) is taken as it is (InputError if their
/// shapes do not fit). A weight fed neither way is left as it is (its missing feed is the
/// backend's error).
QuantizedModel quantize_linear_weights(const Graph& g, Feeds& feeds, Quant f = Quant::q8,
                                       std::int64_t group = kQuantGroup);

/// The same rewrite with no weights at hand (a model compiled ahead of time, whose caller passes
/// them): every quantizable linear weight becomes the parameters `name.q8` / `name.q4` and their
/// scales, shaped from its sizes under `sizes` (quant_for(f): q8 where q4 does not fit).
/// InputError for a weight whose shape is not fixed under `sizes`.
QuantizedModel quantize_linear_graph(const Graph& g, const Bindings& sizes, Quant f = Quant::q8,
                                     std::int64_t group = kQuantGroup);

}  // namespace qkv
