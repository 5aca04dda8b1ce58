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

}  // namespace qkv
