// qkv/ir/train.hpp — training in the Graph IR: the cross-entropy loss and one optimizer step
// (SGD with momentum, AdamW) appended to a graph, so that forward, backward and update are one
// graph that every backend runs (and that compiles ahead of time as one function).
//
//   append_cross_entropy(g, logits, targets, "Vocab", {.ignore_index = -100})   -> a scalar node
//   append_training_step(g, loss, AdamW{}, {.max_grad_norm = 1})                  -> the step's names
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

/// torch.optim.SGD (momentum, dampening 0, weight_decay, nesterov false); the learning rate is
/// the step's input "lr", so that a schedule changes it without recompiling.
struct Sgd {
  double momentum = 0.0, weight_decay = 0.0;
};
/// torch.optim.AdamW (amsgrad false): decoupled weight decay, bias-corrected moments; the
/// learning rate is the step's input "lr".
struct AdamW {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
};
/// What happens to the gradients before the update.
struct StepOptions {
  /// torch.nn.utils.clip_grad_norm_(params, max_grad_norm): when the global L2 norm of all the
  /// gradients exceeds it, every gradient is scaled by max_grad_norm / (norm + 1e-6). 0: off.
  double max_grad_norm = 0.0;
};

/// What append_training_step added, by name.
struct TrainingStep {
  std::vector<std::string> params;  // the parameters updated, in the graph's order
  /// Inputs: "lr" and "step" (scalars: the learning rate, and the step's number, 1 for the
  /// first), and per parameter p the state "<state>.p" for each state name (SGD with momentum:
  /// "momentum"; AdamW: "exp_avg", "exp_avg_sq"; zeros before the first step). Outputs: "loss",
  /// "grad_norm" (the gradients' global L2 norm before clipping), "p" (the updated parameter)
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
    leaves.push_back(mod_load_in_place(e, static_cast<int>(k), g.node(inputs[k]).axes));
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

/// What every optimizer starts from: the parameters, their gradients (clipped as `o` says), and
/// the scalar inputs "lr" and "step"; "loss" and "grad_norm" marked as outputs.
struct Prepared {
  std::vector<int> params, grads;
  int lr = -1, step = -1;
};
/// The norm, the clipping and the scalar inputs over gradients already in the graph.
inline Prepared prepare_gradients(Graph& g, std::vector<int> params, std::vector<int> grads, const StepOptions& o) {
  Prepared p;
  p.params = std::move(params);
  p.grads = std::move(grads);
  p.lr = scalar_input(g, "lr");
  p.step = scalar_input(g, "step");
  grad_detail::Builder b(g);
  // ‖g‖ = sqrt(Σ over every gradient of Σ g²)
  int squares = -1;
  for (int gr : p.grads) {
    std::vector<std::string> all;
    for (const auto& a : g.node(gr).axes) all.push_back(a.name);
    const int s = b.sum_over(b.binary(Op::mul, gr, gr), all);
    squares = squares < 0 ? s : b.binary(Op::add, squares, s);
  }
  if (squares < 0) return p;
  const int norm =
      elementwise(g, {squares}, [](ModExpr& e, const std::vector<int>& l) { return op(e, ModOp::sqrt, l[0]); });
  g.mark_output(norm, "grad_norm");
  if (o.max_grad_norm > 0.0) {
    // PyTorch: coef = max / (norm + 1e-6), clamped at 1.
    const int coef = elementwise(g, {norm}, [&](ModExpr& e, const std::vector<int>& l) {
      const int raw = op(e, ModOp::div, c(e, o.max_grad_norm), op(e, ModOp::add, l[0], c(e, 1e-6)));
      return e.add(mod_node(ModOp::where, op(e, ModOp::lt, raw, c(e, 1.0)), raw, c(e, 1.0)));
    });
    for (int& gr : p.grads) gr = b.binary(Op::mul, gr, coef);
  }
  return p;
}
inline Prepared prepare(Graph& g, int loss, const StepOptions& o) {
  std::vector<int> params = trainable(g, loss);
  std::vector<int> grads = append_gradients(g, loss, params);
  g.mark_output(loss, "loss");
  return prepare_gradients(g, std::move(params), std::move(grads), o);
}

/// The parameters `params` of `from` as parameters of `g`, and per parameter p an input
/// "grad.p" over p's axes: what an optimizer step on accumulated gradients starts from.
inline std::pair<std::vector<int>, std::vector<int>> parameters_and_gradient_inputs(Graph& g, const Graph& from,
                                                                                    const std::vector<int>& params) {
  std::vector<int> ps, gs;
  for (int id : params) {
    Node p = from.node(id);
    p.inputs.clear();
    const Node like = p;
    ps.push_back(g.add(std::move(p)));
    gs.push_back(input_like(g, like, "grad." + like.name));
  }
  return {ps, gs};
}
}  // namespace train_detail

/// Gradient accumulation, one micro-batch: per trainable parameter p of `loss`, an input
/// "grad.p" (the sum so far; zeros before the first micro-batch) and an output "grad.p" = that
/// sum + scale · ∂loss/∂p; the loss is the output "loss". With scale = 1 / micro-batches, the sum
/// after the last is the gradient of the mean loss over the micro-batches, for
/// append_training_step_on_gradients. Returns the parameters' ids.
inline std::vector<int> append_gradient_accumulation(Graph& g, int loss, double scale) {
  using namespace train_detail;
  const std::vector<int> params = trainable(g, loss);
  const std::vector<int> grads = append_gradients(g, loss, params);
  g.mark_output(loss, "loss");
  for (std::size_t k = 0; k < params.size(); ++k) {
    const Node p = g.node(params[k]);
    const int sum = input_like(g, p, "grad." + p.name);
    const int next = elementwise(g, {sum, grads[k]}, [&](ModExpr& e, const std::vector<int>& l) {
      return op(e, ModOp::add, l[0], op(e, ModOp::mul, c(e, scale), l[1]));
    });
    g.mark_output(next, "grad." + p.name);
  }
  return params;
}

/// Appends one SGD step: with momentum μ, buf' = μ·buf + g' (g' = g + wd·p; buf = g' on step
/// 1), p' = p − lr·buf'; without, p' = p − lr·g'.
namespace train_detail {
inline TrainingStep append_update(Graph& g, const Prepared& pr, const Sgd& o) {
  TrainingStep s;
  for (std::size_t k = 0; k < pr.params.size(); ++k) {
    const Node p = g.node(pr.params[k]);
    s.params.push_back(p.name);
    const double wd = o.weight_decay;
    const int gp = wd == 0.0 ? pr.grads[k]
                             : elementwise(g, {pr.grads[k], pr.params[k]}, [&](ModExpr& e, const std::vector<int>& l) {
                                 return op(e, ModOp::add, l[0], op(e, ModOp::mul, c(e, wd), l[1]));
                               });
    int direction = gp;
    if (o.momentum != 0.0) {
      const int buf = input_like(g, p, "momentum." + p.name);
      // step 1: buf' = g'; after: μ·buf + g'
      direction = elementwise(g, {gp, buf, pr.step}, [&](ModExpr& e, const std::vector<int>& l) {
        const int first = op(e, ModOp::le, l[2], c(e, 1.0));
        return e.add(
            mod_node(ModOp::where, first, l[0], op(e, ModOp::add, op(e, ModOp::mul, c(e, o.momentum), l[1]), l[0])));
      });
      g.mark_output(direction, "momentum." + p.name);
    }
    const int updated = elementwise(g, {pr.params[k], direction, pr.lr}, [&](ModExpr& e, const std::vector<int>& l) {
      return op(e, ModOp::sub, l[0], op(e, ModOp::mul, l[2], l[1]));
    });
    g.mark_output(updated, p.name);
  }
  if (o.momentum != 0.0) s.state = {"momentum"};
  return s;
}
}  // namespace train_detail

inline TrainingStep append_training_step(Graph& g, int loss, const Sgd& o, const StepOptions& so = {}) {
  return train_detail::append_update(g, train_detail::prepare(g, loss, so), o);
}

/// Appends one AdamW step (PyTorch's, step t ≥ 1 and lr inputs):
///   p ← p·(1 − lr·wd);  m' = β1·m + (1 − β1)·g;  v' = β2·v + (1 − β2)·g²;
///   p' = p − lr / (1 − β1^t) · m' / (sqrt(v') / sqrt(1 − β2^t) + eps)
namespace train_detail {
inline TrainingStep append_update(Graph& g, const Prepared& pr, const AdamW& o) {
  TrainingStep s;
  // The step's scalars, once (not per entry of every parameter: β^t is a pow): lr / (1 − β1^t)
  // and sqrt(1 − β2^t), each the same f32 (or double) a per-entry evaluation would compute.
  const int lr_bc1 = elementwise(g, {pr.lr, pr.step}, [&](ModExpr& e, const std::vector<int>& l) {
    return op(e, ModOp::div, l[0], op(e, ModOp::sub, c(e, 1.0), op(e, ModOp::pow, c(e, o.beta1), l[1])));
  });
  const int sqrt_bc2 = elementwise(g, {pr.step}, [&](ModExpr& e, const std::vector<int>& l) {
    return op(e, ModOp::sqrt, op(e, ModOp::sub, c(e, 1.0), op(e, ModOp::pow, c(e, o.beta2), l[0])));
  });
  for (std::size_t k = 0; k < pr.params.size(); ++k) {
    const Node p = g.node(pr.params[k]);
    s.params.push_back(p.name);
    const int gr = pr.grads[k];
    const int m = input_like(g, p, "exp_avg." + p.name), v = input_like(g, p, "exp_avg_sq." + p.name);
    const int m2 = elementwise(g, {gr, m}, [&](ModExpr& e, const std::vector<int>& l) {
      return op(e, ModOp::add, op(e, ModOp::mul, c(e, o.beta1), l[1]), op(e, ModOp::mul, c(e, 1 - o.beta1), l[0]));
    });
    const int v2 = elementwise(g, {gr, v}, [&](ModExpr& e, const std::vector<int>& l) {
      return op(e, ModOp::add, op(e, ModOp::mul, c(e, o.beta2), l[1]),
                op(e, ModOp::mul, c(e, 1 - o.beta2), op(e, ModOp::mul, l[0], l[0])));
    });
    const int updated =
        elementwise(g, {pr.params[k], m2, v2, lr_bc1, sqrt_bc2, pr.lr}, [&](ModExpr& e, const std::vector<int>& l) {
          const int lr = l[5];
          const int decayed =
              op(e, ModOp::mul, l[0], op(e, ModOp::sub, c(e, 1.0), op(e, ModOp::mul, lr, c(e, o.weight_decay))));
          const int denom = op(e, ModOp::add, op(e, ModOp::div, op(e, ModOp::sqrt, l[2]), l[4]), c(e, o.eps));
          return op(e, ModOp::sub, decayed, op(e, ModOp::mul, l[3], op(e, ModOp::div, l[1], denom)));
        });
    g.mark_output(updated, p.name);
    g.mark_output(m2, "exp_avg." + p.name);
    g.mark_output(v2, "exp_avg_sq." + p.name);
  }
  s.state = {"exp_avg", "exp_avg_sq"};
  return s;
}
}  // namespace train_detail

inline TrainingStep append_training_step(Graph& g, int loss, const AdamW& o, const StepOptions& so = {}) {
  return train_detail::append_update(g, train_detail::prepare(g, loss, so), o);
}

/// The optimizer step alone, on accumulated gradients: into `g` (empty), the parameters `params`
/// of `from` (append_gradient_accumulation's) and per parameter p the input "grad.p"; inputs,
/// outputs and state as append_training_step's, but no "loss".
template <class Optimizer>
TrainingStep append_training_step_on_gradients(Graph& g, const Graph& from, const std::vector<int>& params,
                                               const Optimizer& o, const StepOptions& so = {}) {
  auto [ps, gs] = train_detail::parameters_and_gradient_inputs(g, from, params);
  return train_detail::append_update(g, train_detail::prepare_gradients(g, std::move(ps), std::move(gs), so), o);
}

}  // namespace qkv
