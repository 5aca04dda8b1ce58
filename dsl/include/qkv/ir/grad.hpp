// qkv/ir/grad.hpp — reverse mode over the Graph IR: append_gradients(g, loss, wrt) appends to g
// the nodes that compute d loss / d wrt[i] for a scalar `loss` (a node without axes), from the
// forward nodes already in g, and returns their ids. A gradient has its primal's axes (same
// names, same order) and dtype.
//
// It is a pass over the graph, not over LLVM IR: every rule is written with the IR's own ops
// (contract, pointwise, add, mul, permute, ...), so the backward graph runs wherever the forward
// does — the interpreter is its reference, and the CPU and GPU backends compile it like any
// graph. Recompute vs store is decided in one place, primal(): a rule reads the forward value of
// a node by its id (stored: the forward node itself); nothing is recomputed.
//
// Rules: kGradRules (qkv/ir/grad_rules.hpp) has one row per op of the op table (a static check keeps the two the
// same length), each saying whether the op has a gradient, has none by nature (integers,
// masks: nothing flows), or is not differentiated (yet) and why. An op without a rule is a
// GradError naming it, never a silent zero. Element-wise expressions (pointwise, score_mod,
// relu/gelu/silu) are differentiated symbolically, one rule per ModOp (d_expr below).
//
// Plain data, no templates: the DSL (qkv/dsl/grad.hpp), the runtime and tests include it.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <qkv/ir/attention_graph.hpp>
#include <qkv/ir/grad_builder.hpp>
#include <qkv/ir/grad_rules.hpp>
#include <qkv/ir/ops.hpp>

namespace qkv {

namespace grad_detail {

/// One reverse-mode sweep (append_gradients' body).
class Sweep : public Builder {
 public:
  Sweep(Graph& g, int loss, const std::vector<int>& wrt) : Builder(g), loss_(loss), wrt_(wrt) {}

  std::vector<int> run() {
    const std::size_t n = static_cast<std::size_t>(loss_) + 1;
    const Node l = node(loss_);
    if (!l.axes.empty())
      throw GradError("grad: the loss " + axes_str(l.axes) +
                      " is not a scalar; reduce it first (sum_all, mean_all, or sum over its axes)");
    if (!is_float(l.dtype)) throw GradError("grad: the loss is not a floating-point value");
    // Which nodes lie between a wrt and the loss: only they get adjoints.
    std::vector<bool> from_wrt(n, false), to_loss(n, false);
    for (int w : wrt_) {
      if (w < 0 || w >= static_cast<int>(g_.nodes().size())) internal_error("grad: no node %" + std::to_string(w));
      if (!is_float(node(w).dtype))
        throw GradError("grad: %" + std::to_string(w) + " (" + std::string(op_name(node(w).op)) +
                        ") is not a floating-point tensor; integers and masks have no gradient");
      if (static_cast<std::size_t>(w) < n) from_wrt[static_cast<std::size_t>(w)] = true;
    }
    for (std::size_t i = 0; i < n; ++i)
      for (int in : node(static_cast<int>(i)).inputs)
        if (from_wrt[static_cast<std::size_t>(in)] && is_float(node(static_cast<int>(i)).dtype)) from_wrt[i] = true;
    to_loss[n - 1] = true;
    for (std::size_t i = n; i-- > 0;)
      if (to_loss[i])
        for (int in : node(static_cast<int>(i)).inputs) to_loss[static_cast<std::size_t>(in)] = true;
    needed_.assign(n, false);
    for (std::size_t i = 0; i < n; ++i) needed_[i] = from_wrt[i] && to_loss[i];

    adj_.assign(n, -1);
    if (needed_[n - 1]) adj_[n - 1] = fill({}, 1.0, l.dtype);
    for (std::size_t i = n; i-- > 0;) {
      add_slice_gradients(static_cast<int>(i));  // every slice of node i comes after it
      if (adj_[i] >= 0 && needed_[i]) back(static_cast<int>(i), adj_[i]);
    }

    std::vector<int> out;
    for (int w : wrt_) {
      const auto k = static_cast<std::size_t>(w);
      out.push_back(k < n && adj_[k] >= 0 ? adj_[k] : fill(node(w).axes, 0.0, node(w).dtype));
    }
    return out;
  }

 private:
  /// Adds `contribution` (over node `id`'s axes, in its order) to id's adjoint.
  void acc(int id, int contribution) {
    const auto k = static_cast<std::size_t>(id);
    if (!needed_[k]) return;
    adj_[k] = adj_[k] < 0 ? contribution : binary(Op::add, adj_[k], contribution);
  }
  bool wants(int id) const { return needed_[static_cast<std::size_t>(id)]; }

  [[noreturn]] void fail(int id, const std::string& why) const {
    throw GradError("grad: %" + std::to_string(id) + " (" + std::string(op_name(node(id).op)) +
                    (node(id).name.empty() ? "" : " '" + node(id).name + "'") + "): " + why);
  }

  void back(int id, int dy) {
    const Node n = node(id);  // a copy: the rules append nodes
    const GradRuleInfo& rule = kGradRules[static_cast<std::size_t>(n.op)];
    if (std::none_of(n.inputs.begin(), n.inputs.end(), [&](int i) { return wants(i); })) return;
    if (rule.rule == GradRule::missing) fail(id, "no gradient: " + std::string(rule.why));
    const auto in = [&](std::size_t k) { return n.inputs[k]; };
    switch (n.op) {
      case Op::input:
      case Op::param:
      case Op::fill:
      case Op::argmax:
        return;
      case Op::add:
      case Op::bias:
        acc(in(0), dy);
        if (n.inputs.size() > 1 && wants(in(1))) acc(in(1), sum_to(dy, node(in(1))));
        return;
      case Op::mul:
        if (wants(in(0))) acc(in(0), binary(Op::mul, dy, primal(in(1))));
        if (wants(in(1))) acc(in(1), sum_to(binary(Op::mul, dy, primal(in(0))), node(in(1))));
        return;
      case Op::scale: {
        Node s = n;
        s.inputs = {dy};
        s.name.clear();
        acc(in(0), add_node(std::move(s)));
        return;
      }
      case Op::convert: {
        Node c = n;
        c.inputs = {dy};
        c.name.clear();
        c.dtype = node(in(0)).dtype;
        acc(in(0), add_node(std::move(c)));
        return;
      }
      case Op::dropout: {  // the same mask (counter-based: seed and coordinates), the same scale
        Node d = n;
        d.inputs = {dy};
        d.name.clear();
        acc(in(0), add_node(std::move(d)));
        return;
      }
      case Op::permute:
        acc(in(0), permute_to(dy, node(in(0)).axes));
        return;
      case Op::split:
      case Op::merge:
      case Op::rename:
      case Op::view:
        acc(in(0), reshape_back(n, dy, node(in(0))));
        return;
      case Op::broadcast:
        acc(in(0), sum_to(dy, node(in(0))));
        return;
      case Op::keep_mask:
        acc(in(0), masked_where(dy, in(1)));
        return;
      case Op::causal:
        acc(in(0), causal_where(n, dy));
        return;
      case Op::softmax:
        acc(in(0), softmax_back(n, id, dy));
        return;
      case Op::logsumexp:
        acc(in(0), logsumexp_back(n, id, dy));
        return;
      case Op::relu:
        acc(in(0), elementwise(dy, primal(in(0)), [](ModExpr& e, int x) {
              return e.add(mod_node(ModOp::where, e.add(mod_node(ModOp::gt, x, e.add(mod_constant(0.0)))),
                                    e.add(mod_constant(1.0)), e.add(mod_constant(0.0))));
            }));
        return;
      case Op::silu:  // σ(x)·(1 + x·(1 − σ(x)))
        acc(in(0), elementwise(dy, primal(in(0)), [](ModExpr& e, int x) {
              const int s = e.add(mod_node(ModOp::sigmoid, x));
              const int one = e.add(mod_constant(1.0));
              return e.add(
                  mod_node(ModOp::mul, s,
                           e.add(mod_node(ModOp::add, one,
                                          e.add(mod_node(ModOp::mul, x, e.add(mod_node(ModOp::sub, one, s))))))));
            }));
        return;
      case Op::gelu:  // Φ(x) + x·φ(x)
        acc(in(0), elementwise(dy, primal(in(0)), [](ModExpr& e, int x) {
              const double inv_sqrt2 = 1.0 / std::sqrt(2.0), inv_sqrt2pi = 1.0 / std::sqrt(2.0 * std::acos(-1.0));
              const int cdf = e.add(mod_node(
                  ModOp::mul, e.add(mod_constant(0.5)),
                  e.add(mod_node(
                      ModOp::add, e.add(mod_constant(1.0)),
                      e.add(mod_node(ModOp::erf, e.add(mod_node(ModOp::mul, x, e.add(mod_constant(inv_sqrt2))))))))));
              const int pdf =
                  e.add(mod_node(ModOp::mul, e.add(mod_constant(inv_sqrt2pi)),
                                 e.add(mod_node(ModOp::exp, e.add(mod_node(ModOp::mul, e.add(mod_constant(-0.5)),
                                                                           e.add(mod_node(ModOp::mul, x, x))))))));
              return e.add(mod_node(ModOp::add, cdf, e.add(mod_node(ModOp::mul, x, pdf))));
            }));
        return;
      case Op::pointwise:
      case Op::score_mod:
        expression_back(id, n, dy);
        return;
      case Op::contract:
        contract_back(n, dy);
        return;
      case Op::linear:
        linear_back(n, dy);
        return;
      case Op::concat:
        concat_back(n, dy);
        return;
      case Op::slice:
        slice_back(id, n, dy);
        return;
      case Op::layer_norm:
        norm_back(n, dy, /*rms=*/false);
        return;
      case Op::rms_norm:
        norm_back(n, dy, /*rms=*/true);
        return;
      case Op::rope:
        rope_back(n, dy);
        return;
      case Op::embedding:
        embedding_back(n, dy);
        return;
      case Op::fused_attention:
        attention_back(id, n, dy);
        return;
      case Op::fused_attention_backward:
      case Op::attention_dk:
      case Op::attention_dv:
      case Op::attention_dtensor:
      case Op::embedding_grad:
      case Op::attention_weights:
      case Op::attention_lse:
      case Op::update_slice:
      case Op::dequantize:
        fail(id, "no gradient: " + std::string(rule.why));
    }
    fail(id, "no gradient rule");
  }

  /// fused_attention: FlashAttention-2's backward as one fused_attention_backward node (dQ) with
  /// its attention_dk / attention_dv companions, reading the forward's output and log-sum-exp
  /// (the forward node is asked to write it). A score modification is differentiated in the
  /// kernel, and a tensor it reads (a bias, ALiBi slopes, a relative-bias table) gets its
  /// gradient from an attention_dtensor companion; one read only by the keep predicate gets none
  /// (it is piecewise constant); dropout is replayed from its seed. What that node does not
  /// cover — values not all f32 or all bf16, static head widths past 256 (fused_backward_fits), a
  /// tensor read at coordinates computed from the score — is the gradient of the unfused
  /// attention (attention_graph.hpp), recomputed from q, k and v: never a wrong gradient.
  void attention_back(int id, const Node& n, int dy) {
    const AttentionAttrs& at = *n.attention;
    const int q = n.inputs[0], k = n.inputs[1], v = n.inputs[2];
    const std::vector<int> captured(n.inputs.begin() + 3, n.inputs.end());
    std::vector<std::size_t> tensor_grads;  // the captured tensors (index into `captured`) to differentiate
    bool fused = fused_backward_fits(g_, n) && node(dy).dtype == n.dtype;
    for (std::size_t i = 0; i < captured.size(); ++i) {
      const int input = 3 + static_cast<int>(i);
      if (!wants(captured[i]) || !score_part_reads(at.mod, input)) continue;
      tensor_grads.push_back(i);
      fused = fused && node(captured[i]).dtype == DType::f32 && fused_backward_differentiates(at.mod, input);
    }
    if (!fused) {
      const int first = static_cast<int>(g_.nodes().size());
      const UnfusedAttention u = append_unfused_attention(g_, at, q, k, v, captured, n.axes, n.dtype, false);
      // The recomputed nodes get adjoints like the forward's; their sweep runs from the output up.
      const std::size_t size = g_.nodes().size();
      needed_.resize(size, true);
      adj_.resize(size, -1);
      adj_[static_cast<std::size_t>(u.out)] = dy;
      for (int i = u.out; i >= first; --i)
        if (adj_[static_cast<std::size_t>(i)] >= 0) back(i, adj_[static_cast<std::size_t>(i)]);
      return;
    }
    // The log-sum-exp of the forward: its attention_lse node, or a new one.
    int lse = -1;
    for (std::size_t i = 0; i < g_.nodes().size() && lse < 0; ++i) {
      const Node& m = g_.node(static_cast<int>(i));
      if (m.op == Op::attention_lse && m.inputs.size() == 1 && m.inputs[0] == id) lse = static_cast<int>(i);
    }
    if (lse < 0) {
      g_.mutable_node(id).attention->write_lse = true;
      Node l;
      l.op = Op::attention_lse;
      l.inputs = {id};
      l.dtype = DType::f32;
      for (const auto& a : node(q).axes)
        if (a.name != at.dk) l.axes.push_back(a);
      lse = add_node(std::move(l));
    }
    Node bw;
    bw.op = Op::fused_attention_backward;
    bw.name = "attention_backward";
    bw.inputs = {q, k, v, primal(id), dy, lse};
    bw.inputs.insert(bw.inputs.end(), captured.begin(), captured.end());
    bw.axes = node(q).axes;
    bw.dtype = node(q).dtype;
    bw.attention = at;
    bw.attention->write_lse = false;
    bw.attention->write_weights = false;
    const int back_node = add_node(std::move(bw));
    auto companion = [&](Op op, int of) {
      Node c;
      c.op = op;
      c.inputs = {back_node};
      c.axes = node(of).axes;
      c.dtype = node(of).dtype;
      return add_node(std::move(c));
    };
    if (wants(q)) acc(q, back_node);
    if (wants(k)) acc(k, companion(Op::attention_dk, k));
    if (wants(v)) acc(v, companion(Op::attention_dv, v));
    for (std::size_t i : tensor_grads) {
      const int c = companion(Op::attention_dtensor, captured[i]);
      g_.mutable_node(c).offset = static_cast<std::int64_t>(i);
      acc(captured[i], c);
    }
  }

  /// split, merge, rename, view: the inverse view of dy onto x's axes.
  int reshape_back(const Node& n, int dy, const Node x) {
    Node r;
    r.inputs = {dy};
    r.axes = x.axes;
    r.dtype = x.dtype;
    switch (n.op) {
      case Op::split:  // attr_axes {from, parts...}: merges of two adjacent axes, back to `from`
        return merge_parts(dy, {n.attr_axes.begin() + 1, n.attr_axes.end()}, x);
      case Op::merge:  // {parts..., into} -> split {into, parts...}
        r.op = Op::split;
        r.attr_axes = {n.attr_axes.back()};
        r.attr_axes.insert(r.attr_axes.end(), n.attr_axes.begin(), n.attr_axes.end() - 1);
        break;
      case Op::rename:
        r.op = Op::rename;
        r.attr_axes = {n.attr_axes[1], n.attr_axes[0]};
        break;
      default:
        r.op = Op::view;
        break;
    }
    return add_node(std::move(r));
  }

  /// dy with the adjacent axes `parts` merged, two at a time, into x's axis `from` (x: the split's input).
  int merge_parts(int dy, const std::vector<std::string>& parts, const Node& x) {
    int cur = dy;
    std::string name = parts[0];
    for (std::size_t k = 1; k < parts.size(); ++k) {
      const bool last = k + 1 == parts.size();
      const std::vector<Axis> in = node(cur).axes;
      const Axis& a = axis_named(in, name);
      const Axis& b = axis_named(in, parts[k]);
      Axis merged{last ? names_of(x.axes)[0] : "__grad_merge" + std::to_string(k), a.extent};
      if (last) {
        for (const auto& xa : x.axes)
          if (!has(in, xa.name)) merged = xa;
      } else if (b.extent.is_static()) {
        merged.extent = a.extent.times(b.extent.value);
      } else if (a.extent.is_static()) {
        merged.extent = b.extent.times(a.extent.value);
      } else {
        throw GradError("grad: a split into several run-time sizes: not differentiated yet");
      }
      Node m;
      m.op = Op::merge;
      m.inputs = {cur};
      m.dtype = x.dtype;
      m.attr_axes = {name, parts[k], merged.name};
      for (const auto& ax : in) {
        if (ax.name == parts[k]) continue;
        m.axes.push_back(ax.name == name ? merged : ax);
      }
      cur = add_node(std::move(m));
      name = merged.name;
    }
    return cur;
  }

  /// dy where the keep-mask `mask` (broadcast by name) is true, else 0.
  int masked_where(int dy, int mask) {
    ModExpr e;
    const int s = e.add(mod_node(ModOp::score));
    const int m = mod_load_in_place(e, 1, node(mask).axes);
    e.score = e.add(mod_node(ModOp::where, m, s, e.add(mod_constant(0.0))));
    return pointwise({dy, mask}, std::move(e));
  }

  /// dy where the causal mask keeps the entry, else 0: key j ≤ query i (top-left), or
  /// j ≤ i + S − L (bottom-right), written with indices and lengths.
  int causal_where(const Node& n, int dy) {
    ModExpr e;
    const int s = e.add(mod_node(ModOp::score));
    auto leaf = [&](ModOp op, const std::string& axis) {
      ModNode l;
      l.op = op;
      l.axis = axis;
      return e.add(std::move(l));
    };
    int q = leaf(ModOp::index, n.attr_axes[0]);
    if (n.align == CausalAlign::bottom_right)
      q = e.add(mod_node(
          ModOp::add, q,
          e.add(mod_node(ModOp::sub, leaf(ModOp::length, n.attr_axes[1]), leaf(ModOp::length, n.attr_axes[0])))));
    const int keep = e.add(mod_node(ModOp::le, leaf(ModOp::index, n.attr_axes[1]), q));
    e.score = e.add(mod_node(ModOp::where, keep, s, e.add(mod_constant(0.0))));
    return pointwise({dy}, std::move(e));
  }

  /// y ⊙ (dy − Σ_axis dy ⊙ y)
  int softmax_back(const Node& n, int id, int dy) {
    const int y = primal(id);
    const int dot = sum_over(binary(Op::mul, dy, y), {n.attr_axes[0]});
    return binary(Op::mul, binary(Op::add, dy, scaled(dot, -1.0)), y);
  }

  /// dy (broadcast over the axis) ⊙ exp(x − lse); rows of only −inf get 0.
  int logsumexp_back(const Node& n, int id, int dy) {
    const int x = primal(n.inputs[0]), lse = primal(id);
    ModExpr e;
    const int s = e.add(mod_node(ModOp::score));
    const int l = mod_load_in_place(e, 1, node(lse).axes);
    const int g = mod_load_in_place(e, 2, node(dy).axes);
    const int inf_row = e.add(mod_node(ModOp::eq, l, e.add(mod_constant(-std::numeric_limits<double>::infinity()))));
    const int p = e.add(mod_node(ModOp::exp, e.add(mod_node(ModOp::sub, s, l))));
    e.score = e.add(mod_node(ModOp::where, inf_row, e.add(mod_constant(0.0)), e.add(mod_node(ModOp::mul, g, p))));
    return pointwise({x, lse, dy}, std::move(e));
  }

  /// pointwise / score_mod: the expression differentiated by each input that needs it.
  void expression_back(int id, const Node& n, int dy) {
    const ModExpr& f = *n.mod;
    const bool mask = n.op == Op::score_mod;
    // The backward expression reads dy as its entry, the forward's first input by a load at the
    // entry's coordinates, and the forward's loads one input further on.
    ModExpr base;
    base.query = f.query;
    base.key = f.key;
    base.align = f.align;
    const int dy_leaf = base.add(mod_node(ModOp::score));
    std::vector<int> map(f.nodes.size(), -1);
    std::vector<int> var_of(f.nodes.size(), -1);  // per forward node: which input a leaf reads
    for (std::size_t i = 0; i < f.nodes.size(); ++i) {
      ModNode m = f.nodes[i];
      if (m.op == ModOp::score) {
        map[i] = mod_load_in_place(base, 1, node(n.inputs[0]).axes);
        var_of[i] = 0;
        continue;
      }
      if (m.op == ModOp::load) {
        var_of[i] = m.input;
        for (int& a : m.at) a = map[static_cast<std::size_t>(a)];
        m.input += 1;
        map[i] = base.add(std::move(m));
        continue;
      }
      for (int* o : {&m.a, &m.b, &m.c})
        if (*o >= 0) *o = map[static_cast<std::size_t>(*o)];
      map[i] = base.add(std::move(m));
    }
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const int x = n.inputs[k];
      if (!wants(x)) continue;
      if (k > 0) check_loads_in_place(id, n, static_cast<int>(k));
      ModExpr e = base;
      std::vector<bool> is_var(e.nodes.size(), false);
      for (std::size_t i = 0; i < f.nodes.size(); ++i)
        if (var_of[i] == static_cast<int>(k)) is_var[static_cast<std::size_t>(map[i])] = true;
      DExpr d(e, is_var);
      const std::size_t count = e.nodes.size();
      // score' = f.score, or the score itself when the mod leaves it (−1).
      const int root = f.score >= 0 ? map[static_cast<std::size_t>(f.score)] : -1;
      int df = root >= 0 ? d.of(root, count) : (k == 0 ? d.constant(1.0) : -1);
      if (df < 0) continue;  // this input does not reach the output
      int g = e.add(mod_node(ModOp::mul, dy_leaf, df));
      if (mask && f.keep >= 0)
        g = e.add(mod_node(ModOp::where, map[static_cast<std::size_t>(f.keep)], g, e.add(mod_constant(0.0))));
      e.score = g;
      e.keep = -1;
      std::vector<int> inputs{dy};
      for (int i2 : n.inputs) inputs.push_back(primal(i2));
      const int contribution = pointwise(std::move(inputs), std::move(e), node(x).dtype);
      acc(x, k == 0 ? contribution : sum_to(contribution, node(x)));
    }
  }

  /// A captured input differentiates only where each load reads it at the entry's own
  /// coordinates (broadcast by name); a table read at computed positions needs a scatter.
  void check_loads_in_place(int id, const Node& n, int k) const {
    const ModExpr& f = *n.mod;
    const Node x = node(n.inputs[static_cast<std::size_t>(k)]);
    for (const auto& m : f.nodes) {
      if (m.op != ModOp::load || m.input != k) continue;
      bool in_place = m.at.size() == x.axes.size();
      for (std::size_t j = 0; in_place && j < m.at.size(); ++j) {
        const ModNode& at = f.nodes[static_cast<std::size_t>(m.at[j])];
        in_place = at.op == ModOp::index && at.axis == x.axes[j].name;
      }
      if (!in_place)
        fail(id, "input " + std::to_string(k) + " " + axes_str(x.axes) +
                     " is read at computed coordinates (a table lookup); its gradient needs a scatter, not written "
                     "yet");
    }
  }

  void contract_back(const Node& n, int dy) {
    for (std::size_t k = 0; k < 2; ++k) {
      const int x = n.inputs[k], other = n.inputs[1 - k];
      if (!wants(x)) continue;
      const Node xn = node(x);
      // d x = Σ over the axes of dy and the other operand that x lacks, of dy · other.
      std::vector<std::string> contracted;
      for (const auto& a : node(dy).axes)
        if (!has(xn.axes, a.name) && has(node(other).axes, a.name)) contracted.push_back(a.name);
      // Axes of the other operand x lacks and dy lacks too cannot exist (contract keeps or
      // contracts every axis), nor axes of x that neither dy nor other has.
      if (contracted.empty()) {  // an outer product: dy repeated over x's axes, times other
        Node b;
        b.op = Op::broadcast;
        b.inputs = {dy};
        b.axes = xn.axes;
        b.dtype = xn.dtype;
        acc(x, binary(Op::mul, add_node(std::move(b)), primal(other)));
        continue;
      }
      acc(x, contract_to(dy, primal(other), contracted, xn.axes, xn.dtype));
    }
  }

  /// linear(x, W [out, in], b): y = x·Wᵀ + b with x's axis In replaced by Out (W's axes are
  /// positional: whatever their names, [out, in]).
  void linear_back(const Node& n, int dy) {
    const std::string in_name = n.attr_axes[0], out_name = n.attr_axes[1];
    const int x = n.inputs[0], w = n.inputs[1];
    const Node xn = node(x), wn = node(w);
    // x's In axis under a name apart from dy's Out (Model -> Model shares one).
    const std::string in_as = in_name == out_name ? "__grad_in" : in_name;
    std::vector<Axis> x_as = xn.axes;
    for (auto& a : x_as)
      if (a.name == in_name) a.name = in_as;
    if (wants(x)) {  // dx = dy · W, summed over Out
      const int dx = contract_to(dy, rename_axes(primal(w), {out_name, in_as}), {out_name}, x_as, xn.dtype);
      acc(x, rename_axes(dx, names_of(xn.axes)));
    }
    if (wants(w)) {  // dW [out, in] = Σ over x's other axes of dy ⊗ x
      const int xr = rename_axes(primal(x), names_of(x_as));
      std::vector<std::string> batch;
      for (const auto& a : xn.axes)
        if (a.name != in_name) batch.push_back(a.name);
      const std::vector<Axis> target{axis_named(node(dy).axes, out_name), axis_named(x_as, in_as)};
      acc(w, rename_axes(contract_to(dy, xr, batch, target, wn.dtype), names_of(wn.axes)));
    }
    if (n.inputs.size() > 2 && wants(n.inputs[2])) {  // db = Σ over dy's other axes
      std::vector<std::string> batch;
      for (const auto& a : node(dy).axes)
        if (a.name != out_name) batch.push_back(a.name);
      acc(n.inputs[2], rename_axes(sum_over(dy, batch), names_of(node(n.inputs[2]).axes)));
    }
  }

  void concat_back(const Node& n, int dy) {
    const std::string axis = n.attr_axes[0];
    Extent start = Extent::fixed(0);
    for (int x : n.inputs) {
      const Node xn = node(x);
      const Extent len = axis_named(xn.axes, axis).extent;
      if (wants(x)) {
        Node s;
        s.op = Op::slice;
        s.inputs = {dy};
        s.axes = node(dy).axes;
        for (auto& a : s.axes)
          if (a.name == axis) a.extent = len;
        s.attr_axes = {axis, axis};
        s.dim = start;
        s.dtype = xn.dtype;
        acc(x, permute_to(add_node(std::move(s)), xn.axes));
      }
      try {
        start = start.plus_extent(len);
      } catch (const std::exception&) {
        throw GradError("grad: a concat of parts of unrelated run-time lengths: not differentiated yet");
      }
    }
  }

  void slice_back(int id, const Node& n, int dy) {
    const int x = n.inputs[0];
    const Node xn = node(x);
    const std::string axis = n.attr_axes[0];
    const Extent whole = axis_named(xn.axes, axis).extent, part = axis_named(n.axes, n.attr_axes[1]).extent;
    // The zeros before and after the part: static sizes, or — for a part `offset` of K equal
    // parts (chunk) — multiples of the part's run-time size.
    Extent before = Extent::fixed(0), after = Extent::fixed(0);
    if (part.is_static() && (!n.dim || n.dim->is_static())) {
      const std::int64_t start = n.dim ? n.dim->value : n.offset * part.value;
      before = Extent::fixed(start);
      after = whole;
      if (after.is_static())
        after.value -= start + part.value;
      else
        after.plus -= start + part.value;
    } else if (!n.dim) {
      // Part `offset` of K equal parts: K from the extents when one is a multiple of the other,
      // else (a weight [3·E, E] cut in three: its own size symbol) from the parts the graph cuts
      // the same axis into — the slices of x of this part's size (chunk and the fused in-projection
      // cut every part); the concat's size is checked against x's when the sizes are bound.
      std::int64_t parts = 0;
      for (std::int64_t k = 1; k <= 4096 && parts == 0; ++k)
        if (part.times(k) == whole) parts = k;
      if (parts == 0)
        for (const Node& other : g_.nodes())
          if (other.op == Op::slice && !other.dim && other.inputs[0] == x && other.attr_axes == n.attr_axes &&
              axis_named(other.axes, other.attr_axes[1]).extent == part)
            parts = std::max(parts, other.offset + 1);
      if (parts <= n.offset) fail(id, "a slice of a run-time length whose parts are unknown: not differentiated");
      before = part.times(n.offset);
      after = part.times(parts - n.offset - 1);
    } else if (part.is_static() && whole.is_dynamic() && n.dim->symbol == whole.symbol && n.dim->num == whole.num &&
               n.dim->den == whole.den) {
      // A start counted from the end (last<Seq>: Seq - 1): what follows the part is static.
      before = *n.dim;
      after = Extent::fixed(whole.plus - n.dim->plus - part.value);
    } else {
      fail(id, "a slice of a run-time length at a given start: not differentiated yet");
    }
    // dy renamed back onto x's axis; added to x's adjoint once every slice of x has given its
    // part (add_slice_gradients).
    int piece = dy;
    if (n.attr_axes[1] != axis)
      piece = rename_axes(dy, [&] {
        auto v = names_of(node(dy).axes);
        for (auto& s : v)
          if (s == n.attr_axes[1]) s = axis;
        return v;
      }());
    if (wants(x)) slice_parts_[x].push_back({axis, before, part, after, piece});
  }

  /// Adds the gradients of x's slices to x's adjoint: one concat when they tile one axis of x end
  /// to end (the q, k and v parts of a fused projection: their gradients side by side, no zeros
  /// written and then added), else each part between zeros.
  void add_slice_gradients(int x) {
    const auto it = slice_parts_.find(x);
    if (it == slice_parts_.end()) return;
    const std::vector<SlicePart> parts = std::move(it->second);
    slice_parts_.erase(it);
    const Node xn = node(x);
    const std::string& axis = parts[0].axis;
    const Extent whole = axis_named(xn.axes, axis).extent;
    // Pieces over `along` laid end to end on `on`, permuted to x's axes.
    auto concat = [&](const std::string& on, const std::vector<Axis>& along, const std::vector<int>& pieces) {
      Node c;
      c.op = Op::concat;
      c.inputs = pieces;
      c.axes = along;
      for (auto& a : c.axes)
        if (a.name == on) a.extent = axis_named(xn.axes, on).extent;
      c.attr_axes = {on, on};
      c.dtype = xn.dtype;
      return permute_to(add_node(std::move(c)), xn.axes);
    };
    if (const auto tiled = tiling(parts, whole)) {
      const std::vector<Axis> along = node(parts[(*tiled)[0]].piece).axes;
      std::vector<int> pieces;
      for (std::size_t k : *tiled) pieces.push_back(permute_to(parts[k].piece, along));
      acc(x, pieces.size() == 1 ? permute_to(pieces[0], xn.axes) : concat(axis, along, pieces));
      return;
    }
    for (const SlicePart& p : parts) {  // each between zeros
      const std::vector<Axis> along = node(p.piece).axes;
      auto zeros = [&](Extent len) {
        std::vector<Axis> axes = along;
        for (auto& a : axes)
          if (a.name == p.axis) a.extent = len;
        return fill(axes, 0.0, xn.dtype);
      };
      std::vector<int> pieces;
      if (!empty_extent(p.before)) pieces.push_back(zeros(p.before));
      pieces.push_back(p.piece);
      if (!empty_extent(p.after)) pieces.push_back(zeros(p.after));
      acc(x, pieces.size() == 1 ? permute_to(p.piece, xn.axes) : concat(p.axis, along, pieces));
    }
  }

  /// layer_norm (x, γ, β) and rms_norm (x, w) over attr_axes[0].
  void norm_back(const Node& n, int dy, bool rms) {
    const std::string axis = n.attr_axes[0];
    const int x = primal(n.inputs[0]), gamma = primal(n.inputs[1]);
    const double eps = n.scalar;
    // x / N (N: the axis's length in this call) and sums over the axis.
    auto over_n = [&](int v) {
      ModExpr e;
      ModNode len;
      len.op = ModOp::length;
      len.axis = axis;
      e.score = e.add(mod_node(ModOp::div, e.add(mod_node(ModOp::score)), e.add(std::move(len))));
      return pointwise({v}, std::move(e));
    };
    auto mean = [&](int v) { return sum_over(over_n(v), {axis}); };
    // xc = x − μ (layer norm) or x (rms); rstd = rsqrt(mean(xc²) + eps); xhat = xc · rstd
    const int xc = rms ? x : binary(Op::add, x, scaled(mean(x), -1.0));
    const int var = mean(binary(Op::mul, xc, xc));
    ModExpr r;
    r.score = r.add(
        mod_node(ModOp::rsqrt, r.add(mod_node(ModOp::add, r.add(mod_node(ModOp::score)), r.add(mod_constant(eps))))));
    const int rstd = pointwise({var}, std::move(r));
    const int xhat = binary(Op::mul, xc, rstd);
    if (wants(n.inputs[1])) acc(n.inputs[1], sum_to(binary(Op::mul, dy, xhat), node(n.inputs[1])));
    if (!rms && n.inputs.size() > 2 && wants(n.inputs[2])) acc(n.inputs[2], sum_to(dy, node(n.inputs[2])));
    if (!wants(n.inputs[0])) return;
    // g = dy·γ;  layer norm: dx = rstd·(g − mean(g) − xhat·mean(g·xhat));  rms: rstd·(g − xhat·mean(g·xhat))
    const int g = binary(Op::mul, dy, gamma);
    int t = binary(Op::add, g, scaled(binary(Op::mul, xhat, mean(binary(Op::mul, g, xhat))), -1.0));
    if (!rms) t = binary(Op::add, t, scaled(mean(g), -1.0));
    acc(n.inputs[0], binary(Op::mul, t, rstd));
  }

  /// rope(x, positions): a rotation per pair; its transpose is the rotation by −angle, i.e.
  /// rope at the negated positions.
  void rope_back(const Node& n, int dy) {
    const int pos = n.inputs[1];
    ModExpr e;
    e.score = e.add(mod_node(ModOp::neg, e.add(mod_node(ModOp::score))));
    const int neg = pointwise({pos}, std::move(e));
    Node r = n;
    r.inputs = {dy, neg};
    r.name.clear();
    acc(n.inputs[0], add_node(std::move(r)));
  }

  /// embedding(table [Rows, Features], ids): dtable[r] = Σ of dy's rows whose id is r — one
  /// embedding_grad node, O(ids · features) (a contraction with a one-hot of the ids would be
  /// O(ids · rows · features) and hold [ids..., rows]: 256 MB for 2 048 tokens of a 32 000 vocabulary).
  void embedding_back(const Node& n, int dy) {
    const int table = n.inputs[0], ids = n.inputs[1];
    if (!wants(table)) return;
    const Node tn = node(table);
    Node s;
    s.op = Op::embedding_grad;
    s.inputs = {dy, ids};
    s.axes = tn.axes;
    s.attr_axes = n.attr_axes;
    s.dtype = tn.dtype;
    acc(table, add_node(std::move(s)));
  }

  int loss_;
  std::vector<int> wrt_;
  std::vector<bool> needed_;
  std::vector<int> adj_;
  std::map<int, std::vector<SlicePart>> slice_parts_;  // slice_back's parts not yet added, by x
};

}  // namespace grad_detail

/// Appends to g the gradients of the scalar node `loss` with respect to the nodes `wrt` (float
/// tensors anywhere in the graph: inputs, parameters or intermediate values) and returns their
/// ids, in order. A node `loss` does not depend on gets a zero gradient. Throws GradError for a
/// loss with axes, a wrt that is not a float tensor, or an op on the way without a rule.
inline std::vector<int> append_gradients(Graph& g, int loss, const std::vector<int>& wrt) {
  if (loss < 0 || loss >= static_cast<int>(g.nodes().size())) internal_error("grad: no loss node");
  return grad_detail::Sweep(g, loss, wrt).run();
}

}  // namespace qkv
