#include <qkv/codegen/passes/fuse_attention.hpp>

#include "passes/rewrite.hpp"

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace qkv::codegen {

namespace {

using Names = std::vector<std::string>;

Names names_of(const std::vector<Axis>& axes) {
  Names out;
  for (const auto& a : axes) out.push_back(a.name);
  return out;
}
bool contains(const Names& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }

struct Uses {
  std::vector<std::vector<int>> consumers;
  std::vector<bool> is_output;
  explicit Uses(const Graph& g) : consumers(g.size()), is_output(g.size(), false) {
    for (int id = 0; id < static_cast<int>(g.size()); ++id)
      for (int in : g.node(id).inputs) consumers[static_cast<std::size_t>(in)].push_back(id);
    for (const auto& o : g.outputs()) is_output[static_cast<std::size_t>(o.node)] = true;
  }
  [[nodiscard]] bool only_feeds(int id, int next) const {
    const auto& c = consumers[static_cast<std::size_t>(id)];
    return !is_output[static_cast<std::size_t>(id)] && c.size() == 1 && c[0] == next;
  }
};

/// One recognised attention, in terms of node ids of the original graph.
struct Match {
  int scores = -1, softmax = -1, dropout = -1, output = -1;  // contract<Dk>, softmax, dropout, contract<Key>
  int lse = -1;  // logsumexp<Key> of the softmax's input (the kernel writes it as it goes)
  int q = -1, k = -1, v = -1;
  std::vector<int> chain;  // bias / keep_mask / causal / score_mod nodes, from the softmax upward
  bool weights = false;
  AttentionAttrs attrs;
  std::vector<int> captured;  // graph ids of the tensors the mod loads: the fused node's inputs 3...
};

/// The chain's modifications as one expression over the score axes (applied in graph order,
/// from the contraction down to the softmax), its loads reading the fused node's inputs 3...
/// (`captured`, graph node ids, is filled as tensors are met). Nullopt when the chain cannot be
/// one expression: a score_mod with a score part after a mask (the mask's −inf would reach the
/// mod, e.g. tanh(−inf) = −1), or two mods aligning the query position differently.
std::optional<ModExpr> chain_expr(const Graph& g, const Match& m, std::vector<int>& captured) {
  ModBuilder e;
  auto tensor_input = [&](int graph_id) {
    auto it = std::find(captured.begin(), captured.end(), graph_id);
    if (it == captured.end()) it = captured.insert(captured.end(), graph_id);
    return 3 + static_cast<int>(it - captured.begin());
  };
  auto load = [&](int graph_id) { return e.load_by_axes(tensor_input(graph_id), names_of(g.node(graph_id).axes)); };
  bool aligned = false;
  for (auto it = m.chain.rbegin(); it != m.chain.rend(); ++it) {
    const Node& n = g.node(*it);
    switch (n.op) {
      case Op::bias:  // after a mask too: −inf + b = −inf, so the order does not matter
        e.add_to_score(load(n.inputs[1]));
        break;
      case Op::keep_mask:
        e.keep_nonzero(load(n.inputs[1]));
        break;
      case Op::causal:
        e.keep_causal(n.attr_axes[0], n.attr_axes[1], n.align);
        break;
      case Op::score_mod: {
        const ModExpr& x = *n.mod;
        if (x.score >= 0 && e.masked()) return std::nullopt;
        if (!x.query.empty()) {
          ModExpr& r = e.expr();
          // Only a mod that reads query positions has an alignment that matters (a softcap
          // before an ALiBi aligned bottom-right is one expression).
          const bool positions = std::any_of(x.nodes.begin(), x.nodes.end(), [&](const ModNode& node) {
            return node.op == ModOp::position && node.axis == x.query;
          });
          if (positions) {
            if (aligned && (r.query != x.query || r.key != x.key || r.align != x.align)) return std::nullopt;
            aligned = true;
            r.align = x.align;
          }
          r.query = x.query;
          r.key = x.key;
        }
        e.splice(x, [&](int input) { return tensor_input(n.inputs[static_cast<std::size_t>(input)]); });
        break;
      }
      default:
        return std::nullopt;
    }
  }
  return e.finish();
}

std::optional<Match> match_at(const Graph& g, const Uses& uses, int softmax_id) {
  const Node& p = g.node(softmax_id);
  if (p.attr_axes.size() != 1) return std::nullopt;
  Match m;
  m.softmax = softmax_id;
  m.attrs.key = p.attr_axes[0];

  // Upward: masks, scales, causal and mods between the scores and the softmax. The kernel
  // computes mod(scale * q.k), so walking up from the softmax a score-changing node (bias, a
  // score_mod with a score part) may not come after (above) a scale.
  bool seen_scale = false;
  int id = p.inputs[0], next = softmax_id;
  // The softmax's input may also feed one logsumexp over the same key axis.
  for (int c : uses.consumers[static_cast<std::size_t>(id)]) {
    const Node& n = g.node(c);
    if (c == softmax_id || n.op != Op::logsumexp || n.attr_axes != Names{m.attrs.key} || m.lse >= 0) continue;
    m.lse = c;
  }
  for (;;) {
    const Node& n = g.node(id);
    const bool lse_too = next == softmax_id && m.lse >= 0;
    const auto& users = uses.consumers[static_cast<std::size_t>(id)];
    if (lse_too ? uses.is_output[static_cast<std::size_t>(id)] || users.size() != 2 : !uses.only_feeds(id, next))
      return std::nullopt;
    if (n.op == Op::contract) break;
    switch (n.op) {
      case Op::scale:
        seen_scale = true;
        if (n.dim) {
          if (m.attrs.scale_dim) return std::nullopt;
          m.attrs.scale_dim = n.dim;
        } else {
          m.attrs.scale *= n.scalar;
        }
        break;
      case Op::keep_mask:
      case Op::bias:
        if (n.op == Op::bias && seen_scale) return std::nullopt;  // (s + b) * c: not the kernel's form
        m.chain.push_back(id);
        break;
      case Op::score_mod:
        if (!n.mod || (n.mod->score >= 0 && seen_scale)) return std::nullopt;
        m.chain.push_back(id);
        break;
      case Op::causal:
        if (n.attr_axes.size() != 2 || n.attr_axes[1] != m.attrs.key) return std::nullopt;
        if (!m.attrs.query.empty() && m.attrs.query != n.attr_axes[0]) return std::nullopt;
        m.attrs.query = n.attr_axes[0];
        m.chain.push_back(id);
        break;
      default:
        return std::nullopt;
    }
    next = id;
    id = n.inputs[0];
  }
  const Node& c1 = g.node(id);
  if (c1.attr_axes.size() != 1) return std::nullopt;
  m.scores = id;
  m.q = c1.inputs[0];
  m.k = c1.inputs[1];
  m.attrs.dk = c1.attr_axes[0];

  // Downward: [dropout] then the contraction with V over the key axis.
  int last = softmax_id;
  const auto& after = uses.consumers[static_cast<std::size_t>(softmax_id)];
  if (after.size() == 1 && g.node(after[0]).op == Op::dropout) {
    if (uses.is_output[static_cast<std::size_t>(softmax_id)]) return std::nullopt;  // weights before dropout
    m.dropout = after[0];
    m.attrs.dropout = g.node(m.dropout).scalar;
    m.attrs.seed = g.node(m.dropout).seed;
    last = m.dropout;
  }
  const auto& users = uses.consumers[static_cast<std::size_t>(last)];
  if (users.size() != 1) return std::nullopt;
  const Node& c2 = g.node(users[0]);
  if (c2.op != Op::contract || c2.attr_axes != Names{m.attrs.key} || c2.inputs[0] != last) return std::nullopt;
  m.output = users[0];
  m.v = c2.inputs[1];
  m.weights = uses.is_output[static_cast<std::size_t>(last)];

  // Axis roles. q: batch ++ heads ++ group ++ [query, dk]; k: batch ++ heads ++ [key, dk];
  // v: batch ++ heads ++ [key, dv] (any order; the layout pass reorders).
  const Names qn = names_of(g.node(m.q).axes), kn = names_of(g.node(m.k).axes), vn = names_of(g.node(m.v).axes);
  Names q_only, shared;
  for (const auto& a : qn) {
    if (a == m.attrs.dk) continue;
    (contains(kn, a) ? shared : q_only).push_back(a);
  }
  if (!contains(kn, m.attrs.key) || contains(qn, m.attrs.key)) return std::nullopt;
  if (m.attrs.query.empty()) {
    if (q_only.empty()) return std::nullopt;
    m.attrs.query = q_only.back();  // contract puts the query axis last among q's own axes
  }
  for (const auto& a : q_only)
    if (a != m.attrs.query) m.attrs.group.push_back(a);
  if (!contains(q_only, m.attrs.query) || kn.size() != shared.size() + 2) return std::nullopt;
  Names v_rest;
  for (const auto& a : vn)
    if (a != m.attrs.key && !contains(shared, a)) v_rest.push_back(a);
  if (v_rest.size() != 1 || vn.size() != shared.size() + 2) return std::nullopt;
  if (v_rest[0] != m.attrs.dk && contains(qn, v_rest[0])) return std::nullopt;  // dv may share d_k's name
  m.attrs.dv = v_rest[0];
  if (!shared.empty()) {
    m.attrs.batch = {shared.front()};
    m.attrs.heads.assign(shared.begin() + 1, shared.end());
  }
  m.attrs.write_weights = m.weights;
  m.attrs.write_lse = m.lse >= 0;
  // The fused node stands at the first of (logsumexp, output) the rewrite meets: V must come first.
  // The weights node replaces the softmax (or dropout) node, which must not come after that.
  if (m.lse >= 0 && (m.v > m.lse || (m.weights && m.lse < (m.dropout >= 0 ? m.dropout : m.softmax))))
    return std::nullopt;
  // Every axis a mod or mask reads must be an axis of the scores.
  const Names score_axes = names_of(p.axes);
  for (int c : m.chain) {
    const Node& n = g.node(c);
    for (std::size_t i = 1; i < n.inputs.size() && n.op != Op::score_mod; ++i)
      for (const auto& a : g.node(n.inputs[i]).axes)
        if (!contains(score_axes, a.name)) return std::nullopt;
  }
  // Dropout entries are keyed by position in the weights [batch, heads..., query, key]: the
  // softmax must be laid out in the kernel's order for the masks to agree.
  if (m.dropout >= 0) {
    Names want = m.attrs.batch;
    want.insert(want.end(), m.attrs.heads.begin(), m.attrs.heads.end());
    want.insert(want.end(), m.attrs.group.begin(), m.attrs.group.end());
    want.push_back(m.attrs.query);
    want.push_back(m.attrs.key);
    if (names_of(p.axes) != want || m.attrs.batch.empty()) return std::nullopt;
  }
  return m;
}

/// Adds match m's fused_attention node to r.out (and its attention_weights node, which then
/// stands for the softmax); returns the fused node's id.
int add_fused(Rewrite& r, const Graph& g, const Match& m) {
  Node f;
  f.op = Op::fused_attention;
  f.name = "attention";
  f.inputs = {r[m.q], r[m.k], r[m.v]};
  for (int t : m.captured) f.inputs.push_back(r[t]);
  f.axes = g.node(m.output).axes;
  f.dtype = g.node(m.output).dtype;
  f.attention = m.attrs;
  const int fused = r.out.add(std::move(f));
  if (m.weights) {
    Node w;
    w.op = Op::attention_weights;
    w.inputs = {fused};
    w.axes = g.node(m.softmax).axes;
    w.dtype = g.node(m.softmax).dtype;
    r.set(m.dropout >= 0 ? m.dropout : m.softmax, r.out.add(std::move(w)));
  }
  return fused;
}

}  // namespace

Graph fuse_attention(const Graph& g) {
  const Uses uses(g);
  std::vector<Match> matches;
  for (int id = 0; id < static_cast<int>(g.size()); ++id)
    if (g.node(id).op == Op::softmax)
      if (auto m = match_at(g, uses, id)) {
        auto e = chain_expr(g, *m, m->captured);
        if (!e) continue;
        m->attrs.mod = std::move(*e);
        matches.push_back(*m);
      }
  if (matches.empty()) return g;

  // Each match's fused node, once made (at its logsumexp or its output, whichever comes first).
  std::vector<int> made(matches.size(), -1);
  return Rewrite(g).run([&](Rewrite& r, int id) {
    const auto hit =
        std::find_if(matches.begin(), matches.end(), [&](const Match& m) { return m.output == id || m.lse == id; });
    if (hit == matches.end()) return r.out.add(r.remapped(id));
    int& fused = made[static_cast<std::size_t>(hit - matches.begin())];
    if (fused < 0) fused = add_fused(r, g, *hit);
    if (id == hit->output) return fused;
    Node lse;
    lse.op = Op::attention_lse;
    lse.inputs = {fused};
    lse.axes = g.node(id).axes;
    lse.dtype = g.node(id).dtype;
    return r.out.add(std::move(lse));
  });
}

}  // namespace qkv::codegen
