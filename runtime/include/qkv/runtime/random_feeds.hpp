// qkv/runtime/random_feeds.hpp — seeded inputs and weights for a graph: for examples, the CLI's
// shape-only models (`--seed`), benchmarks and property tests.
#pragma once

#include <cstdint>

#include <qkv/runtime/interpreter.hpp>

namespace qkv {

/// An array for every input and param of `g`, shaped by `b`: floats uniform in [-scale, scale)
/// (Philox-based, so the same seed gives the same arrays on every machine), masks all `true`
/// (keep everything), a size fed by value (qkv::size_input) the size `b` binds. Throws
/// ShapeError if an extent is not bound by `b`.
Feeds random_feeds(const Graph& g, const Bindings& b, std::uint64_t seed, float scale = 1.0f);

/// A [B, S] keep-mask where row b keeps its first lengths[b] keys (padding at the end).
NdArray keep_first(const std::vector<std::int64_t>& lengths, std::int64_t len);

}  // namespace qkv
