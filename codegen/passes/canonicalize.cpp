#include <qkv/codegen/passes/canonicalize.hpp>

#include "passes/rewrite.hpp"

#include <algorithm>
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

/// Appends the nodes of `from` to `into`, operands renumbered; the id that stands for each
/// (returned by index). `instead(node)` may give the id that stands for a node in its place (≥ 0)
/// or −1 to copy it; a copied load reads input `input(its input)`.
template <class Instead, class Input>
std::vector<int> splice(ModExpr& into, const ModExpr& from, Instead&& instead, Input&& input) {
  std::vector<int> id(from.nodes.size(), -1);
  auto map = [&](int x) { return x < 0 ? x : id[static_cast<std::size_t>(x)]; };
  for (std::size_t k = 0; k < from.nodes.size(); ++k) {
    if ((id[k] = instead(from.nodes[k])) >= 0) continue;
    ModNode m = from.nodes[k];
    m.a = map(m.a);
    m.b = map(m.b);
    m.c = map(m.c);
    for (int& x : m.at) x = map(x);
    if (m.op == ModOp::load) m.input = input(m.input);
    id[k] = into.add(std::move(m));
  }
  return id;
}

/// Whether e reads a `position` leaf (whose meaning depends on e's query, key and alignment).
bool reads_positions(const ModExpr& e) {
  return std::any_of(e.nodes.begin(), e.nodes.end(), [](const ModNode& m) { return m.op == ModOp::position; });
}
/// Whether a and b can be one expression: their positions mean the same (or one reads none).
bool same_positions(const ModExpr& a, const ModExpr& b) {
  return !reads_positions(a) || !reads_positions(b) || (a.query == b.query && a.key == b.key && a.align == b.align);
}
/// The merged expression's position attributes: those of whichever of a and b reads positions.
void take_positions(ModExpr& into, const ModExpr& a, const ModExpr& b) {
  const ModExpr& from = reads_positions(a) ? a : b;
  into.query = from.query;
  into.key = from.key;
  into.align = from.align;
}

/// The id of `root` in `from` after splice gave `ids` (−1 stays −1).
int spliced(const std::vector<int>& ids, int root) { return root < 0 ? root : ids[static_cast<std::size_t>(root)]; }

/// outer(inner(x, a...), b...) as one pointwise node over (x, a..., b...): inner's expression
/// first, then outer's with its `score` leaf (inner's value) replaced by inner's root and its
/// loads renumbered past inner's inputs.
Node merge_pointwise(const Node& inner, Node outer) {
  const ModExpr& out = *outer.mod;
  ModExpr e = *inner.mod;
  const int value = e.score, shift = static_cast<int>(inner.inputs.size()) - 1;
  const auto ids = splice(
      e, out, [&](const ModNode& m) { return m.op == ModOp::score ? value : -1; },
      [&](int input) { return input + shift; });
  e.score = spliced(ids, out.score);
  take_positions(e, *inner.mod, out);
  std::vector<int> inputs = inner.inputs;
  inputs.insert(inputs.end(), outer.inputs.begin() + 1, outer.inputs.end());
  outer.inputs = std::move(inputs);
  outer.mod = std::move(e);
  return outer;
}

/// outer(x, ..., p(y, c...), ...) with p read in place (mod_loads_in_place) as input j: p's
/// expression inlined where outer loaded it; input j becomes y (p's `score` leaf, a load of it in
/// place) and p's other inputs are appended.
Node inline_loaded_pointwise(const Node& p, Node outer, int j) {
  const ModExpr& oe = *outer.mod;
  const int base = static_cast<int>(outer.inputs.size());
  ModExpr e;
  take_positions(e, oe, *p.mod);
  int inlined = -1;  // p's value, once inlined
  auto inline_p = [&] {
    auto y_in_place = [&](const ModNode& m) { return m.op == ModOp::score ? mod_load_in_place(e, j, outer.axes) : -1; };
    return spliced(splice(e, *p.mod, y_in_place, [&](int input) { return base + input - 1; }), p.mod->score);
  };
  const auto ids = splice(
      e, oe,
      [&](const ModNode& m) {
        if (m.op != ModOp::load || m.input != j) return -1;
        if (inlined < 0) inlined = inline_p();
        return inlined;
      },
      [](int input) { return input; });
  e.score = spliced(ids, oe.score);
  e.keep = spliced(ids, oe.keep);
  outer.inputs[static_cast<std::size_t>(j)] = p.inputs[0];
  outer.inputs.insert(outer.inputs.end(), p.inputs.begin() + 1, p.inputs.end());
  outer.mod = std::move(e);
  return outer;
}

/// permute(rename(… rename(contract(a, b)))), each read only by the next, where the permuted order
/// is contract(b, a)'s (the axes b keeps, then a's): the contraction with its operands swapped,
/// then the renames; returns what stands for the permute (−1: not of that form). A weight's
/// gradient, Σ over tokens of dY ⊗ X, then lands in the weight's own [in, out] layout instead of
/// being transposed into it.
int swapped_contract(const Graph& g, int permute, const std::vector<int>& readers, Rewrite& r) {
  std::vector<int> renames;  // from the permute's input down
  int at = g.node(permute).inputs[0];
  auto once = [&](int x) { return readers[static_cast<std::size_t>(x)] == 1; };
  while (g.node(at).op == Op::rename && once(at)) {
    renames.push_back(at);
    at = g.node(at).inputs[0];
  }
  if (g.node(at).op != Op::contract || !once(at)) return -1;
  Node c = r.remapped(at);
  // contract(b, a)'s order: b's axes that are not contracted, then a's that are neither.
  const Node &a = r.out.node(c.inputs[0]), &b = r.out.node(c.inputs[1]);
  auto contracted = [&](const std::string& name) {
    return std::find(c.attr_axes.begin(), c.attr_axes.end(), name) != c.attr_axes.end();
  };
  std::vector<std::string> order;
  for (const Axis& x : b.axes)
    if (!contracted(x.name)) order.push_back(x.name);
  for (const Axis& x : a.axes)
    if (!contracted(x.name) && std::find(order.begin(), order.end(), x.name) == order.end()) order.push_back(x.name);
  // The permuted order, in the contraction's names (each rename undone, the last one first).
  const auto& want = g.node(permute).axes;
  if (want.size() != order.size()) return -1;
  for (std::size_t k = 0; k < want.size(); ++k) {
    std::string name = want[k].name;
    for (int j : renames)
      if (name == g.node(j).attr_axes[1]) name = g.node(j).attr_axes[0];
    if (name != order[k]) return -1;
  }
  std::vector<Axis> axes;
  for (const std::string& name : order)
    axes.push_back(*std::find_if(c.axes.begin(), c.axes.end(), [&](const Axis& x) { return x.name == name; }));
  c.axes = std::move(axes);
  std::swap(c.inputs[0], c.inputs[1]);
  int now = r.out.add(std::move(c));
  for (auto k = renames.rbegin(); k != renames.rend(); ++k) {
    Node n = r.remapped(*k);
    n.inputs[0] = now;
    n.axes = r.out.node(now).axes;
    for (Axis& x : n.axes)
      if (x.name == n.attr_axes[0]) x.name = n.attr_axes[1];
    now = r.out.add(std::move(n));
  }
  return now;
}

/// How many nodes and outputs read each node.
std::vector<int> reader_counts(const Graph& g) {
  std::vector<int> readers(g.size(), 0);
  for (int id = 0; id < static_cast<int>(g.size()); ++id)
    for (int in : g.node(id).inputs) ++readers[static_cast<std::size_t>(in)];
  for (const auto& o : g.outputs()) ++readers[static_cast<std::size_t>(o.node)];
  return readers;
}

/// The element-wise nodes fuse_elementwise writes as pointwise expressions, each computing what
/// its own kernel computes bit for bit: f32 pointwise nodes; f32 add and mul whose output has the
/// first operand's axes and whose second operand's axes are among them (read by name: broadcast);
/// a scale by a factor an f32 holds (the kernel's double product of two f32 values is exact, so
/// it rounds as the f32 product does).
bool fusable(const Graph& g, const Node& n) {
  if (n.dtype != DType::f32 ||
      std::any_of(n.inputs.begin(), n.inputs.end(), [&](int in) { return g.node(in).dtype != DType::f32; }))
    return false;
  switch (n.op) {
    case Op::pointwise:
      return true;
    case Op::scale:
      return !n.dim && static_cast<double>(static_cast<float>(n.scalar)) == n.scalar;
    case Op::add:
    case Op::mul: {
      const auto& x = g.node(n.inputs[0]).axes;
      return same_names(n.axes, x) &&
             std::all_of(g.node(n.inputs[1]).axes.begin(), g.node(n.inputs[1]).axes.end(), [&](const Axis& a) {
               return std::any_of(x.begin(), x.end(), [&](const Axis& b) { return b.name == a.name; });
             });
    }
    default:
      return false;
  }
}

/// A fusable node as a pointwise node: x + y, x · y (y loaded at the entry's coordinates along
/// its own axes) or x · c.
Node as_pointwise(const Graph& g, Node n) {
  if (n.op == Op::pointwise) return n;
  ModExpr e;
  const int x = e.add(mod_node(ModOp::score));
  const int y = n.op == Op::scale ? e.add(mod_constant(n.scalar)) : mod_load_in_place(e, 1, g.node(n.inputs[1]).axes);
  e.score = e.add(mod_node(n.op == Op::add ? ModOp::add : ModOp::mul, x, y));
  Node p;
  p.op = Op::pointwise;
  p.name = n.name;
  p.axes = std::move(n.axes);
  p.dtype = n.dtype;
  p.inputs = std::move(n.inputs);
  p.mod = std::move(e);
  return p;
}

/// Whether `reader` can take input j into its own expression: as its first input (the value it
/// modifies), or as an input of its own axes read at its own coordinates.
bool takes_in(const Graph& g, const Node& reader, std::size_t j) {
  if (j == 0) return true;
  if (!same_names(g.node(reader.inputs[j]).axes, reader.axes)) return false;
  return reader.op != Op::pointwise || mod_loads_in_place(*reader.mod, static_cast<int>(j), reader.axes);
}

}  // namespace

Graph fuse_elementwise(const Graph& g) {
  const std::vector<int> readers = reader_counts(g);
  // The nodes that take part: a fusable node read once, by a fusable node that can take it in.
  std::vector<bool> part(g.size(), false);
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    const Node& n = g.node(id);
    if (!fusable(g, n)) continue;
    for (std::size_t j = 0; j < n.inputs.size(); ++j) {
      const int in = n.inputs[j];
      if (readers[static_cast<std::size_t>(in)] == 1 && fusable(g, g.node(in)) && takes_in(g, n, j))
        part[static_cast<std::size_t>(in)] = part[static_cast<std::size_t>(id)] = true;
    }
  }
  return eliminate_dead_nodes(Rewrite(g).run([&](Rewrite& r, int id) {
    if (!part[static_cast<std::size_t>(id)]) return r.out.add(r.remapped(id));
    Graph& out = r.out;
    Node n = as_pointwise(out, r.remapped(id));
    const std::vector<int>& was = g.node(id).inputs;
    auto joins = [&](std::size_t j) {
      const Node& p = out.node(n.inputs[j]);
      return part[static_cast<std::size_t>(was[j])] && readers[static_cast<std::size_t>(was[j])] == 1 &&
             p.op == Op::pointwise && same_positions(*p.mod, *n.mod);
    };
    for (std::size_t j = 1; j < was.size(); ++j)
      if (joins(j) && takes_in(out, n, j)) {
        const Node& p = out.node(n.inputs[j]);  // before n is moved from: argument order is unspecified
        n = inline_loaded_pointwise(p, std::move(n), static_cast<int>(j));
      }
    if (joins(0)) {
      const Node& inner = out.node(n.inputs[0]);
      n = merge_pointwise(inner, std::move(n));
    }
    return out.add(std::move(n));
  }));
}

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
  // A pointwise node read once is merged into its reader.
  const std::vector<int> readers = reader_counts(g);
  return eliminate_dead_nodes(Rewrite(g).run([&](Rewrite& r, int id) {
    Node n = r.remapped(id);
    Graph& out = r.out;
    // An f32 pointwise input read nowhere else and loaded at the entry's own coordinates: inlined.
    if (n.op == Op::pointwise && n.dtype == DType::f32) {
      const std::size_t count = n.inputs.size();
      for (std::size_t j = 1; j < count; ++j) {
        const Node& p = out.node(n.inputs[j]);
        if (p.op == Op::pointwise && p.dtype == DType::f32 &&
            readers[static_cast<std::size_t>(g.node(id).inputs[j])] == 1 && same_names(p.axes, n.axes) &&
            mod_loads_in_place(*n.mod, static_cast<int>(j), n.axes) && same_positions(*p.mod, *n.mod))
          n = inline_loaded_pointwise(p, std::move(n), static_cast<int>(j));
      }
    }
    if (n.op == Op::pointwise && out.node(n.inputs[0]).op == Op::pointwise &&
        readers[static_cast<std::size_t>(g.node(id).inputs[0])] == 1 && n.dtype == DType::f32 &&
        out.node(n.inputs[0]).dtype == DType::f32 &&  // a half node rounds its value: not merged
        same_positions(*out.node(n.inputs[0]).mod, *n.mod)) {
      const Node& inner = out.node(n.inputs[0]);  // before n is moved from: argument order is unspecified
      n = merge_pointwise(inner, std::move(n));
    }
    if (n.op == Op::permute) {
      if (const int c = swapped_contract(g, id, readers, r); c >= 0) return c;
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
