// quantize.cpp — weight-only quantization of linear layers (qkv/runtime/quantize.hpp).
#include <qkv/runtime/quantize.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include <qkv/ir/error.hpp>
#include <qkv/ir/float_dtype.hpp>

namespace qkv {

QuantizedWeight quantize_q8(const NdArray& w, std::int64_t group, const std::string& what) {
  if (w.shape.size() != 2 || !is_model_float(w.dtype) || group < 1)
    throw InputError("quantize: " + what + " must be a float [rows, columns] weight, not " +
                     std::string(dtype_name(w.dtype)) + " " + shape_to_string(w.shape));
  const std::int64_t rows = w.shape[0], k = w.shape[1], groups = (k + group - 1) / group;
  const std::vector<float> v = w.to_f32();
  QuantizedWeight out{NdArray::zeros(DType::i8, {rows, k}), NdArray::zeros(DType::f16, {rows, groups})};
  auto q = out.q.as<std::int8_t>();
  auto s = out.scales.as<std::uint16_t>();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t gi = 0; gi < groups; ++gi) {
      const std::int64_t begin = r * k + gi * group, end = r * k + std::min(k, (gi + 1) * group);
      float amax = 0.0f;
      for (std::int64_t i = begin; i < end; ++i) {
        const float x = v[static_cast<std::size_t>(i)];
        if (!std::isfinite(x))
          throw InputError("quantize: " + what + " has a non-finite value at [" + std::to_string(r) + ", " +
                           std::to_string(i - r * k) + "]");
        amax = std::max(amax, std::fabs(x));
      }
      // The scale as stored (f16), and q from it: q · scale is then the nearest stored value.
      const std::uint16_t bits = f32_to_f16(amax / 127.0f);
      const float scale = f16_to_f32(bits);
      s[static_cast<std::size_t>(r * groups + gi)] = bits;
      for (std::int64_t i = begin; i < end; ++i) {
        const float x = v[static_cast<std::size_t>(i)];
        const float t = scale > 0.0f ? std::clamp(std::round(x / scale), -127.0f, 127.0f) : 0.0f;
        q[static_cast<std::size_t>(i)] = static_cast<std::int8_t>(t);
      }
    }
  return out;
}

QuantizedModel quantize_linear_weights(const Graph& g, Feeds& feeds, std::int64_t group) {
  // The weights to quantize: fed rank-2 float parameters that only linear layers read, as W.
  std::vector<bool> take(g.size(), false);
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    const Node& n = g.node(id);
    const auto it = feeds.find(n.name);
    take[static_cast<std::size_t>(id)] = n.op == Op::param && n.axes.size() == 2 && is_model_float(n.dtype) &&
                                         it != feeds.end() && it->second.shape.size() == 2 &&
                                         is_model_float(it->second.dtype);
  }
  std::vector<bool> by_linear(g.size(), false);
  for (const Node& n : g.nodes())
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const auto in = static_cast<std::size_t>(n.inputs[k]);
      if (n.op == Op::linear && k == 1)
        by_linear[in] = true;
      else
        take[in] = false;
    }
  for (const auto& o : g.outputs()) take[static_cast<std::size_t>(o.node)] = false;
  QuantizedModel out;
  std::vector<int> remap(g.size(), -1);
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    Node n = g.node(id);
    for (int& in : n.inputs) in = remap[static_cast<std::size_t>(in)];
    if (!take[static_cast<std::size_t>(id)] || !by_linear[static_cast<std::size_t>(id)]) {
      remap[static_cast<std::size_t>(id)] = out.graph.add(std::move(n));
      continue;
    }
    const auto it = feeds.find(n.name);
    out.bytes_before += static_cast<std::int64_t>(it->second.bytes.size());
    QuantizedWeight qw = quantize_q8(it->second, group, "`" + n.name + "`");
    out.bytes_after += static_cast<std::int64_t>(qw.q.bytes.size() + qw.scales.bytes.size());
    Node q = n, s = n, d;
    q.name = n.name + ".q8";
    q.dtype = DType::i8;
    s.name = n.name + ".q8_scale";
    s.dtype = DType::f16;
    s.axes.back() = {n.axes.back().name + "_groups", Extent::fixed(qw.scales.shape[1])};
    d.op = Op::dequantize;
    d.axes = n.axes;
    d.offset = group;
    d.inputs = {out.graph.add(std::move(q)), out.graph.add(std::move(s))};
    remap[static_cast<std::size_t>(id)] = out.graph.add(std::move(d));
    out.weights.push_back(n.name);
    feeds.erase(it);
    feeds[n.name + ".q8"] = std::move(qw.q);
    feeds[n.name + ".q8_scale"] = std::move(qw.scales);
  }
  for (const auto& o : g.outputs()) out.graph.mark_output(remap[static_cast<std::size_t>(o.node)], o.name);
  for (const auto& c : g.constraints()) out.graph.require(c);
  return out;
}

}  // namespace qkv
