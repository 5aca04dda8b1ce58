#include <qkv/codegen/lowering/attention_call.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace qkv::codegen {

namespace {

const Axis& axis(const std::vector<Axis>& axes, const std::string& name) {
  for (const auto& a : axes)
    if (a.name == name) return a;
  internal_error("fused attention has no axis `" + name + "`");
}

std::int64_t bound(const Extent& e, const std::string& name, const Bindings& b) {
  auto v = e.resolve(b);
  if (!v) throw ShapeError("execute: `" + name + "` (" + e.str() + ") is not bound");
  return *v;
}

bool has(const std::vector<Axis>& axes, const std::string& name) {
  return std::any_of(axes.begin(), axes.end(), [&](const Axis& x) { return x.name == name; });
}

}  // namespace

std::vector<std::string> attention_kernel_symbols(const Graph& g, int id) {
  const Node& n = g.node(id);
  const AttentionAttrs& a = *n.attention;
  const auto& q_axes = g.node(n.inputs[0]).axes;
  std::vector<const Extent*> extents{&axis(q_axes, a.dk).extent, &axis(g.node(n.inputs[2]).axes, a.dv).extent};
  for (const auto* list : {&a.heads, &a.group})
    for (const auto& h : *list) extents.push_back(&axis(q_axes, h).extent);
  if (a.scale_dim) extents.push_back(&*a.scale_dim);
  std::vector<std::string> out;
  for (const Extent* e : extents)
    if (e->is_dynamic() && std::find(out.begin(), out.end(), e->symbol) == out.end()) out.push_back(e->symbol);
  return out;
}

AttentionCall describe_attention(const Graph& g, int id, const Bindings& b) {
  const Node& n = g.node(id);
  const AttentionAttrs& a = *n.attention;
  const auto& q_axes = g.node(n.inputs[0]).axes;
  const auto& v_axes = g.node(n.inputs[2]).axes;
  AttentionCall call;
  cpu::AttentionSpec& spec = call.spec;
  spec.dk = bound(axis(q_axes, a.dk).extent, a.dk, b);
  spec.dv = bound(axis(v_axes, a.dv).extent, a.dv, b);
  std::int64_t heads = 1, group = 1;
  for (const auto& h : a.heads) heads *= bound(axis(q_axes, h).extent, h, b);
  for (const auto& h : a.group) group *= bound(axis(q_axes, h).extent, h, b);
  spec.hq = heads * group;
  spec.hkv = heads;
  double scale = a.scale;
  if (a.scale_dim) scale /= std::sqrt(static_cast<double>(bound(*a.scale_dim, "the attention scale's extent", b)));
  spec.scale = scale;
  spec.causal = a.causal;
  spec.align = a.align;
  spec.dropout_p = a.dropout;
  spec.write_weights = a.write_weights;

  if (!a.batch.empty()) call.batch = axis(q_axes, a.batch.front()).extent;
  call.len_q = axis(q_axes, a.query).extent;
  call.len_k = axis(g.node(n.inputs[1]).axes, a.key).extent;
  call.seed = a.seed;
  for (std::size_t m = 3; m < n.inputs.size(); ++m) {
    const Node& mn = g.node(n.inputs[m]);
    if (!a.batch.empty() && mn.axes.size() == 2 && mn.axes[0].name == a.batch.front()) {
      call.key_padding_input = static_cast<int>(m);
      spec.key_padding = true;
      continue;
    }
    // [query, key], [key] or [query] (the layout pass ordered them).
    call.bias_terms.push_back(
        {static_cast<int>(m), mn.dtype == DType::boolean, has(mn.axes, a.query), has(mn.axes, a.key)});
    spec.bias = true;
  }
  return call;
}

FusedAttentionCall describe_fused_attention(const Graph& g, int id, const Bindings& b) {
  const AttentionCall sym = describe_attention(g, id, b);
  FusedAttentionCall call;
  call.spec = sym.spec;
  call.batch = bound(sym.batch, "batch", b);
  call.len_q = bound(sym.len_q, "query", b);
  call.len_k = bound(sym.len_k, "key", b);
  call.seed = sym.seed;
  for (const auto& x : g.node(id).axes) call.out_shape.push_back(bound(x.extent, x.name, b));
  call.key_padding_input = sym.key_padding_input;
  for (const auto& t : sym.bias_terms)
    call.bias_terms.push_back({t.input, t.keep_mask, t.has_q ? (t.has_k ? call.len_k : 1) : 0, t.has_k ? 1 : 0});
  return call;
}

void combine_masks(const FusedAttentionCall& call, const std::vector<const NdArray*>& in,
                   std::vector<std::uint8_t>* key_keep, std::vector<float>* bias) {
  if (key_keep && call.key_padding_input >= 0) {
    const auto bits = in[static_cast<std::size_t>(call.key_padding_input)]->as<bool>();
    key_keep->assign(static_cast<std::size_t>(call.batch * call.len_k), 1);
    for (std::size_t i = 0; i < key_keep->size() && i < bits.size(); ++i) (*key_keep)[i] = bits[i] ? 1 : 0;
  }
  if (!bias || call.bias_terms.empty()) return;
  bias->assign(static_cast<std::size_t>(call.len_q * call.len_k), 0.0f);
  for (const auto& term : call.bias_terms) {
    const std::vector<float> vals = in[static_cast<std::size_t>(term.input)]->to_f32();
    for (std::int64_t i = 0; i < call.len_q; ++i)
      for (std::int64_t j = 0; j < call.len_k; ++j) {
        const float v = vals[static_cast<std::size_t>(i * term.stride_q + j * term.stride_k)];
        float& dst = (*bias)[static_cast<std::size_t>(i * call.len_k + j)];
        if (term.keep_mask) {
          if (v == 0.0f) dst = -std::numeric_limits<float>::infinity();
        } else {
          dst += v;
        }
      }
  }
}

}  // namespace qkv::codegen
