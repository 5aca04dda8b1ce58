#include <qkv/codegen/passes/verify.hpp>

#include <algorithm>
#include <functional>
#include <set>
#include <stdexcept>

#include <qkv/ir/quant.hpp>

namespace qkv::codegen {

namespace {

std::vector<std::string> names(const std::vector<Axis>& axes) {
  std::vector<std::string> out;
  for (const auto& a : axes) out.push_back(a.name);
  return out;
}

bool has(const std::vector<Axis>& axes, std::string_view name) {
  return std::any_of(axes.begin(), axes.end(), [&](const Axis& a) { return a.name == name; });
}

using Names = std::vector<std::string>;

Names cat(std::initializer_list<const Names*> parts, std::initializer_list<std::string> tail) {
  Names out;
  for (const Names* p : parts) out.insert(out.end(), p->begin(), p->end());
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

std::string list(const Names& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s + "]";
}

/// The laid-out grammar of a fused_attention node (verify.hpp).
void check_laid_out_attention(const Graph& g, const Node& n, const std::function<void(const std::string&)>& report) {
  const AttentionAttrs& a = *n.attention;
  const bool backward = n.op == Op::fused_attention_backward;
  auto expect = [&](const char* what, const std::vector<Axis>& axes, const Names& want) {
    if (names(axes) != want) report(std::string(what) + " is " + axes_str(axes) + ", not laid out as " + list(want));
  };
  const Names rows = cat({&a.batch, &a.heads, &a.group}, {a.query});
  expect("q", g.node(n.inputs[0]).axes, cat({&rows}, {a.dk}));
  expect("k", g.node(n.inputs[1]).axes, cat({&a.batch, &a.heads}, {a.key, a.dk}));
  expect("v", g.node(n.inputs[2]).axes, cat({&a.batch, &a.heads}, {a.key, a.dv}));
  if (backward) {
    expect("out", g.node(n.inputs[3]).axes, cat({&rows}, {a.dv}));
    expect("d_out", g.node(n.inputs[4]).axes, cat({&rows}, {a.dv}));
    expect("lse", g.node(n.inputs[5]).axes, rows);
    expect("dQ", n.axes, cat({&rows}, {a.dk}));
  } else {
    expect("the output", n.axes, cat({&rows}, {a.dv}));
  }
  // The mod loads tensor k as input 3 + k; the backward node holds it at 6 + k.
  const std::size_t shift = backward ? 3 : 0;
  for (const ModNode& x : a.mod.nodes) {
    if (x.op != ModOp::load) continue;
    const std::size_t at = static_cast<std::size_t>(x.input) + shift;
    if (x.input < 3 || at >= n.inputs.size()) {
      report("a mod loads tensor " + std::to_string(x.input) + ", which is not one of its tensors (3.." +
             std::to_string(static_cast<int>(n.inputs.size() - shift) - 1) + ")");
    } else if (g.node(n.inputs[at]).axes.size() != x.at.size()) {
      report("a mod loads tensor " + std::to_string(x.input) + " with " + std::to_string(x.at.size()) +
             " indices, but it has " + std::to_string(g.node(n.inputs[at]).axes.size()) + " axes");
    }
  }
}

}  // namespace

std::vector<std::string> verify(const Graph& g, Stage stage) {
  std::vector<std::string> problems;
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    const Node& n = g.node(id);
    auto report = [&](const std::string& what) {
      problems.push_back("%" + std::to_string(id) + " (" + std::string(op_name(n.op)) + "): " + what + "; axes " +
                         axes_str(n.axes));
    };
    const int lo = op_info(n.op).min_inputs, hi = op_info(n.op).max_inputs;
    const int count = static_cast<int>(n.inputs.size());
    if (count < lo || (hi >= 0 && count > hi)) report("has " + std::to_string(count) + " inputs");
    bool inputs_ok = true;
    for (int in : n.inputs)
      if (in < 0 || in >= id) {
        report("input %" + std::to_string(in) + " does not precede it");
        inputs_ok = false;
      }
    const auto nm = names(n.axes);
    if (std::set<std::string>(nm.begin(), nm.end()).size() != nm.size()) report("repeats an axis name");
    if (!inputs_ok || count < lo) continue;
    const Node* x = n.inputs.empty() ? nullptr : &g.node(n.inputs[0]);
    if (op_info(n.op).keeps_axes && names(x->axes) != nm) report("changes the axes of its input " + axes_str(x->axes));
    switch (n.op) {
      case Op::permute: {
        auto a = names(x->axes), b = nm;
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        if (a != b) report("is not a reordering of " + axes_str(x->axes));
        break;
      }
      case Op::contract: {
        const Node& r = g.node(n.inputs[1]);
        std::vector<std::string> want;
        for (const auto& a : x->axes)
          if (std::find(n.attr_axes.begin(), n.attr_axes.end(), a.name) == n.attr_axes.end()) want.push_back(a.name);
        for (const auto& a : r.axes)
          if (std::find(n.attr_axes.begin(), n.attr_axes.end(), a.name) == n.attr_axes.end() &&
              std::find(want.begin(), want.end(), a.name) == want.end())
            want.push_back(a.name);
        if (want != nm)
          report("output is not lhs \\ C ++ rhs \\ C \\ lhs of " + axes_str(x->axes) + " and " + axes_str(r.axes));
        for (const auto& c : n.attr_axes)
          if (!has(x->axes, c) || !has(r.axes, c)) report("contracts `" + c + "`, which an operand lacks");
        break;
      }
      default:
        break;
    }
    if (n.op == Op::rope && !n.rope) report("has no rope attributes");
    if (n.op == Op::dequantize && x) {
      const Node& s = g.node(n.inputs[1]);
      if (x->dtype != DType::i8) report("dequantizes " + std::string(dtype_name(x->dtype)) + ", not i8");
      if (n.offset < 1) report("has no group size");
      if (x->axes.empty() || s.axes.size() != x->axes.size()) report("has scales of another rank than its q");
      if (n.scalar != 0.0 && !dequantizes_q4(n)) report("reads " + std::to_string(n.scalar) + "-bit q");
      if (dequantizes_q4(n) && !x->axes.empty() && !n.axes.empty() && x->axes.back().extent.is_static() &&
          n.axes.back().extent.is_static() &&
          (n.offset % 2 != 0 || n.axes.back().extent.value % n.offset != 0 ||
           x->axes.back().extent.value * 2 != n.axes.back().extent.value))
        report("reads a q4 q of " + std::to_string(x->axes.back().extent.value) + " bytes a row for " +
               std::to_string(n.axes.back().extent.value) + " entries in groups of " + std::to_string(n.offset));
    }
    if ((n.op == Op::softmax || n.op == Op::causal || n.op == Op::logsumexp || n.op == Op::rms_norm ||
         n.op == Op::argmax || n.op == Op::rope) &&
        x)
      for (const auto& a : n.attr_axes)
        if (!has(x->axes, a)) report("names `" + a + "`, which its input lacks");
    if (n.op == Op::fused_attention && !n.attention) report("has no attention attributes");
    if (n.op == Op::score_mod || n.op == Op::pointwise) {
      if (!n.mod) {
        report("has no expression");
      } else {
        if (n.op == Op::pointwise && (n.mod->score < 0 || n.mod->keep >= 0))
          report("has a keep predicate or no value (a pointwise expression is a value only)");
        for (const ModNode& m : n.mod->nodes) {
          if (m.op != ModOp::load) continue;
          if (m.input < 1 || static_cast<std::size_t>(m.input) >= n.inputs.size())
            report("its expression loads input " + std::to_string(m.input) + ", which it does not have");
          else if (g.node(n.inputs[static_cast<std::size_t>(m.input)]).axes.size() != m.at.size())
            report("its expression loads input " + std::to_string(m.input) + " with " + std::to_string(m.at.size()) +
                   " indices");
        }
      }
    }
    if (n.op == Op::input && n.dim &&
        (!n.axes.empty() || !n.dim->is_dynamic() || n.dim->num != 1 || n.dim->den != 1 || n.dim->plus != 0 ||
         !is_integer(n.dtype)))
      report("feeds a size but is not an integer scalar binding one symbol");
    if (n.op == Op::update_slice) {
      const Node& rows = g.node(n.inputs[1]);
      const Node& start = g.node(n.inputs[2]);
      if (n.attr_axes.size() != 2 || !has(x->axes, n.attr_axes[0]) || !has(rows.axes, n.attr_axes[1]))
        report("does not name the updated axis of x and the rows' axis");
      else if (rows.axes.size() != x->axes.size())
        report("writes rows " + axes_str(rows.axes) + " of another rank");
      if (start.op != Op::input || !start.dim || !n.dim || *start.dim != *n.dim)
        report("starts at %" + std::to_string(n.inputs[2]) + ", not the size input of its start");
    }
    if (stage == Stage::laid_out && n.op == Op::fused_attention && n.attention && count >= 3)
      check_laid_out_attention(g, n, report);
    if (n.op == Op::fused_attention_backward && (!n.attention || count < 6))
      report("has no attention attributes or fewer than 6 inputs");
    else if (stage == Stage::laid_out && n.op == Op::fused_attention_backward)
      check_laid_out_attention(g, n, report);
    if (n.op == Op::attention_dk || n.op == Op::attention_dv || n.op == Op::attention_dtensor) {
      const Node& f = g.node(n.inputs[0]);
      if (f.op != Op::fused_attention_backward || !f.attention) {
        report("reads %" + std::to_string(n.inputs[0]) + ", not a fused_attention_backward");
      } else if (n.op == Op::attention_dtensor) {
        const std::int64_t input = 6 + n.offset;
        if (n.offset < 0 || input >= static_cast<std::int64_t>(f.inputs.size()))
          report("names captured tensor " + std::to_string(n.offset) + ", which its backward does not read");
        else if (names(g.node(f.inputs[static_cast<std::size_t>(input)]).axes) != nm)
          report("is not laid out as the tensor it is the gradient of");
      } else if (stage == Stage::laid_out) {
        const AttentionAttrs& a = *f.attention;
        const Names want = cat({&a.batch, &a.heads}, {a.key, n.op == Op::attention_dk ? a.dk : a.dv});
        if (nm != want) report("is not laid out as " + list(want));
      }
    }
    if (stage == Stage::laid_out && (n.op == Op::attention_weights || n.op == Op::attention_lse)) {
      const Node& f = g.node(n.inputs[0]);
      if (f.op != Op::fused_attention || !f.attention) {
        report("reads %" + std::to_string(n.inputs[0]) + ", not a fused_attention");
      } else {
        const AttentionAttrs& a = *f.attention;
        const bool weights = n.op == Op::attention_weights;
        Names want = cat({&a.batch, &a.heads, &a.group}, {a.query});
        if (weights) want.push_back(a.key);
        if (nm != want) report("is not laid out as " + list(want));
        if (!(weights ? a.write_weights : a.write_lse))
          report(std::string("reads a fused_attention that does not write its ") + (weights ? "weights" : "lse"));
      }
    }
  }
  for (const auto& o : g.outputs())
    if (o.node < 0 || o.node >= static_cast<int>(g.size())) problems.push_back("output '" + o.name + "' names no node");
  return problems;
}

void verify_or_throw(const Graph& g, std::string_view after_pass, Stage stage) {
  const auto problems = verify(g, stage);
  if (!problems.empty()) internal_error("graph invalid after " + std::string(after_pass) + ": " + problems.front());
}

}  // namespace qkv::codegen
