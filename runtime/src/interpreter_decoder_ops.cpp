// runtime/src/interpreter_decoder_ops.cpp — the reference interpreter's decoder ops: RMSNorm,
// SiLU, RoPE, embedding and argmax (the rules: docs/semantics.md; the helpers: interpreter_ops.hpp).
#include <algorithm>
#include <cmath>
#include <cstddef>

#include <qkv/ir/quant.hpp>
#include <qkv/ir/rope.hpp>

#include "interpreter_ops.hpp"

namespace qkv::interp {

namespace {

/// x·σ(x) in double; silu(−∞) = −0 and silu(+∞) = +∞, the limits.
float silu(float x) {
  if (std::isinf(x) && x < 0.0f) return -0.0f;
  const double v = x;
  return static_cast<float>(v / (1.0 + std::exp(-v)));
}

/// How an error names the ids: `name` for a graph input, else the node.
std::string ids_label(const Graph& g, int id) {
  const Node& n = g.node(id);
  return n.op == Op::input ? "`" + n.name + "`" : node_label(g, id);
}

}  // namespace

/// rms_norm over attr_axes[0]: x / sqrt(mean(x²) + eps) · weight, in double (Hugging Face's
/// LlamaRMSNorm computes in f32: the difference is f32 rounding).
Value op_rms_norm(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 1);
  const Value &X = *a.in[0], &W = *a.in[1];
  const std::size_t p = axis_pos(a, a.in_nodes[0]->axes, a.node.attr_axes[0], "input");
  const Around r = around(X.shape, p);
  if (W.shape.size() != 1) internal_error(where(a) + "the weight must have one axis, has " + shape_str(W.shape));
  expect_same_size(a, a.node.attr_axes[0], r.n, W.shape[0]);
  Value out{X.shape, std::vector<float>(X.data.size())};
  for (std::int64_t o = 0; o < r.outer; ++o) {
    for (std::int64_t i = 0; i < r.inner; ++i) {
      auto at = [&](std::int64_t k) { return static_cast<std::size_t>((o * r.n + k) * r.inner + i); };
      double ss = 0.0;
      for (std::int64_t k = 0; k < r.n; ++k) ss += static_cast<double>(X.data[at(k)]) * X.data[at(k)];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(r.n) + a.node.scalar);
      for (std::int64_t k = 0; k < r.n; ++k)
        out.data[at(k)] = static_cast<float>(X.data[at(k)] * inv * W.data[static_cast<std::size_t>(k)]);
    }
  }
  return out;
}

/// rope (x, positions): feature pair (i, i + D/2) of attr_axes[0] turned by rope_angle at the
/// position of x's index along attr_axes[1] (qkv/ir/rope.hpp), in f32 as Hugging Face computes
/// q·cos + rotate_half(q)·sin. Positions broadcast into x by name.
Value op_rope(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 2);
  if (!a.node.rope) internal_error(where(a) + "has no rope attributes");
  const Value &X = *a.in[0], &P = *a.in[1];
  const auto& xn = *a.in_nodes[0];
  const std::size_t p = axis_pos(a, xn.axes, a.node.attr_axes[0], "x");
  axis_pos(a, a.in_nodes[1]->axes, a.node.attr_axes[1], "positions");
  const Around r = around(X.shape, p);
  if (r.n % 2 != 0) internal_error(where(a) + "an odd feature count " + std::to_string(r.n));
  const std::int64_t half = r.n / 2;
  const Shape ps = strides_by_name(names_of(xn.axes), a.in_nodes[1]->axes, P.shape);
  std::vector<float> inv(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i)
    inv[static_cast<std::size_t>(i)] = static_cast<float>(rope_inv_freq(*a.node.rope, i, r.n));
  Value out{X.shape, std::vector<float>(X.data.size())};
  Shape idx(X.shape.size(), 0);
  const Shape xs = strides_of(X.shape);
  if (numel(X.shape) == 0) return out;
  do {
    if (idx[p] >= half) continue;
    std::int64_t base = 0, pos_at = 0;
    for (std::size_t k = 0; k < idx.size(); ++k) {
      base += idx[k] * xs[k];
      pos_at += idx[k] * ps[k];
    }
    const float position = P.data[static_cast<std::size_t>(pos_at)];
    const float angle = inv[static_cast<std::size_t>(idx[p])] * position;
    const auto c = static_cast<float>(std::cos(static_cast<double>(angle)));
    const auto s = static_cast<float>(std::sin(static_cast<double>(angle)));
    const auto lo = static_cast<std::size_t>(base), hi = static_cast<std::size_t>(base + half * xs[p]);
    const float x0 = X.data[lo], x1 = X.data[hi];
    const float a0 = x0 * c, b0 = (-x1) * s, a1 = x1 * c, b1 = x0 * s;
    out.data[lo] = a0 + b0;
    out.data[hi] = a1 + b1;
  } while (next_index(idx, X.shape));
  return out;
}

/// embedding (table [rows, features], ids): out[ids axes..., f] = table[ids[...], f]; an id
/// outside [0, rows) is an InputError naming it and the ids' input.
Value op_embedding(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 2);
  const Value &T = *a.in[0], &ids = *a.in[1];
  if (T.shape.size() != 2) internal_error(where(a) + "the table must be [rows, features], is " + shape_str(T.shape));
  const std::int64_t rows = T.shape[0], width = T.shape[1];
  Shape out_shape = ids.shape;
  out_shape.push_back(width);
  Value out{out_shape, std::vector<float>(static_cast<std::size_t>(numel(out_shape)))};
  for (std::size_t k = 0; k < ids.data.size(); ++k) {
    const float id = ids.data[k];
    if (!(id >= 0.0f && id < static_cast<float>(rows)))
      throw InputError(embedding_id_message(a.node.name, id, static_cast<std::int64_t>(k),
                                            ids_label(a.graph, a.node.inputs[1]), rows));
    const auto row = static_cast<std::size_t>(id) * static_cast<std::size_t>(width);
    std::copy_n(T.data.begin() + static_cast<std::ptrdiff_t>(row), width,
                out.data.begin() + static_cast<std::ptrdiff_t>(k * static_cast<std::size_t>(width)));
  }
  return out;
}

/// embedding_grad (dy [ids axes..., features], ids) -> [rows, features]: row r sums, in double, dy's
/// rows whose id is r, in the ids' order; an id outside [0, rows) adds to none.
Value op_embedding_grad(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 2);
  const Value &dy = *a.in[0], &ids = *a.in[1];
  const Shape out_shape = declared_shape(a);
  if (out_shape.size() != 2 || dy.shape.size() != ids.shape.size() + 1 || dy.shape.back() != out_shape[1])
    internal_error(where(a) + "dy " + shape_str(dy.shape) + " and ids " + shape_str(ids.shape) + " do not give " +
                   shape_str(out_shape));
  const std::int64_t rows = out_shape[0], width = out_shape[1];
  std::vector<double> sum(static_cast<std::size_t>(rows * width), 0.0);
  for (std::size_t k = 0; k < ids.data.size(); ++k) {
    const float id = ids.data[k];
    if (!(id >= 0.0f && id < static_cast<float>(rows))) continue;
    const auto row = static_cast<std::size_t>(id) * static_cast<std::size_t>(width);
    for (std::int64_t f = 0; f < width; ++f)
      sum[row + static_cast<std::size_t>(f)] +=
          dy.data[k * static_cast<std::size_t>(width) + static_cast<std::size_t>(f)];
  }
  return Value{out_shape, std::vector<float>(sum.begin(), sum.end())};
}

/// q[..., k] · scale[..., k / group] (a q4 q: its entry's nibble − 8, qkv/ir/quant.hpp): the
/// reference a quantized linear's kernels are checked against (the interpreter holds q and the
/// scales as the floats they are; a q4 byte as the signed value of its bits).
Value op_dequantize(const OpArgs& a) {
  expect_inputs(a);
  const Value &q = *a.in[0], &s = *a.in[1];
  const std::int64_t group = a.node.offset;
  const bool q4 = dequantizes_q4(a.node);
  if (group < 1 || q.shape.empty() || s.shape.size() != q.shape.size() || (q4 && group % 2 != 0))
    internal_error(where(a) + "q " + shape_str(q.shape) + " and scales " + shape_str(s.shape) + " in groups of " +
                   std::to_string(group) + " do not fit");
  const std::int64_t bytes = q.shape.back(), k = q4 ? 2 * bytes : bytes, groups = (k + group - 1) / group;
  Shape want = q.shape;
  want.back() = groups;
  if (s.shape != want || (q4 && k % group != 0))
    internal_error(where(a) + "scales " + shape_str(s.shape) + " for q " + shape_str(q.shape) + " need " +
                   shape_str(want));
  Shape shape = q.shape;
  shape.back() = k;
  const std::size_t rows = k > 0 ? q.data.size() / static_cast<std::size_t>(bytes) : 0;
  Value out{shape, std::vector<float>(rows * static_cast<std::size_t>(k))};
  for (std::size_t row = 0; row < rows; ++row)
    for (std::int64_t col = 0; col < k; ++col) {
      float v =
          q.data[row * static_cast<std::size_t>(bytes) + static_cast<std::size_t>(q4 ? q4_byte(col, group) : col)];
      if (q4)
        v = static_cast<float>(q4_value(static_cast<std::uint8_t>(static_cast<int>(v) & 0xFF), q4_high(col, group)));
      out.data[row * static_cast<std::size_t>(k) + static_cast<std::size_t>(col)] =
          v * s.data[row * static_cast<std::size_t>(groups) + static_cast<std::size_t>(col / group)];
    }
  return out;
}

/// argmax along attr_axes[0] (dropped): the first index of the largest entry; the first NaN
/// wins (torch.argmax).
Value op_argmax(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 1);
  const Value& X = *a.in[0];
  const std::size_t p = axis_pos(a, a.in_nodes[0]->axes, a.node.attr_axes[0], "input");
  const Around r = around(X.shape, p);
  Value out{without_axis(X.shape, p), std::vector<float>(static_cast<std::size_t>(r.outer * r.inner), 0.0f)};
  for (std::int64_t o = 0; o < r.outer; ++o) {
    for (std::int64_t i = 0; i < r.inner; ++i) {
      std::int64_t best = 0;
      for (std::int64_t k = 1; k < r.n; ++k) {
        const float b = X.data[static_cast<std::size_t>((o * r.n + best) * r.inner + i)];
        const float v = X.data[static_cast<std::size_t>((o * r.n + k) * r.inner + i)];
        if (std::isnan(b)) break;
        if (v > b || std::isnan(v)) best = k;
      }
      out.data[static_cast<std::size_t>(o * r.inner + i)] = static_cast<float>(best);
    }
  }
  return out;
}

Value op_silu(const OpArgs& a) { return unary_map(a, silu); }

/// update_slice: x with rows written at [start, start + n) of attr_axes[0] — a KV cache's append
/// (the backends write in place when the output is the input's own buffer).
Value op_update_slice(const OpArgs& a) {
  expect_inputs(a);
  expect_attrs(a, 2);
  const Value &X = *a.in[0], &R = *a.in[1];
  const std::size_t p = axis_pos(a, a.in_nodes[0]->axes, a.node.attr_axes[0], "input");
  const std::size_t q = axis_pos(a, a.in_nodes[1]->axes, a.node.attr_axes[1], "rows");
  if (p != q || R.shape.size() != X.shape.size()) internal_error(where(a) + "the rows' axes do not match x's");
  if (!a.node.dim) internal_error(where(a) + "has no start");
  const auto start = a.node.dim->resolve(a.bindings);
  if (!start) internal_error(where(a) + "its start " + a.node.dim->str() + " is not bound");
  for (std::size_t k = 0; k < X.shape.size(); ++k)
    if (k != p) expect_same_size(a, a.in_nodes[0]->axes[k].name, X.shape[k], R.shape[k]);
  const std::int64_t n = R.shape[p];
  if (*start + n > X.shape[p])
    throw ShapeError(where(a) + "rows [" + std::to_string(*start) + ", " + std::to_string(*start + n) +
                     ") do not fit `" + a.node.attr_axes[0] + "`, which holds " + std::to_string(X.shape[p]) +
                     "; fix: a larger capacity, or fewer positions");
  Value out = X;
  const Around r = around(X.shape, p);
  for (std::int64_t o = 0; o < r.outer; ++o) {
    const auto from = R.data.begin() + static_cast<std::ptrdiff_t>(o * n * r.inner);
    std::copy(from, from + static_cast<std::ptrdiff_t>(n * r.inner),
              out.data.begin() + static_cast<std::ptrdiff_t>((o * r.n + *start) * r.inner));
  }
  return out;
}

}  // namespace qkv::interp
