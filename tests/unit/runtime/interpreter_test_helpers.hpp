// Helpers shared by the reference interpreter tests (tests/unit/runtime/test_interpreter*.cpp).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <cmath>
#include <cstring>
#include <limits>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/rng.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace qkv::testing_interp {

using nn::Batch;
using nn::HeadDim;
using nn::Heads;
using nn::Hidden;
using nn::Key;
using nn::Model;
using nn::Seq;

constexpr float kInf = std::numeric_limits<float>::infinity();

// --- helpers ------------------------------------------------------------------------------------

inline std::vector<float> random_values(std::size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline std::size_t count(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

inline NdArray random_array(std::vector<std::int64_t> shape, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> values = random_values(count(shape), seed, lo, hi);
  return NdArray::from_f32(std::move(values), std::move(shape));
}

inline NdArray bool_array(const std::vector<int>& v, std::vector<std::int64_t> shape) {
  NdArray a = NdArray::zeros(DType::boolean, std::move(shape));
  for (std::size_t i = 0; i < v.size(); ++i) a.bytes[i] = std::byte{static_cast<unsigned char>(v[i] != 0)};
  return a;
}

inline Axis ax(std::string name, std::int64_t n) { return Axis{std::move(name), Extent::fixed(n)}; }
inline Axis dyn_ax(std::string name, std::string symbol) {
  return Axis{std::move(name), Extent::dynamic(std::move(symbol))};
}

inline int leaf(Graph& g, std::string name, std::vector<Axis> axes, DType dtype = DType::f32) {
  Node n;
  n.op = Op::input;
  n.name = std::move(name);
  n.axes = std::move(axes);
  n.dtype = dtype;
  return g.add(std::move(n));
}

inline int op(Graph& g, Op o, std::vector<int> inputs, std::vector<Axis> axes, std::vector<std::string> attrs = {}) {
  Node n;
  n.op = o;
  n.inputs = std::move(inputs);
  n.axes = std::move(axes);
  n.attr_axes = std::move(attrs);
  return g.add(std::move(n));
}

/// The value of node `id` as floats.
inline std::vector<float> value_of(const Graph& g, const Feeds& feeds, int id) {
  return interpret_all(g, feeds).at(static_cast<std::size_t>(id)).to_f32();
}

inline std::string shape_error_message(const Graph& g, const Feeds& feeds) {
  try {
    (void)interpret(g, feeds);
  } catch (const ShapeError& e) {
    return e.what();
  }
  return "<no ShapeError thrown>";
}

inline std::string internal_error_message(const Graph& g, const Feeds& feeds) {
  try {
    (void)interpret(g, feeds);
  } catch (const std::logic_error& e) {
    return e.what();
  }
  return "<no logic_error thrown>";
}

}  // namespace qkv::testing_interp
