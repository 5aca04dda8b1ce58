// qkv/ir/attention_graph.hpp — a fused attention node written back as the unfused ops it stands
// for (contract → scale → score_mod → softmax → dropout → contract, and the logsumexp of the
// modified scores). One definition, used where a fused node must be computed or differentiated
// without its kernel: the reference interpreter runs fused_attention through it, and the
// gradient of a fused_attention its fused backward does not take (fused_backward_fits) is the
// gradient of this graph, recomputed from q, k and v. Also the mod's derivatives the fused
// backward evaluates (mod_with_derivatives).
//
// The scores are laid out [batch, heads..., group..., query, key] — the order the dropout's
// counters are keyed by (the fuse-attention pass only fuses a dropout in that order).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include <qkv/ir/grad_builder.hpp>

namespace qkv {

/// Whether the score part of `mod` loads its input `input` (a captured tensor with a gradient
/// through the score; one read only by the keep predicate has none: it is piecewise constant).
inline bool score_part_reads(const ModExpr& mod, int input) {
  const std::vector<bool> used = mod_reachable(mod, mod.score);
  for (std::size_t i = 0; i < mod.nodes.size(); ++i)
    if (used[i] && mod.nodes[i].op == ModOp::load && mod.nodes[i].input == input) return true;
  return false;
}

/// The fused backward's derivatives of a mod: `expr` is mod's nodes followed by d score' / d score
/// at `dscore` (the constant 1 without a score part) and, per load of a tensor in
/// `tensor_inputs` that the score part reads, d score' / d (that load) at `loads[i].d`. The
/// backward evaluates expr once per entry: dS = P ∘ (dP − D) ∘ f'(s), and a tensor's gradient is
/// Σ over entries and its loads of P ∘ (dP − D) ∘ d, at the coordinates that load reads (clamped
/// as it clamps them). Keep and score as in mod.
struct ModLoadDerivative {
  int load = -1;  // the load node (mod's numbering)
  int d = -1;     // d score' / d load
};
struct ModDerivative {
  ModExpr expr;
  int dscore = -1;
  std::vector<ModLoadDerivative> loads;
};
inline ModDerivative mod_with_derivatives(const ModExpr& mod, const std::vector<int>& tensor_inputs = {}) {
  ModDerivative out{mod, -1, {}};
  const std::size_t count = mod.nodes.size();
  // d score' / d (the nodes `is_var` marks)
  auto derivative = [&](auto is_var) {
    std::vector<bool> var(count, false);
    for (std::size_t i = 0; i < count; ++i) var[i] = is_var(i);
    grad_detail::DExpr d(out.expr, std::move(var));
    return d.or_zero(d.of(mod.score, count));
  };
  if (mod.score < 0) {
    out.dscore = out.expr.add(mod_constant(1.0));
    return out;
  }
  out.dscore = derivative([&](std::size_t i) { return mod.nodes[i].op == ModOp::score; });
  const std::vector<bool> used = mod_reachable(mod, mod.score);
  for (std::size_t i = 0; i < count; ++i) {
    const ModNode& n = mod.nodes[i];
    if (!used[i] || n.op != ModOp::load ||
        std::find(tensor_inputs.begin(), tensor_inputs.end(), n.input) == tensor_inputs.end())
      continue;
    out.loads.push_back({static_cast<int>(i), derivative([i](std::size_t j) { return j == i; })});
  }
  return out;
}

/// Whether the fused backward can give the tensor mod's input `input` its gradient: every load of
/// it reads coordinates that do not depend on the score.
inline bool fused_backward_differentiates(const ModExpr& mod, int input) {
  for (const auto& n : mod.nodes) {
    if (n.op != ModOp::load || n.input != input) continue;
    for (int at : n.at) {
      const std::vector<bool> used = mod_reachable(mod, at);
      for (std::size_t i = 0; i < mod.nodes.size(); ++i)
        if (used[i] && mod.nodes[i].op == ModOp::score) return false;
    }
  }
  return true;
}

/// Whether the fused backward kernels take fused_attention node n of g: q, k, v and the output
/// all f32 or all bf16, and head widths at most 256 where they are static —
/// what run_attention_backward and the compiled graphs' backward node accept (a run-time head
/// width past 256 is refused there, by name). Otherwise the gradient is the unfused one, which
/// every backend runs.
inline bool fused_backward_fits(const Graph& g, const Node& n) {
  const AttentionAttrs& at = *n.attention;
  if (n.dtype != DType::f32 && n.dtype != DType::bf16) return false;
  for (std::size_t k = 0; k < 3; ++k)
    if (g.node(n.inputs[k]).dtype != n.dtype) return false;
  for (const auto& [input, axis] : {std::pair<int, const std::string*>{0, &at.dk}, {2, &at.dv}})
    for (const auto& a : g.node(n.inputs[static_cast<std::size_t>(input)]).axes)
      if (a.name == *axis && a.extent.is_static() && (a.extent.value < 1 || a.extent.value > 256)) return false;
  return true;
}

/// The node ids of one unfused attention.
struct UnfusedAttention {
  int scores = -1;    // scale · q·k over the score axes
  int modified = -1;  // after the mod (keep ? score' : −inf); == scores when the mod is empty
  int probs = -1;     // softmax over the key axis
  int dropped = -1;   // after dropout; == probs without it
  int out = -1;       // the attention's output, laid out as `out_axes`
  int lse = -1;       // logsumexp of `modified` over the key axis (with_lse only)
};

/// The score axes of a fused attention: batch ++ heads ++ group ++ [query] (q's extents), key (k's).
inline std::vector<Axis> attention_score_axes(const AttentionAttrs& at, const std::vector<Axis>& q,
                                              const std::vector<Axis>& k) {
  std::vector<Axis> s;
  for (const auto* list : {&at.batch, &at.heads, &at.group})
    for (const auto& name : *list) s.push_back(grad_detail::axis_named(q, name));
  s.push_back(grad_detail::axis_named(q, at.query));
  s.push_back(grad_detail::axis_named(k, at.key));
  return s;
}

/// Appends to g the unfused form of a fused attention with attributes `at` over the nodes q, k,
/// v and `captured` (the fused node's inputs 3..., which the mod's loads read); the output is
/// laid out as `out_axes` with dtype `dt`.
inline UnfusedAttention append_unfused_attention(Graph& g, const AttentionAttrs& at, int q, int k, int v,
                                                 const std::vector<int>& captured, const std::vector<Axis>& out_axes,
                                                 DType dt, bool with_lse) {
  grad_detail::Builder b(g);
  UnfusedAttention u;
  const std::vector<Axis> score_axes = attention_score_axes(at, g.node(q).axes, g.node(k).axes);
  int s = b.contract_to(q, k, {at.dk}, score_axes, dt);
  if (at.scale_dim) {
    Node n;
    n.op = Op::scale;
    n.inputs = {s};
    n.axes = score_axes;
    n.dtype = dt;
    n.dim = at.scale_dim;
    s = b.add_node(std::move(n));
  } else if (at.scale != 1.0) {
    s = b.scaled(s, at.scale);
  }
  u.scores = s;
  u.modified = s;
  if (at.mod.score >= 0 || at.mod.keep >= 0) {
    Node m;
    m.op = Op::score_mod;
    m.inputs = {s};
    m.inputs.insert(m.inputs.end(), captured.begin(), captured.end());
    m.axes = score_axes;
    m.dtype = dt;
    ModExpr e = at.mod;
    for (auto& x : e.nodes)
      if (x.op == ModOp::load) x.input -= 2;  // fused input 3 + i is the score_mod's input 1 + i
    m.mod = std::move(e);
    u.modified = b.add_node(std::move(m));
  }
  Node p;
  p.op = Op::softmax;
  p.inputs = {u.modified};
  p.axes = score_axes;
  p.dtype = dt;
  p.attr_axes = {at.key};
  u.probs = b.add_node(std::move(p));
  u.dropped = u.probs;
  if (at.dropout > 0) {
    Node d;
    d.op = Op::dropout;
    d.inputs = {u.probs};
    d.axes = score_axes;
    d.dtype = dt;
    d.scalar = at.dropout;
    d.seed = at.seed;
    u.dropped = b.add_node(std::move(d));
  }
  u.out = b.contract_to(u.dropped, v, {at.key}, out_axes, dt);
  if (with_lse) {
    Node l;
    l.op = Op::logsumexp;
    l.inputs = {u.modified};
    l.attr_axes = {at.key};
    l.dtype = DType::f32;
    for (const auto& a : score_axes)
      if (a.name != at.key) l.axes.push_back(a);
    u.lse = b.add_node(std::move(l));
  }
  return u;
}

}  // namespace qkv
