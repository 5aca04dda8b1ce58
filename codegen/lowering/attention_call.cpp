#include <qkv/codegen/lowering/attention_call.hpp>
#include <qkv/codegen/lowering/storage.hpp>

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

/// A fused_attention_backward's tensor gradients (spec.tensor_grads): one per mask tensor with
/// attention_dtensor nodes. A slot need not run over a task coordinate when every load of the
/// tensor indexes it along that coordinate's axis, at the same extent (so that two tasks never
/// reach one entry): the key chunk by the key axis, the batch by its axis, the kv head by every
/// head axis of the kv heads (not the group's: a task holds all its kv head's query heads).
std::vector<cpu::AttentionSpec::TensorGrad> backward_tensor_grads(const Graph& g, int id,
                                                                  const cpu::AttentionSpec& spec) {
  const Node& n = g.node(id);
  const AttentionAttrs& a = *n.attention;
  const auto& q_axes = g.node(n.inputs[0]).axes;
  std::vector<cpu::AttentionSpec::TensorGrad> out;
  for (int tensor = 0; tensor < static_cast<int>(spec.tensors.size()); ++tensor) {
    if (tensor_grad_nodes(g, id, tensor).empty()) continue;
    const std::vector<Axis>& t_axes = g.node(n.inputs[6 + static_cast<std::size_t>(tensor)]).axes;
    auto in_place = [&](const std::string& name, const Extent& extent) {
      bool any = false;
      for (const ModNode& l : spec.mod.nodes) {
        if (l.op != ModOp::load || l.input != tensor) continue;
        any = true;
        bool found = false;
        for (std::size_t k = 0; k < l.at.size() && k < t_axes.size(); ++k) {
          const ModNode& x = spec.mod.nodes[static_cast<std::size_t>(l.at[k])];
          found = found || (x.op == ModOp::index && x.axis == name && t_axes[k].extent == extent);
        }
        if (!found) return false;
      }
      return any;
    };
    cpu::AttentionSpec::TensorGrad t;
    t.tensor = tensor;
    t.per_chunk = !in_place(a.key, axis(g.node(n.inputs[1]).axes, a.key).extent);
    t.per_batch = a.batch.size() != 1 || !in_place(a.batch[0], axis(q_axes, a.batch[0]).extent);
    t.per_kv_head = a.heads.empty() || !std::all_of(a.heads.begin(), a.heads.end(), [&](const std::string& h) {
                      return in_place(h, axis(q_axes, h).extent);
                    });
    out.push_back(t);
  }
  return out;
}

}  // namespace

std::vector<int> tensor_grad_nodes(const Graph& g, int id, int tensor) {
  std::vector<int> out;
  for (int c = id + 1; c < static_cast<int>(g.size()); ++c) {
    const Node& d = g.node(c);
    if (d.op == Op::attention_dtensor && d.inputs.size() == 1 && d.inputs[0] == id && d.offset == tensor)
      out.push_back(c);
  }
  return out;
}

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
  spec.dropout_p = a.dropout;
  spec.write_weights = a.write_weights;
  spec.write_lse = a.write_lse;
  spec.storage = storage_dtype(n.dtype);  // q, k, v alike (half_native)

  if (!a.batch.empty()) call.batch = axis(q_axes, a.batch.front()).extent;
  call.len_q = axis(q_axes, a.query).extent;
  call.len_k = axis(g.node(n.inputs[1]).axes, a.key).extent;
  call.seed = a.seed;
  // The mod, its loads renumbered onto spec.tensors; the score axes' roles.
  spec.mod = a.mod;
  for (ModNode& x : spec.mod.nodes)
    if (x.op == ModOp::load) x.input -= 3;
  // Tensor k is the node's input 3 + k (a fused_attention_backward's: 6 + k, after out, d_out, lse).
  for (std::size_t m = n.op == Op::fused_attention_backward ? 6 : 3; m < n.inputs.size(); ++m) {
    const Node& t = g.node(n.inputs[m]);
    call.tensor_inputs.push_back(static_cast<int>(m));
    spec.tensors.push_back({cpu::ModTensor::Source::captured, storage_dtype(t.dtype), static_cast<int>(t.axes.size())});
  }
  spec.axes.batch = a.batch.empty() ? std::string() : a.batch.front();
  spec.axes.query = a.query;
  spec.axes.key = a.key;
  std::vector<std::string> head_axes = a.heads;
  head_axes.insert(head_axes.end(), a.group.begin(), a.group.end());
  std::int64_t stride = 1;
  for (auto it = head_axes.rbegin(); it != head_axes.rend(); ++it) {
    const std::int64_t extent = bound(axis(q_axes, *it).extent, *it, b);
    spec.axes.heads.insert(spec.axes.heads.begin(), {*it, stride, extent});
    stride *= extent;
  }
  if (spec.axes.heads.empty()) spec.axes.heads.push_back({"", 1, 1});
  if (n.op == Op::fused_attention_backward) spec.tensor_grads = backward_tensor_grads(g, id, spec);
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
  call.tensor_inputs = sym.tensor_inputs;
  for (int m : call.tensor_inputs)
    for (const auto& x : g.node(g.node(id).inputs[static_cast<std::size_t>(m)]).axes)
      call.tensor_extents.push_back(bound(x.extent, x.name, b));
  return call;
}

std::vector<BlockClass> classify_tiles(const Graph& g, int id, const std::vector<const NdArray*>& in,
                                       const Bindings& sizes, std::int64_t batch, std::int64_t head,
                                       std::int64_t tile_q, std::int64_t tile_k) {
  const FusedAttentionCall call = describe_fused_attention(g, id, sizes);
  const ModExpr& e = g.node(id).attention->mod;
  const cpu::ModAxes& axes = call.spec.axes;
  std::vector<std::vector<float>> values(in.size());
  for (int m : call.tensor_inputs) values[static_cast<std::size_t>(m)] = in[static_cast<std::size_t>(m)]->to_f32();
  struct Env {
    const Graph& g;
    const Node& n;
    const cpu::ModAxes& axes;
    const FusedAttentionCall& call;
    const std::vector<std::vector<float>>& values;
    const Bindings& sizes;
    std::int64_t batch, head, q0, q1, k0, k1;
    [[nodiscard]] ModInterval index(const std::string& a) const {
      if (a == axes.query) return {double(q0), double(q1)};
      if (a == axes.key) return {double(k0), double(k1)};
      if (a == axes.batch) return {double(batch), double(batch)};
      for (const auto& h : axes.heads)
        if (h.name == a) {
          const double c = double((head / h.stride) % h.extent);
          return {c, c};
        }
      internal_error("classify_tiles: the mod names the axis `" + a + "`, which the scores do not have");
    }
    [[nodiscard]] double length(const std::string& a) const {
      if (a == axes.query) return double(call.len_q);
      if (a == axes.key) return double(call.len_k);
      if (a == axes.batch) return double(call.batch);
      for (const auto& h : axes.heads)
        if (h.name == a) return double(h.extent);
      return 0;
    }
    [[nodiscard]] ModInterval load(int input, const ModNode& ld, const std::vector<ModInterval>& at) const {
      const auto& v = values[static_cast<std::size_t>(input)];
      const auto& shape = g.node(n.inputs[static_cast<std::size_t>(input)]).axes;
      std::vector<std::int64_t> lo(at.size()), hi(at.size()), ext(at.size());
      int ranging = 0;
      for (std::size_t d = 0; d < at.size(); ++d) {
        ext[d] = bound(shape[d].extent, shape[d].name, sizes);
        auto clamp = [&](double x) {
          if (std::isnan(x)) return std::int64_t{0};
          return static_cast<std::int64_t>(
              std::clamp(std::trunc(x), 0.0, double(std::max<std::int64_t>(ext[d], 1) - 1)));
        };
        lo[d] = clamp(at[d].lo);
        hi[d] = clamp(at[d].hi);
        if (lo[d] != hi[d]) {
          // As the kernels: one ranging index, itself a coordinate, is scanned; else unbounded.
          const ModOp op = n.attention->mod.nodes[static_cast<std::size_t>(ld.at[d])].op;
          if (op != ModOp::index && op != ModOp::position) return {};
          ++ranging;
        }
      }
      if (ranging > 1) return {};
      double mn = std::numeric_limits<double>::infinity(), mx = -mn;
      std::vector<std::int64_t> idx = lo;
      for (;;) {
        std::int64_t off = 0;
        for (std::size_t d = 0; d < idx.size(); ++d) off = off * ext[d] + idx[d];
        const double x = off < static_cast<std::int64_t>(v.size()) ? v[static_cast<std::size_t>(off)] : 0.0;
        mn = std::min(mn, x);
        mx = std::max(mx, x);
        std::size_t d = 0;
        while (d < idx.size() && idx[d] == hi[d]) ++d;
        if (d == idx.size()) break;
        ++idx[d];
      }
      return {mn, mx};
    }
  };
  std::vector<BlockClass> out;
  for (std::int64_t q0 = 0; q0 < call.len_q; q0 += tile_q)
    for (std::int64_t k0 = 0; k0 < call.len_k; k0 += tile_k) {
      const Env env{g,      g.node(id),
                    axes,   call,
                    values, sizes,
                    batch,  head,
                    q0,     std::min(q0 + tile_q, call.len_q) - 1,
                    k0,     std::min(k0 + tile_k, call.len_k) - 1};
      out.push_back(mod_classify(e, env));
    }
  return out;
}

}  // namespace qkv::codegen
