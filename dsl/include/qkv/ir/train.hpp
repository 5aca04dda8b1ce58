// qkv/ir/train.hpp — training in the Graph IR: the cross-entropy loss and one optimizer step
// (SGD with momentum, AdamW) appended to a graph, so that forward, backward and update are one
// graph that every backend runs (and that compiles ahead of time as one function).
//
//   append_cross_entropy(g, logits, targets, "Vocab", {.ignore_index = -100})   -> a scalar node
//   append_training_step(g, loss, AdamW{.lr = 1e-3})                             -> the step's names
//
// The semantics are PyTorch's (torch.nn.functional.cross_entropy with reduction='mean',
// torch.optim.SGD / torch.optim.AdamW, one tensor at a time), written out below.
//
// Plain data, no templates: the DSL (qkv/dsl/train.hpp), the CLI and tests include it.
#pragma once

#include <string>
#include <vector>

#include <qkv/ir/grad.hpp>
#include <qkv/ir/grad_builder.hpp>

namespace qkv {

struct CrossEntropyOptions {
  std::int64_t ignore_index = -100;  // targets equal to it count for nothing (and not in the mean)
  double label_smoothing = 0.0;      // ε: the target's weight is 1 − ε, every class's ε / classes
};

/// mean over the targets that are not ignore_index of
///   −(1 − ε)·log p[target] − ε · mean over classes of log p,   log p = logits − logsumexp(logits)
/// (torch.nn.functional.cross_entropy(logits, targets, ignore_index, label_smoothing), mean).
/// logits: a float node with the axis `classes`; targets: an integer node with the logits' other
/// axes. Every target ignored: NaN, as PyTorch (0 / 0).
inline int append_cross_entropy(Graph& g, int logits, int targets, const std::string& classes,
                                const CrossEntropyOptions& o = {}) {
  grad_detail::Builder b(g);
  const Node ln = g.node(logits), tn = g.node(targets);
  const DType dt = ln.dtype;
  // log p = logits − lse (lse broadcast by name over the classes).
  Node lse;
  lse.op = Op::logsumexp;
  lse.inputs = {logits};
  lse.attr_axes = {classes};
  lse.dtype = dt;
  for (const auto& a : ln.axes)
    if (a.name != classes) lse.axes.push_back(a);
  const int lse_id = g.add(std::move(lse));
  const int logp = b.binary(Op::add, logits, b.scaled(lse_id, -1.0));
  // Per class the weight of log p: (1 − ε)·[class = target] + ε / classes.
  int weight = b.one_hot(targets, grad_detail::axis_named(ln.axes, classes), 1.0 - o.label_smoothing, dt);
  if (o.label_smoothing != 0.0) {
    ModExpr smooth;
    ModNode len;
    len.op = ModOp::length;
    len.axis = classes;
    smooth.score = smooth.add(mod_node(
        ModOp::add, smooth.add(mod_node(ModOp::score)),
        smooth.add(mod_node(ModOp::div, smooth.add(mod_constant(o.label_smoothing)), smooth.add(std::move(len))))));
    weight = b.pointwise({weight}, std::move(smooth));
  }
  // −Σ_classes weight · log p, per token; the tokens that count.
  const int per_token = b.scaled(b.sum_over(b.binary(Op::mul, logp, weight), {classes}), -1.0);
  ModExpr valid;
  valid.score = valid.add(mod_node(ModOp::where,
                                   valid.add(mod_node(ModOp::ne, valid.add(mod_node(ModOp::score)),
                                                      valid.add(mod_constant(static_cast<double>(o.ignore_index))))),
                                   valid.add(mod_constant(1.0)), valid.add(mod_constant(0.0))));
  const int counts = b.pointwise({targets}, std::move(valid), dt);
  std::vector<std::string> all;
  for (const auto& a : tn.axes) all.push_back(a.name);
  const int total = b.sum_over(b.binary(Op::mul, per_token, counts), all);
  const int n = b.sum_over(counts, all);
  ModExpr mean;
  mean.score = mean.add(mod_node(ModOp::div, mean.add(mod_node(ModOp::score)), [&] {
    ModNode l;
    l.op = ModOp::load;
    l.input = 1;
    return mean.add(std::move(l));
  }()));
  return b.pointwise({total, n}, std::move(mean));
}

/// torch.optim.SGD (lr, momentum, dampening 0, weight_decay, nesterov false).
struct Sgd {
  double lr = 1e-3, momentum = 0.0, weight_decay = 0.0;
};
/// torch.optim.AdamW (amsgrad false): decoupled weight decay, bias-corrected moments.
struct AdamW {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
};

/// What append_training_step added: for every parameter `p` the inputs of its optimizer state
/// and the outputs of the step, by name.
struct TrainingStep {
  std::vector<std::string> params;  // the parameters updated, in the graph's order
  /// Inputs: "step" (a scalar: the step's number, 1 for the first), and per parameter p the
  /// state "<state>.p" for each state name (SGD with momentum: "momentum"; AdamW: "exp_avg",
  /// "exp_avg_sq"; zeros before the first step). Outputs: "loss", "p" (the updated parameter)
  /// and "<state>.p" (the updated state).
  std::vector<std::string> state;
};

namespace train_detail {
/// A node over `like`'s axes named `name`: an input of the graph.
inline int input_like(Graph& g, const Node& like, const std::string& name) {
  Node n;
  n.op = Op::input;
  n.name = name;
  n.axes = like.axes;
  n.dtype = like.dtype;
  return g.add(std::move(n));
}
inline int scalar_input(Graph& g, const std::string& name) {
  Node n;
  n.op = Op::input;
  n.name = name;
  return g.add(std::move(n));
}
/// A pointwise node over inputs (x = inputs[0]) whose expression `f(e, leaves)` builds from
/// leaves[k]: input k at the entry (x's axes; scalars at no coordinate).
template <class F>
int elementwise(Graph& g, const std::vector<int>& inputs, F&& f) {
  ModExpr e;
  std::vector<int> leaves{e.add(mod_node(ModOp::score))};
  for (std::size_t k = 1; k < inputs.size(); ++k)
    leaves.push_back(grad_detail::Builder::load(e, static_cast<int>(k), g.node(inputs[k]).axes));
  e.score = f(e, leaves);
  grad_detail::Builder b(g);
  return b.pointwise(inputs, std::move(e));
}
inline int c(ModExpr& e, double v) { return e.add(mod_constant(v)); }
inline int op(ModExpr& e, ModOp o, int a, int b_ = -1) { return e.add(mod_node(o, a, b_)); }

/// Every parameter of g that `loss` depends on (by name, in the graph's order).
inline std::vector<int> trainable(const Graph& g, int loss) {
  std::vector<bool> reach(static_cast<std::size_t>(loss) + 1, false);
  reach[static_cast<std::size_t>(loss)] = true;
  for (std::size_t i = static_cast<std::size_t>(loss) + 1; i-- > 0;)
    if (reach[i])
      for (int in : g.node(static_cast<int>(i)).inputs) reach[static_cast<std::size_t>(in)] = true;
  std::vector<int> out;
  for (std::size_t i = 0; i < reach.size(); ++i)
    if (reach[i] && g.node(static_cast<int>(i)).op == Op::param) out.push_back(static_cast<int>(i));
  return out;
}
}  // namespace train_detail

/// Appends one SGD step: with momentum μ, buf' = μ·buf + g' (g' = g + wd·p; buf = g' on step
/// 1), p' = p − lr·buf'; without, p' = p − lr·g'.
inline TrainingStep append_training_step(Graph& g, int loss, const Sgd& o) {
  using namespace train_detail;
  TrainingStep s;
  const std::vector<int> params = trainable(g, loss);
  const std::vector<int> grads = append_gradients(g, loss, params);
  const int step = o.momentum != 0.0 ? scalar_input(g, "step") : -1;
  g.mark_output(loss, "loss");
  for (std::size_t k = 0; k < params.size(); ++k) {
    const Node p = g.node(params[k]);
    s.params.push_back(p.name);
    const double wd = o.weight_decay;
    const int gp =
        wd == 0.0 ? grads[k] : elementwise(g, {grads[k], params[k]}, [&](ModExpr& e, const std::vector<int>& l) {
          return op(e, ModOp::add, l[0], op(e, ModOp::mul, c(e, wd), l[1]));
        });
    int direction = gp;
    if (o.momentum != 0.0) {
      const int buf = input_like(g, p, "momentum." + p.name);
      // step 1: buf' = g'; after: μ·buf + g'
      direction = elementwise(g, {gp, buf, step}, [&](ModExpr& e, const std::vector<int>& l) {
        const int first = op(e, ModOp::le, l[2], c(e, 1.0));
        return e.add(
            mod_node(ModOp::where, first, l[0], op(e, ModOp::add, op(e, ModOp::mul, c(e, o.momentum), l[1]), l[0])));
      });
      g.mark_output(direction, "momentum." + p.name);
    }
    const int updated = elementwise(g, {params[k], direction}, [&](ModExpr& e, const std::vector<int>& l) {
      return op(e, ModOp::sub, l[0], op(e, ModOp::mul, c(e, o.lr), l[1]));
    });
    g.mark_output(updated, p.name);
  }
  if (o.momentum != 0.0) s.state = {"momentum"};
  return s;
}

/// Appends one AdamW step (PyTorch's, step t ≥ 1 an input):
///   p ← p·(1 − lr·wd);  m' = β1·m + (1 − β1)·g;  v' = β2·v + (1 − β2)·g²;
///   p' = p − lr / (1 − β1^t) · m' / (sqrt(v') / sqrt(1 − β2^t) + eps)
inline TrainingStep append_training_step(Graph& g, int loss, const AdamW& o) {
  using namespace train_detail;
  TrainingStep s;
  const std::vector<int> params = trainable(g, loss);
  const std::vector<int> grads = append_gradients(g, loss, params);
  const int step = scalar_input(g, "step");
  g.mark_output(loss, "loss");
  for (std::size_t k = 0; k < params.size(); ++k) {
    const Node p = g.node(params[k]);
    s.params.push_back(p.name);
    const int m = input_like(g, p, "exp_avg." + p.name), v = input_like(g, p, "exp_avg_sq." + p.name);
    const int m2 = elementwise(g, {grads[k], m}, [&](ModExpr& e, const std::vector<int>& l) {
      return op(e, ModOp::add, op(e, ModOp::mul, c(e, o.beta1), l[1]), op(e, ModOp::mul, c(e, 1 - o.beta1), l[0]));
    });
    const int v2 = elementwise(g, {grads[k], v}, [&](ModExpr& e, const std::vector<int>& l) {
      return op(e, ModOp::add, op(e, ModOp::mul, c(e, o.beta2), l[1]),
                op(e, ModOp::mul, c(e, 1 - o.beta2), op(e, ModOp::mul, l[0], l[0])));
    });
    const int updated = elementwise(g, {params[k], m2, v2, step}, [&](ModExpr& e, const std::vector<int>& l) {
      const int t = l[3];
      const int decayed = op(e, ModOp::mul, l[0], c(e, 1 - o.lr * o.weight_decay));
      const int bc1 = op(e, ModOp::sub, c(e, 1.0), op(e, ModOp::pow, c(e, o.beta1), t));
      const int bc2 = op(e, ModOp::sub, c(e, 1.0), op(e, ModOp::pow, c(e, o.beta2), t));
      const int denom =
          op(e, ModOp::add, op(e, ModOp::div, op(e, ModOp::sqrt, l[2]), op(e, ModOp::sqrt, bc2)), c(e, o.eps));
      return op(e, ModOp::sub, decayed,
                op(e, ModOp::mul, op(e, ModOp::div, c(e, o.lr), bc1), op(e, ModOp::div, l[1], denom)));
    });
    g.mark_output(updated, p.name);
    g.mark_output(m2, "exp_avg." + p.name);
    g.mark_output(v2, "exp_avg_sq." + p.name);
  }
  s.state = {"exp_avg", "exp_avg_sq"};
  return s;
}

}  // namespace qkv
