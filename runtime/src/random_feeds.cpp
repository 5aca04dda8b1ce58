#include <qkv/runtime/random_feeds.hpp>

#include <qkv/runtime/rng.hpp>

namespace qkv {

Feeds random_feeds(const Graph& g, const Bindings& b, std::uint64_t seed, float scale) {
  Feeds feeds;
  std::uint32_t stream = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != Op::input && n.op != Op::param) continue;
    ++stream;
    if (feeds.contains(n.name)) continue;
    if (is_size_input(n)) {  // the size itself
      const auto v = n.dim->resolve(b);
      if (!v) throw ShapeError("random_feeds: the size '" + n.name + "' (" + n.dim->str() + ") is not bound");
      NdArray size = NdArray::zeros(DType::i64, {});
      size.as<std::int64_t>()[0] = *v;
      feeds[n.name] = std::move(size);
      continue;
    }
    std::vector<std::int64_t> shape;
    for (const Axis& a : n.axes) {
      auto v = a.extent.resolve(b);
      if (!v)
        throw ShapeError("random_feeds: '" + n.name + "' axis `" + a.name + "` (" + a.extent.str() + ") is not bound");
      shape.push_back(*v);
    }
    NdArray arr = NdArray::zeros(n.dtype == DType::boolean ? DType::boolean : DType::f32, shape);
    if (n.dtype == DType::boolean) {
      for (bool& x : arr.as<bool>()) x = true;
    } else {
      auto data = arr.as<float>();
      for (std::size_t i = 0; i < data.size(); ++i) {
        // One Philox draw per element, keyed by seed; the stream separates the tensors.
        const float u =
            dropout_uniform(seed, stream, 0, static_cast<std::uint32_t>(i >> 32), static_cast<std::uint32_t>(i));
        data[i] = (2.0f * u - 1.0f) * scale;
      }
    }
    feeds[n.name] = std::move(arr);
  }
  return feeds;
}

NdArray keep_first(const std::vector<std::int64_t>& lengths, std::int64_t len) {
  NdArray m = NdArray::zeros(DType::boolean, {static_cast<std::int64_t>(lengths.size()), len});
  auto data = m.as<bool>();
  for (std::size_t b = 0; b < lengths.size(); ++b)
    for (std::int64_t s = 0; s < len; ++s)
      data[b * static_cast<std::size_t>(len) + static_cast<std::size_t>(s)] = s < lengths[b];
  return m;
}

}  // namespace qkv
