#include <qkv/codegen/passes/canonicalize.hpp>

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
  Graph out;
  std::vector<int> map(g.size(), -1);
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    if (!live[static_cast<std::size_t>(id)]) continue;
    Node n = g.node(id);
    for (int& in : n.inputs) in = map[static_cast<std::size_t>(in)];
    map[static_cast<std::size_t>(id)] = out.add(std::move(n));
  }
  for (const auto& o : g.outputs()) out.mark_output(map[static_cast<std::size_t>(o.node)], o.name);
  for (const auto& c : g.constraints()) out.require(c);
  return out;
}

Graph canonicalize(const Graph& g) {
  Graph out;
  std::vector<int> map(g.size(), -1);
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    Node n = g.node(id);
    for (int& in : n.inputs) in = map[static_cast<std::size_t>(in)];
    if (n.op == Op::permute) {
      const Node& x = out.node(n.inputs[0]);
      if (x.op == Op::permute) n.inputs[0] = x.inputs[0];    // permute(permute(y)) = one reordering of y
      if (same_names(out.node(n.inputs[0]).axes, n.axes)) {  // keeps the order: not a permute at all
        map[static_cast<std::size_t>(id)] = n.inputs[0];
        continue;
      }
    }
    if (plain_scale(n) && plain_scale(out.node(n.inputs[0]))) {
      const Node& x = out.node(n.inputs[0]);
      n.scalar *= x.scalar;
      n.inputs[0] = x.inputs[0];
    }
    map[static_cast<std::size_t>(id)] = out.add(std::move(n));
  }
  for (const auto& o : g.outputs()) out.mark_output(map[static_cast<std::size_t>(o.node)], o.name);
  for (const auto& c : g.constraints()) out.require(c);
  return eliminate_dead_nodes(out);
}

}  // namespace qkv::codegen
