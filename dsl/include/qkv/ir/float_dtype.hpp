// qkv/ir/float_dtype.hpp — a whole model moved to another floating-point storage dtype, the
// Graph IR's counterpart of PyTorch's `model.to(torch.bfloat16)` fed inputs of that dtype.
//
// The DSL types each tensor (`Tensor<bf16, …>`); the CLI builds its models with the f32 blocks of
// qkv::nn and moves them here with `--dtype`, so that one decision says which values change:
//   every f32 input, parameter and computed value becomes `to` (each op's result is rounded to
//   `to` where it is made, as in PyTorch); bool masks, integer ids, positions and sizes keep
//   their dtypes; log-sum-exps stay f32 (FlashAttention returns its lse in fp32 for half
//   inputs); an explicit `convert` keeps the dtype its author chose; a quantized weight's
//   values stay f32 (q · scale is exact in f32, and the linear layers read q and the scales).
// Kernels still accumulate in fp32 (docs/semantics.md); only how values are stored changes.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <qkv/ir/dtype.hpp>
#include <qkv/ir/graph.hpp>

namespace qkv {

/// Whether `t` is a dtype a whole model can be stored in (f32, f16, bf16).
inline bool is_model_float(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

/// Whether node `n`'s value follows the model's float dtype (see the header comment).
inline bool follows_model_dtype(const Node& n) {
  return n.dtype == DType::f32 && n.op != Op::logsumexp && n.op != Op::attention_lse && n.op != Op::convert &&
         n.op != Op::dequantize;
}

/// `g` with every value that follows the model's dtype stored as `to`; `g` itself when `to` is f32.
/// Throws std::invalid_argument for a `to` that is not f32, f16 or bf16.
inline Graph with_float_dtype(const Graph& g, DType to) {
  if (!is_model_float(to))
    throw std::invalid_argument("with_float_dtype: a model is stored as f32, f16 or bf16, not " +
                                std::string(dtype_name(to)));
  if (to == DType::f32) return g;
  Graph out;
  for (Node n : g.nodes()) {
    if (follows_model_dtype(n)) n.dtype = to;
    out.add(std::move(n));
  }
  for (const auto& o : g.outputs()) out.mark_output(o.node, o.name);
  for (const auto& c : g.constraints()) out.require(c);
  return out;
}

/// Mixed precision as training runs it (PyTorch's autocast over fp32 master weights): `g` computed
/// in `to` (bf16 or f16) while its f32 leaves stay f32 — every parameter and float input is read
/// through one convert<to> — and the nodes from `keep_from` on (a loss appended last:
/// cross-entropy and its log-sum-exp) keep their dtypes, reading `to` values through one
/// convert<f32> each. The gradients by the parameters are then f32: convert's rule rounds nothing
/// on the way back but widens the `to` gradient of each convert. Returns the graph and, per node
/// of g, its id there (a leaf's id is its f32 leaf's, not the convert's).
struct ComputeDtype {
  Graph graph;
  std::vector<int> id;
};
inline ComputeDtype with_compute_dtype(const Graph& g, DType to, int keep_from) {
  if (to != DType::bf16 && to != DType::f16)
    throw std::invalid_argument("with_compute_dtype: compute in bf16 or f16, not " + std::string(dtype_name(to)));
  ComputeDtype r;
  Graph& out = r.graph;
  std::vector<int> value(g.size(), -1);  // what a reader of each node of g reads in `out`
  std::vector<int> widened(g.size(), -1);
  auto convert = [&](int x, DType dt) {
    Node c;
    c.op = Op::convert;
    c.dtype = dt;
    c.axes = out.node(x).axes;
    c.inputs = {x};
    return out.add(std::move(c));
  };
  r.id.assign(g.size(), -1);
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    Node n = g.node(id);
    const bool tail = id >= keep_from;
    for (int& x : n.inputs) {
      // The tail reads an f32 leaf itself, not its rounded copy.
      const auto xi = static_cast<std::size_t>(x);
      const int y = tail && is_array_leaf(g.node(x)) ? r.id[xi] : value[xi];
      if (tail && out.node(y).dtype == to && g.node(x).dtype == DType::f32) {
        int& w = widened[xi];
        if (w < 0) w = convert(y, DType::f32);
        x = w;
      } else {
        x = y;
      }
    }
    const bool leaf = is_array_leaf(n) && n.dtype == DType::f32;
    if (!tail && !leaf && follows_model_dtype(n)) n.dtype = to;
    const int at = out.add(std::move(n));
    r.id[static_cast<std::size_t>(id)] = at;
    value[static_cast<std::size_t>(id)] = leaf && !tail ? convert(at, to) : at;
  }
  for (const auto& o : g.outputs()) out.mark_output(value[static_cast<std::size_t>(o.node)], o.name);
  for (const auto& c : g.constraints()) out.require(c);
  return r;
}

}  // namespace qkv
