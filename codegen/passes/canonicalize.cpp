#include <qkv/codegen/passes/canonicalize.hpp>

#include "passes/rewrite.hpp"

#include <vector>

namespace qkv::codegen {

namespace {

bool same_names(const std::vector<Axis>& a, const std::vector<Axis>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name) return false;
  return true;
}

bool plain_scale(const Node& n) { return n.op == Op::scale && !n.dim; }

/// outer(inner(x, a...), b...) as one pointwise node over (x, a..., b...): inner's expression
/// first, then outer's with its `score` leaf (inner's value) replaced by inner's root and its
/// loads renumbered past inner's inputs.
Node merge_pointwise(const Node& inner, Node outer) {
  const ModExpr& in = *inner.mod;
  const ModExpr& out = *outer.mod;
  ModExpr e = in;
  e.score = -1;
  const int shift = static_cast<int>(inner.inputs.size()) - 1;
  std::vector<int> id(out.nodes.size(), -1);
  auto map = [&](int x) { return x < 0 ? x : id[static_cast<std::size_t>(x)]; };
  for (std::size_t k = 0; k < out.nodes.size(); ++k) {
    ModNode m = out.nodes[k];
    if (m.op == ModOp::score) {
      id[k] = in.score;
      continue;
    }
    m.a = map(m.a);
    m.b = map(m.b);
    m.c = map(m.c);
    for (int& x : m.at) x = map(x);
    if (m.op == ModOp::load) m.input += shift;
    id[k] = e.add(std::move(m));
  }
  e.score = map(out.score);
  std::vector<int> inputs = inner.inputs;
  inputs.insert(inputs.end(), outer.inputs.begin() + 1, outer.inputs.end());
  outer.inputs = std::move(inputs);
  outer.mod = std::move(e);
  return outer;
}

}  // namespace

Graph eliminate_dead_nodes(const Graph& g) {
  std::vector<bool> live(g.size(), false);
  for (const auto& o : g.outputs()) live[static_cast<std::size_t>(o.node)] = true;
  for (int id = static_cast<int>(g.size()) - 1; id >= 0; --id) {
    const Node& n = g.node(id);
    if (n.op == Op::input || n.op == Op::param) live[static_cast<std::size_t>(id)] = true;
    if (!live[static_cast<std::size_t>(id)]) continue;
    for (int in : n.inputs) live[static_cast<std::size_t>(in)] = true;
  }
  return Rewrite(g).run(
      [&](Rewrite& r, int id) { return live[static_cast<std::size_t>(id)] ? r.out.add(r.remapped(id)) : -1; });
}

Graph canonicalize(const Graph& g) {
  // How many nodes and outputs read each node (a pointwise node read once is merged into its reader).
  std::vector<int> readers(g.size(), 0);
  for (int id = 0; id < static_cast<int>(g.size()); ++id)
    for (int in : g.node(id).inputs) ++readers[static_cast<std::size_t>(in)];
  for (const auto& o : g.outputs()) ++readers[static_cast<std::size_t>(o.node)];
  return eliminate_dead_nodes(Rewrite(g).run([&](Rewrite& r, int id) {
    Node n = r.remapped(id);
    Graph& out = r.out;
    if (n.op == Op::pointwise && out.node(n.inputs[0]).op == Op::pointwise &&
        readers[static_cast<std::size_t>(g.node(id).inputs[0])] == 1 && n.dtype == DType::f32 &&
        out.node(n.inputs[0]).dtype == DType::f32)  // a half node rounds its value: not merged
      n = merge_pointwise(out.node(n.inputs[0]), std::move(n));
    if (n.op == Op::permute) {
      const Node& x = out.node(n.inputs[0]);
      if (x.op == Op::permute) n.inputs[0] = x.inputs[0];  // permute(permute(y)) = one reordering of y
      if (same_names(out.node(n.inputs[0]).axes, n.axes)) return n.inputs[0];  // keeps the order: not a permute
    }
    if (plain_scale(n) && plain_scale(out.node(n.inputs[0]))) {
      const Node& x = out.node(n.inputs[0]);
      n.scalar *= x.scalar;
      n.inputs[0] = x.inputs[0];
    }
    return out.add(std::move(n));
  }));
}

}  // namespace qkv::codegen
