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
  return eliminate_dead_nodes(Rewrite(g).run([&](Rewrite& r, int id) {
    Node n = r.remapped(id);
    Graph& out = r.out;
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
