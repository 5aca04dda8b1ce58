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

std::vector<std::string> quantizable_linear_weights(const Graph& g) {
  std::vector<bool> take(g.size(), false), by_linear(g.size(), false);
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    const Node& n = g.node(id);
    take[static_cast<std::size_t>(id)] = n.op == Op::param && n.axes.size() == 2 && is_model_float(n.dtype);
  }
  for (const Node& n : g.nodes())
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const auto in = static_cast<std::size_t>(n.inputs[k]);
      if (n.op == Op::linear && k == 1)
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

NdArray dequantize_q8(const QuantizedWeight& w, std::int64_t group) {
  const std::int64_t rows = w.q.shape.at(0), k = w.q.shape.at(1), groups = w.scales.shape.at(1);
  NdArray out = NdArray::zeros(DType::f32, {rows, k});
  const auto q = w.q.as<std::int8_t>();
  const auto s = w.scales.as<std::uint16_t>();
  auto o = out.as<float>();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < k; ++i)
      o[static_cast<std::size_t>(r * k + i)] = static_cast<float>(q[static_cast<std::size_t>(r * k + i)]) *
                                               f16_to_f32(s[static_cast<std::size_t>(r * groups + i / group)]);
  return out;
}

void add_q8_feeds(Feeds& feeds, const std::string& name, const NdArray& w, std::int64_t group) {
  add_q8_feeds(feeds, name, quantize_q8(w, group, "`" + name + "`"));
}

void add_q8_feeds(Feeds& feeds, const std::string& name, QuantizedWeight w) {
  feeds[name + kQ8Suffix] = std::move(w.q);
  feeds[name + kQ8ScaleSuffix] = std::move(w.scales);
}

QuantizedModel quantize_linear_weights(const Graph& g, Feeds& feeds, std::int64_t group) {
  const std::vector<std::string> names = quantizable_linear_weights(g);
  QuantizedModel out;
  std::vector<int> remap(g.size(), -1);
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    Node n = g.node(id);
    for (int& in : n.inputs) in = remap[static_cast<std::size_t>(in)];
    const bool weight = n.op == Op::param && std::find(names.begin(), names.end(), n.name) != names.end();
    const std::string q_name = n.name + kQ8Suffix, s_name = n.name + kQ8ScaleSuffix;
    const auto fed = feeds.find(n.name);
    const bool as_float =
        weight && fed != feeds.end() && fed->second.shape.size() == 2 && is_model_float(fed->second.dtype);
    if (!as_float && !(weight && feeds.count(q_name) && feeds.count(s_name))) {
      remap[static_cast<std::size_t>(id)] = out.graph.add(std::move(n));
      continue;
    }
    if (as_float) {
      add_q8_feeds(feeds, n.name, fed->second, group);
      feeds.erase(n.name);
    }
    const NdArray &q = feeds.at(q_name), &s = feeds.at(s_name);
    if (q.dtype != DType::i8 || q.shape.size() != 2 || s.dtype != DType::f16 ||
        s.shape != std::vector<std::int64_t>{q.shape[0], (q.shape[1] + group - 1) / group})
      throw InputError("quantize: `" + q_name + "` (" + std::string(dtype_name(q.dtype)) + " " +
                       shape_to_string(q.shape) + ") and `" + s_name + "` (" + std::string(dtype_name(s.dtype)) + " " +
                       shape_to_string(s.shape) + ") are not an i8 weight and its f16 scales per " +
                       std::to_string(group));
    out.bytes_before += static_cast<std::int64_t>(q.shape[0] * q.shape[1]) * 4;
    out.bytes_after += static_cast<std::int64_t>(q.bytes.size() + s.bytes.size());
    Node qn = n, sn = n, d;
    qn.name = q_name;
    qn.dtype = DType::i8;
    sn.name = s_name;
    sn.dtype = DType::f16;
    sn.axes.back() = {n.axes.back().name + "_groups", Extent::fixed(s.shape[1])};
    d.op = Op::dequantize;
    d.axes = n.axes;
    d.offset = group;
    d.inputs = {out.graph.add(std::move(qn)), out.graph.add(std::move(sn))};
    remap[static_cast<std::size_t>(id)] = out.graph.add(std::move(d));
    out.weights.push_back(n.name);
  }
  for (const auto& o : g.outputs()) out.graph.mark_output(remap[static_cast<std::size_t>(o.node)], o.name);
  for (const auto& c : g.constraints()) out.graph.require(c);
  return out;
}

}  // namespace qkv
