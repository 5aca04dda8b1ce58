#include <qkv/codegen/cpu/fused_call.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace qkv::codegen::cpu {

namespace {

std::int64_t bound(const Bindings& b, const std::vector<Axis>& axes, const std::string& name) {
  for (const auto& a : axes)
    if (a.name == name) {
      auto v = a.extent.resolve(b);
      if (!v) throw ShapeError("execute: `" + name + "` (" + a.extent.str() + ") is not bound");
      return *v;
    }
  throw std::logic_error("qkv internal error: fused attention has no axis `" + name + "`");
}

bool has(const std::vector<Axis>& axes, const std::string& name) {
  return std::any_of(axes.begin(), axes.end(), [&](const Axis& x) { return x.name == name; });
}

}  // namespace

FusedAttentionCall describe_fused_attention(const Graph& g, int id, const Bindings& b) {
  const Node& n = g.node(id);
  const AttentionAttrs& a = *n.attention;
  const auto& q_axes = g.node(n.inputs[0]).axes;
  const auto& v_axes = g.node(n.inputs[2]).axes;
  FusedAttentionCall call;
  AttentionSpec& spec = call.spec;
  spec.dk = bound(b, q_axes, a.dk);
  spec.dv = bound(b, v_axes, a.dv);
  std::int64_t heads = 1, group = 1;
  for (const auto& h : a.heads) heads *= bound(b, q_axes, h);
  for (const auto& h : a.group) group *= bound(b, q_axes, h);
  spec.hq = heads * group;
  spec.hkv = heads;
  double scale = a.scale;
  if (a.scale_dim) {
    auto d = a.scale_dim->resolve(b);
    if (!d) throw ShapeError("execute: the attention scale's extent " + a.scale_dim->str() + " is not bound");
    scale /= std::sqrt(static_cast<double>(*d));
  }
  spec.scale = scale;
  spec.causal = a.causal;
  spec.align = a.align;
  spec.dropout_p = a.dropout;
  spec.write_weights = a.write_weights;

  call.batch = a.batch.empty() ? 1 : bound(b, q_axes, a.batch.front());
  call.len_q = bound(b, q_axes, a.query);
  call.len_k = bound(b, g.node(n.inputs[1]).axes, a.key);
  call.seed = a.seed;
  for (const auto& x : n.axes) {
    auto v = x.extent.resolve(b);
    if (!v) throw ShapeError("execute: `" + x.name + "` (" + x.extent.str() + ") is not bound");
    call.out_shape.push_back(*v);
  }

  for (std::size_t m = 3; m < n.inputs.size(); ++m) {
    const Node& mn = g.node(n.inputs[m]);
    if (!a.batch.empty() && mn.axes.size() == 2 && mn.axes[0].name == a.batch.front()) {
      call.key_padding_input = static_cast<int>(m);
      spec.key_padding = true;
      continue;
    }
    // [query, key], [key] or [query] (the layout pass ordered them).
    const bool has_q = has(mn.axes, a.query), has_k = has(mn.axes, a.key);
    FusedAttentionCall::BiasTerm term;
    term.input = static_cast<int>(m);
    term.keep_mask = mn.dtype == DType::boolean;
    term.stride_q = has_q ? (has_k ? call.len_k : 1) : 0;
    term.stride_k = has_k ? 1 : 0;
    call.bias_terms.push_back(term);
    spec.bias = true;
  }
  return call;
}

}  // namespace qkv::codegen::cpu
