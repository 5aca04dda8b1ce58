// qkv/ir/attention_graph.hpp — a fused attention node written back as the unfused ops it stands
// for (contract → scale → score_mod → softmax → dropout → contract, and the logsumexp of the
// modified scores). One definition, used where a fused node must be computed or differentiated
// without its kernel: the reference interpreter runs fused_attention through it, and the
// gradient of a fused_attention its fused backward does not cover (dropout, score mods) is the
// gradient of this graph, recomputed from q, k and v.
//
// The scores are laid out [batch, heads..., group..., query, key] — the order the dropout's
// counters are keyed by (the fuse-attention pass only fuses a dropout in that order).
#pragma once

#include <string>
#include <vector>

#include <qkv/ir/grad_builder.hpp>

namespace qkv {

/// Whether a fused_attention's gradient is its fused backward (fused_attention_backward): no
/// dropout, and a mod that only masks (no score part). Otherwise the gradient is that of the
/// unfused attention, recomputed.
inline bool fused_backward_covers(const AttentionAttrs& at) { return at.dropout == 0.0 && at.mod.score < 0; }

/// Whether the fused backward kernels take fused_attention node n of g (besides covering its
/// attributes): q, k, v and the output f32, and head widths at most 256 where they are static —
/// what run_attention_backward and the compiled graphs' backward node accept (a run-time head
/// width past 256 is refused there, by name). Otherwise the gradient is the unfused one, which
/// every backend runs.
inline bool fused_backward_fits(const Graph& g, const Node& n) {
  const AttentionAttrs& at = *n.attention;
  if (n.dtype != DType::f32) return false;
  for (std::size_t k = 0; k < 3; ++k)
    if (g.node(n.inputs[k]).dtype != DType::f32) return false;
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
