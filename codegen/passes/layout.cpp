#include <qkv/codegen/passes/layout.hpp>

#include "passes/rewrite.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace qkv::codegen {

namespace {

using Names = std::vector<std::string>;

std::vector<Axis> reorder(const std::vector<Axis>& axes, const Names& order) {
  std::vector<Axis> out;
  for (const auto& name : order)
    for (const auto& a : axes)
      if (a.name == name) out.push_back(a);
  return out;
}

bool same_order(const std::vector<Axis>& a, const std::vector<Axis>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name) return false;
  return true;
}

/// `id` in the order `order` (a new permute node unless it already is).
int in_order(Graph& out, int id, const Names& order) {
  const Node& n = out.node(id);
  std::vector<Axis> want = reorder(n.axes, order);
  if (same_order(n.axes, want)) return id;
  Node p;
  p.op = Op::permute;
  p.inputs = {id};
  p.axes = std::move(want);
  p.dtype = n.dtype;
  return out.add(std::move(p));
}

Names names_of(const std::vector<Axis>& axes) {
  Names v;
  for (const auto& x : axes) v.push_back(x.name);
  return v;
}

Names concat(std::initializer_list<const Names*> parts, std::initializer_list<std::string> tail) {
  Names out;
  for (const Names* p : parts) out.insert(out.end(), p->begin(), p->end());
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

/// How the fused kernels write their companions: the weights [batch, heads..., group..., query,
/// key], the log-sum-exp [batch, heads..., group..., query], dK [batch, heads..., key, dk] and
/// dV [batch, heads..., key, dv]; a captured tensor's gradient as that tensor is laid out
/// (`original`: its loads index it by its own axes).
Names companion_order(Op op, const AttentionAttrs& a, const std::vector<Axis>& original) {
  if (op == Op::attention_dtensor) return names_of(original);
  if (op == Op::attention_dk || op == Op::attention_dv)
    return concat({&a.batch, &a.heads}, {a.key, op == Op::attention_dk ? a.dk : a.dv});
  Names order = concat({&a.batch, &a.heads, &a.group}, {a.query});
  if (op == Op::attention_weights) order.push_back(a.key);
  return order;
}

}  // namespace

Graph layout(const Graph& g) {
  return Rewrite(g).run([&](Rewrite& r, int id) {
    Graph& out = r.out;
    Node n = r.remapped(id);
    if (n.op == Op::fused_attention || n.op == Op::fused_attention_backward) {
      // q, k, v (and the backward's out, d_out and lse) laid out as the kernels read them; the
      // inputs after them are the mod's tensors, which its loads index by their own axes.
      const AttentionAttrs& a = *n.attention;
      const bool backward = n.op == Op::fused_attention_backward;
      const Names rows = concat({&a.batch, &a.heads, &a.group}, {a.query});
      n.inputs[0] = in_order(out, n.inputs[0], concat({&rows}, {a.dk}));
      n.inputs[1] = in_order(out, n.inputs[1], concat({&a.batch, &a.heads}, {a.key, a.dk}));
      n.inputs[2] = in_order(out, n.inputs[2], concat({&a.batch, &a.heads}, {a.key, a.dv}));
      if (backward) {
        n.inputs[3] = in_order(out, n.inputs[3], concat({&rows}, {a.dv}));  // the forward's output
        n.inputs[4] = in_order(out, n.inputs[4], concat({&rows}, {a.dv}));  // d_out
        n.inputs[5] = in_order(out, n.inputs[5], rows);                     // the forward's lse
      }
      const std::vector<Axis> original = n.axes;  // out [rows, dv]; the backward's dQ [rows, dk]
      n.axes = reorder(original, concat({&rows}, {backward ? a.dk : a.dv}));
      const int fused = out.add(std::move(n));
      return in_order(out, fused, names_of(original));
    }
    if (n.op == Op::attention_weights || n.op == Op::attention_lse || n.op == Op::attention_dk ||
        n.op == Op::attention_dv || n.op == Op::attention_dtensor) {
      const AttentionAttrs& a = *g.node(g.node(id).inputs[0]).attention;
      const std::vector<Axis> original = n.axes;
      // Read the fused node itself (not the permute that follows it).
      int fused = n.inputs[0];
      while (out.node(fused).op == Op::permute) fused = out.node(fused).inputs[0];
      n.inputs[0] = fused;
      n.axes = reorder(original, companion_order(n.op, a, original));
      const int c = out.add(std::move(n));
      return in_order(out, c, names_of(original));
    }
    return out.add(std::move(n));
  });
}

}  // namespace qkv::codegen
