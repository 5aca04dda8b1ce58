// quantize.cpp — weight-only quantization of linear layers (qkv/runtime/quantize.hpp).
#include <qkv/runtime/quantize.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <utility>

#include <qkv/ir/error.hpp>
#include <qkv/ir/float_dtype.hpp>
#include <qkv/ir/quant.hpp>

namespace qkv {

namespace {
/// std::round's value (halves away from zero) in operations a loop vectorizes.
inline float round_half_away(float v) {
  const float t = std::trunc(v);
  return std::fabs(v - t) >= 0.5f ? t + std::copysign(1.0f, v) : t;
}
}  // namespace

std::string_view quant_name(Quant f) { return f == Quant::q4 ? "q4" : "q8"; }
int quant_bits(Quant f) { return f == Quant::q4 ? 4 : 8; }
std::optional<Quant> parse_quant(std::string_view name) {
  for (const Quant f : {Quant::q8, Quant::q4})
    if (name == quant_name(f)) return f;
  return std::nullopt;
}
std::string quant_suffix(Quant f) { return "." + std::string(quant_name(f)); }
std::string quant_scale_suffix(Quant f) { return quant_suffix(f) + "_scale"; }

bool quantizable(Quant f, std::int64_t k, std::int64_t group) {
  return group >= 1 && (f == Quant::q8 || (group % 2 == 0 && k % group == 0));
}
Quant quant_for(Quant f, std::int64_t k, std::int64_t group) { return quantizable(f, k, group) ? f : Quant::q8; }

std::string quant_summary(const std::vector<Quant>& formats) {
  const auto q4 = std::count(formats.begin(), formats.end(), Quant::q4);
  const auto q8 = static_cast<std::ptrdiff_t>(formats.size()) - q4;
  if (q4 == 0 || q8 == 0) return std::string(quant_name(q4 ? Quant::q4 : Quant::q8));
  return "q4 (" + std::to_string(q8) + " of them q8)";
}

std::vector<std::int64_t> quant_q_shape(Quant f, std::int64_t rows, std::int64_t k) {
  return {rows, f == Quant::q4 ? k / 2 : k};
}
std::vector<std::int64_t> quant_scale_shape(std::int64_t rows, std::int64_t k, std::int64_t group) {
  return {rows, (k + group - 1) / group};
}

QuantizedWeight quantize_weight(const NdArray& w, Quant f, std::int64_t group, const std::string& what) {
  if (w.shape.size() != 2 || !is_model_float(w.dtype) || group < 1)
    throw InputError("quantize: " + what + " must be a float [rows, columns] weight, not " +
                     std::string(dtype_name(w.dtype)) + " " + shape_to_string(w.shape));
  const std::int64_t rows = w.shape[0], k = w.shape[1], groups = (k + group - 1) / group;
  if (!quantizable(f, k, group))
    throw InputError("quantize: " + what + " has rows of " + std::to_string(k) + ", not a multiple of " +
                     std::to_string(group) + " that " + std::string(quant_name(f)) + " needs");
  std::vector<float> widened;  // f16 / bf16 values as floats (f32 ones are read where they are)
  if (w.dtype != DType::f32) widened = w.to_f32();
  const std::span<const float> v = w.dtype == DType::f32 ? w.as<float>() : std::span<const float>(widened);
  QuantizedWeight out{NdArray::zeros(DType::i8, quant_q_shape(f, rows, k)),
                      NdArray::zeros(DType::f16, quant_scale_shape(rows, k, group)), f};
  auto q = out.q.as<std::int8_t>();
  auto s = out.scales.as<std::uint16_t>();
  const bool q4 = f == Quant::q4;
  std::vector<std::int8_t> row_q(static_cast<std::size_t>(group));  // a group's q
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t gi = 0; gi < groups; ++gi) {
      const std::int64_t begin = r * k + gi * group, end = r * k + std::min(k, (gi + 1) * group);
      float amax = 0.0f, largest = 0.0f;  // the largest magnitude, and that entry with its sign
      for (std::int64_t i = begin; i < end; ++i) {
        const float x = v[static_cast<std::size_t>(i)];
        if (!std::isfinite(x))
          throw InputError("quantize: " + what + " has a non-finite value at [" + std::to_string(r) + ", " +
                           std::to_string(i - r * k) + "]");
        if (std::fabs(x) > amax) amax = std::fabs(x), largest = x;
      }
      // The scale as stored (f16), and q from it: q · scale is then the nearest stored value.
      // (A group of zeros: +0, not q4's −0.)
      const std::uint16_t bits =
          amax == 0.0f ? 0 : f32_to_f16(q4 ? largest / -static_cast<float>(kQ4Zero) : amax / 127.0f);
      const float scale = f16_to_f32(bits);
      s[static_cast<std::size_t>(r * groups + gi)] = bits;
      const float lo = q4 ? -static_cast<float>(kQ4Zero) : -127.0f, hi = q4 ? kQ4Zero - 1.0f : 127.0f;
      for (std::int64_t i = begin; i < end; ++i)  // (a loop the compiler vectorizes)
        row_q[static_cast<std::size_t>(i - begin)] = static_cast<std::int8_t>(
            scale != 0.0f ? std::clamp(round_half_away(v[static_cast<std::size_t>(i)] / scale), lo, hi) : 0.0f);
      if (!q4) {
        std::copy(row_q.begin(), row_q.begin() + (end - begin), q.begin() + begin);
        continue;
      }
      for (std::int64_t i = begin; i < end; ++i) {
        const std::int64_t col = i - r * k;
        const auto nibble = static_cast<unsigned>(row_q[static_cast<std::size_t>(i - begin)] + kQ4Zero);
        auto& byte = reinterpret_cast<std::uint8_t&>(q[static_cast<std::size_t>(r * (k / 2) + q4_byte(col, group))]);
        byte =
            static_cast<std::uint8_t>(q4_high(col, group) ? (byte & 0x0Fu) | (nibble << 4) : (byte & 0xF0u) | nibble);
      }
    }
  return out;
}

std::vector<std::string> quantizable_linear_weights(const Graph& g) {
  std::vector<bool> take(g.size(), false), by_linear(g.size(), false);
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    const Node& n = g.node(id);
    take[static_cast<std::size_t>(id)] = n.op == Op::param && n.axes.size() == 2 && is_model_float(n.dtype);
  }
  for (const Node& n : g.nodes())
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const auto in = static_cast<std::size_t>(n.inputs[k]);
      // (Only a linear over x's last axis: its kernels round x's rows as a quantized weight's
      // linear reads them.)
      if (n.op == Op::linear && k == 1 && n.attr_axes.size() == 2 && !g.node(n.inputs[0]).axes.empty() &&
          g.node(n.inputs[0]).axes.back().name == n.attr_axes[0])
        by_linear[in] = true;
      else
        take[in] = false;
    }
  for (const auto& o : g.outputs()) take[static_cast<std::size_t>(o.node)] = false;
  std::vector<std::string> names;
  for (int id = 0; id < static_cast<int>(g.size()); ++id)
    if (take[static_cast<std::size_t>(id)] && by_linear[static_cast<std::size_t>(id)]) names.push_back(g.node(id).name);
  return names;
}

void round_activations(float* x, std::int64_t k, std::int64_t group) {
  for (std::int64_t k0 = 0; k0 < k; k0 += group) {
    const std::int64_t end = std::min(k, k0 + group);
    float amax = 0.0f;
    for (std::int64_t i = k0; i < end; ++i)
      amax = std::isnan(amax) || std::isnan(x[i]) ? std::numeric_limits<float>::quiet_NaN()
                                                  : std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (std::int64_t i = k0; i < end; ++i) {
      const float q = std::fmin(std::fmax(std::round(x[i] * inv), -127.0f), 127.0f);
      x[i] = q * d;
    }
  }
}

NdArray dequantize_weight(const QuantizedWeight& w, std::int64_t group) {
  const bool q4 = w.format == Quant::q4;
  const std::int64_t rows = w.q.shape.at(0), bytes = w.q.shape.at(1), k = w.columns(), groups = w.scales.shape.at(1);
  NdArray out = NdArray::zeros(DType::f32, {rows, k});
  const auto q = w.q.as<std::int8_t>();
  const auto s = w.scales.as<std::uint16_t>();
  auto o = out.as<float>();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < k; ++i) {
      int value = q[static_cast<std::size_t>(r * bytes + (q4 ? q4_byte(i, group) : i))];
      if (q4) value = q4_value(static_cast<std::uint8_t>(value), q4_high(i, group));
      o[static_cast<std::size_t>(r * k + i)] =
          static_cast<float>(value) * f16_to_f32(s[static_cast<std::size_t>(r * groups + i / group)]);
    }
  return out;
}

void add_quantized_feeds(Feeds& feeds, const std::string& name, const NdArray& w, Quant f, std::int64_t group) {
  const std::int64_t k = w.shape.size() == 2 ? w.shape[1] : 0;
  add_quantized_feeds(feeds, name, quantize_weight(w, quant_for(f, k, group), group, "`" + name + "`"));
}

void add_quantized_feeds(Feeds& feeds, const std::string& name, QuantizedWeight w) {
  feeds[name + quant_suffix(w.format)] = std::move(w.q);
  feeds[name + quant_scale_suffix(w.format)] = std::move(w.scales);
}

namespace {
/// Adds to `out.graph` weight `n` stored as `format`, [rows, k]: its q and scales (params named
/// by the suffixes) read by a dequantize node, whose id it returns; a run-time width checked
/// against k; the weight's bytes counted.
int add_quantized_weight(QuantizedModel& out, const Node& n, Quant format, std::int64_t rows, std::int64_t k,
                         std::int64_t group) {
  // A weight whose columns are a run-time size: that size must be the stored weight's (the
  // kernels read q's rows by it).
  const Extent& columns = n.axes.back().extent;
  if (!columns.is_static())
    out.graph.require(
        {Constraint::Kind::equal, columns, Extent::fixed(k),
         "`" + n.name + "` is stored with " + std::to_string(k) + " columns, `" + columns.symbol + "` is {a}"});
  const std::vector<std::int64_t> q_shape = quant_q_shape(format, rows, k), s_shape = quant_scale_shape(rows, k, group);
  out.bytes_before += rows * k * 4;
  out.bytes_after += q_shape[0] * q_shape[1] + s_shape[0] * s_shape[1] * 2;
  Node qn = n, sn = n, d;
  qn.name = n.name + quant_suffix(format);
  qn.dtype = DType::i8;
  qn.axes.back().extent = Extent::fixed(q_shape[1]);
  sn.name = n.name + quant_scale_suffix(format);
  sn.dtype = DType::f16;
  sn.axes.back() = {n.axes.back().name + "_groups", Extent::fixed(s_shape[1])};
  d.op = Op::dequantize;
  d.axes = n.axes;
  d.offset = group;
  d.scalar = quant_bits(format) == 4 ? 4.0 : 0.0;
  d.inputs = {out.graph.add(std::move(qn)), out.graph.add(std::move(sn))};
  out.weights.push_back(n.name);
  out.formats.push_back(format);
  return out.graph.add(std::move(d));
}

/// How a weight is stored: [rows, k] as `format`.
struct StoredAs {
  std::int64_t rows, k;
  Quant format;
};

/// quantize_linear_weights's walk: each node copied into the result, a quantizable weight for
/// which `stored` says how (nullopt: left as it is) replaced.
template <class Stored>
QuantizedModel rewrite_linear_weights(const Graph& g, std::int64_t group, Stored&& stored) {
  const std::vector<std::string> names = quantizable_linear_weights(g);
  QuantizedModel out;
  std::vector<int> remap(g.size(), -1);
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    Node n = g.node(id);
    for (int& in : n.inputs) in = remap[static_cast<std::size_t>(in)];
    const bool weight = n.op == Op::param && std::find(names.begin(), names.end(), n.name) != names.end();
    const auto how = weight ? stored(n) : std::nullopt;
    remap[static_cast<std::size_t>(id)] =
        how ? add_quantized_weight(out, n, how->format, how->rows, how->k, group) : out.graph.add(std::move(n));
  }
  for (const auto& o : g.outputs()) out.graph.mark_output(remap[static_cast<std::size_t>(o.node)], o.name);
  for (const auto& c : g.constraints()) out.graph.require(c);
  return out;
}
}  // namespace

QuantizedModel quantize_linear_graph(const Graph& g, const Bindings& sizes, Quant f, std::int64_t group) {
  return rewrite_linear_weights(g, group, [&](const Node& n) -> std::optional<StoredAs> {
    const auto rows = n.axes.front().extent.resolve(sizes), k = n.axes.back().extent.resolve(sizes);
    if (!rows || !k)
      throw InputError("quantize: `" + n.name + "` has a run-time size (" + n.axes.front().extent.str() + " x " +
                       n.axes.back().extent.str() + "); a quantized weight's shape must be fixed");
    return StoredAs{*rows, *k, quant_for(f, *k, group)};
  });
}

QuantizedModel quantize_linear_weights(const Graph& g, Feeds& feeds, Quant f, std::int64_t group) {
  return rewrite_linear_weights(g, group, [&](const Node& n) -> std::optional<StoredAs> {
    const auto fed = feeds.find(n.name);
    const bool as_float = fed != feeds.end() && fed->second.shape.size() == 2 && is_model_float(fed->second.dtype);
    // Fed quantized already: the format whose two feeds are there.
    std::optional<Quant> stored;
    for (const Quant s : {Quant::q8, Quant::q4})
      if (feeds.count(n.name + quant_suffix(s)) && feeds.count(n.name + quant_scale_suffix(s))) stored = s;
    if (!as_float && !stored) return std::nullopt;  // fed neither way: left as it is
    if (as_float) {
      stored = quant_for(f, fed->second.shape[1], group);
      add_quantized_feeds(feeds, n.name, fed->second, f, group);
      feeds.erase(n.name);
    }
    const Quant format = *stored;
    const std::string q_name = n.name + quant_suffix(format), s_name = n.name + quant_scale_suffix(format);
    const NdArray &q = feeds.at(q_name), &s = feeds.at(s_name);
    const std::int64_t k = q.shape.size() == 2 ? (format == Quant::q4 ? 2 * q.shape[1] : q.shape[1]) : 0;
    const bool fits = q.dtype == DType::i8 && q.shape.size() == 2 && s.dtype == DType::f16 &&
                      quantizable(format, k, group) && s.shape == quant_scale_shape(q.shape[0], k, group) &&
                      (!n.axes.back().extent.is_static() || n.axes.back().extent.value == k);
    if (!fits)
      throw InputError("quantize: `" + q_name + "` (" + std::string(dtype_name(q.dtype)) + " " +
                       shape_to_string(q.shape) + ") and `" + s_name + "` (" + std::string(dtype_name(s.dtype)) + " " +
                       shape_to_string(s.shape) + ") are not an i8 " + std::string(quant_name(format)) +
                       " weight and its f16 scales per " + std::to_string(group));
    return StoredAs{q.shape[0], k, format};
  });
}

}  // namespace qkv
