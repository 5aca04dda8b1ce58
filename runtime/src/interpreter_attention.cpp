// runtime/src/interpreter_attention.cpp — the reference interpreter on the fused attention nodes
// the pass pipeline and the gradient of a fused attention make:
//   fused_attention            run as the unfused graph it stands for (qkv/ir/attention_graph.hpp),
//                              with its log-sum-exp and weights for attention_lse / attention_weights;
//   fused_attention_backward   FlashAttention-2's backward in plain loops (fp64 sums): P recomputed
//                              from the forward's log-sum-exp, D = rowsum(dO ∘ O), dV = Pᵀ dO,
//                              dP = dO Vᵀ, dS = P ∘ (dP − D) ∘ f'(s), dQ = scale · dS K,
//                              dK = scale · dSᵀ Q, with dK and dV summed over the query heads of a
//                              GQA group; the masked scores come from the same unfused graph (its
//                              score_mod); f' and the gradients of the tensors the mod reads
//                              (attention_dtensor) from the mod's derivatives, entry by entry;
//                              dropout replayed (Z from the same dropout op on ones).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <qkv/ir/attention_graph.hpp>
#include <qkv/runtime/interpreter.hpp>

#include "interpreter_ops.hpp"

namespace qkv::interp {

namespace {

/// A value laid out over the axes `from` (names), as laid out over `to` (the same names).
Value permuted(const Value& v, const std::vector<std::string>& from, const std::vector<std::string>& to) {
  if (from == to) return v;
  std::vector<Axis> src;
  for (std::size_t k = 0; k < from.size(); ++k) src.push_back({from[k], Extent::fixed(v.shape[k])});
  Value out;
  for (const auto& name : to)
    for (std::size_t k = 0; k < from.size(); ++k)
      if (from[k] == name) out.shape.push_back(v.shape[k]);
  const Shape st = strides_by_name(to, src, v.shape);
  out.data.resize(v.data.size());
  Shape idx(to.size(), 0);
  std::size_t i = 0;
  if (!out.data.empty()) do
      out.data[i++] = v.data[static_cast<std::size_t>(dot(idx, st))];
    while (next_index(idx, out.shape));
  return out;
}

/// The sub-graph's input for the fused node's input k (static extents: the value's).
struct Mini {
  Graph g;
  Feeds feeds;
  std::vector<int> ids;  // per fused input
  explicit Mini(const OpArgs& a) {
    for (std::size_t k = 0; k < a.in.size(); ++k) {
      const Node& src = *a.in_nodes[k];
      const Value& v = *a.in[k];
      Node n;
      n.op = Op::input;
      n.name = "in" + std::to_string(k);
      n.dtype = src.dtype == DType::boolean ? DType::boolean : DType::f32;
      for (std::size_t d = 0; d < src.axes.size(); ++d) n.axes.push_back({src.axes[d].name, Extent::fixed(v.shape[d])});
      ids.push_back(g.add(std::move(n)));
      if (src.dtype == DType::boolean) {
        NdArray arr = NdArray::zeros(DType::boolean, v.shape);
        for (std::size_t i = 0; i < v.data.size(); ++i)
          arr.bytes[i] = std::byte{v.data[i] != 0.0f ? std::uint8_t{1} : std::uint8_t{0}};
        feeds["in" + std::to_string(k)] = std::move(arr);
      } else {
        feeds["in" + std::to_string(k)] = NdArray::from_f32(v.data, v.shape);
      }
    }
  }
  std::vector<Axis> axes(int id) const { return g.node(id).axes; }
  Value value(const std::vector<NdArray>& all, int id) const {
    return Value{all[static_cast<std::size_t>(id)].shape, all[static_cast<std::size_t>(id)].to_f32()};
  }
};

std::vector<int> captured_ids(const Mini& m, std::size_t first) {
  return {m.ids.begin() + static_cast<std::ptrdiff_t>(first), m.ids.end()};
}

std::vector<Axis> static_axes(const OpArgs& a) {
  std::vector<Axis> out;
  for (const auto& ax : a.node.axes) out.push_back({ax.name, Extent::fixed(bound_extent(a, ax))});
  return out;
}

/// Product of the extents of the named axes of `axes` (with `shape`).
std::int64_t extent_of(const std::vector<Axis>& axes, const Shape& shape, const std::vector<std::string>& names) {
  std::int64_t n = 1;
  for (const auto& name : names)
    for (std::size_t k = 0; k < axes.size(); ++k)
      if (axes[k].name == name) n *= shape[k];
  return n;
}

/// The node's attributes with the scale's dimension bound (the sub-graph has static extents).
AttentionAttrs bound_attrs(const OpArgs& a) {
  AttentionAttrs at = *a.node.attention;
  if (at.scale_dim) {
    const auto d = at.scale_dim->resolve(a.bindings);
    if (!d) internal_error(where(a) + "the scale's dimension is not bound");
    at.scale_dim = Extent::fixed(*d);
  }
  return at;
}

}  // namespace

std::vector<Value> eval_fused_attention(const OpArgs& a) {
  const AttentionAttrs at = bound_attrs(a);
  Mini m(a);
  const UnfusedAttention u = append_unfused_attention(m.g, at, m.ids[0], m.ids[1], m.ids[2], captured_ids(m, 3),
                                                      static_axes(a), DType::f32, true);
  const std::vector<NdArray> all = interpret_all(m.g, m.feeds);
  Value lse = m.value(all, u.lse), weights = m.value(all, u.dropped);
  return {m.value(all, u.out), lse, weights};
}

/// The lse / weights of a fused attention (its side values `side`) laid out as node `a.node`.
Value attention_side_value(const OpArgs& a, const Node& fused, const Value& side, bool weights) {
  const AttentionAttrs& at = *fused.attention;
  std::vector<Axis> score_axes =
      attention_score_axes(at, a.graph.node(fused.inputs[0]).axes, a.graph.node(fused.inputs[1]).axes);
  std::vector<std::string> from;
  for (const auto& x : score_axes)
    if (weights || x.name != at.key) from.push_back(x.name);
  return permuted(side, from, names_of(a.node.axes));
}

std::vector<Value> eval_attention_backward(const OpArgs& a) {
  const AttentionAttrs at = bound_attrs(a);
  const Node &qn = *a.in_nodes[0], &kn = *a.in_nodes[1], &vn = *a.in_nodes[2];
  const Value &qv = *a.in[0], &kv = *a.in[1], &vv = *a.in[2];
  // The masked scores (scale · q·k, −inf where the mod masks) from the unfused graph.
  Mini m(a);
  std::vector<int> captured(m.ids.begin() + 6, m.ids.end());
  const std::vector<Axis> score_axes = attention_score_axes(at, m.axes(m.ids[0]), m.axes(m.ids[1]));
  std::vector<Axis> o_axes = m.axes(m.ids[3]);
  const UnfusedAttention u =
      append_unfused_attention(m.g, at, m.ids[0], m.ids[1], m.ids[2], captured, o_axes, DType::f32, false);
  // The forward's dropout factors Z (keep / (1 − p), 0 where dropped): its dropout on ones.
  int z_id = -1;
  if (at.dropout > 0) {
    Node ones;
    ones.op = Op::fill;
    ones.axes = m.axes(u.scores);
    ones.scalar = 1.0;
    Node z;
    z.op = Op::dropout;
    z.inputs = {m.g.add(std::move(ones))};
    z.axes = m.axes(u.scores);
    z.scalar = at.dropout;
    z.seed = at.seed;
    z_id = m.g.add(std::move(z));
  }
  const std::vector<NdArray> all = interpret_all(m.g, m.feeds);
  const std::vector<float> s = m.value(all, u.modified).data;  // [BH, G, L, S]
  const std::vector<float> raw = m.value(all, u.scores).data;  // scale · q·k, the mod's score leaf
  const std::vector<float> zf = z_id >= 0 ? m.value(all, z_id).data : std::vector<float>{};

  // The mod with its derivatives (by the score, and by each load of a captured tensor), evaluated
  // per entry: the entry's coordinates along the score axes, the captured tensors as fed.
  const std::size_t ncap = a.in.size() - 6;
  std::vector<int> tensor_inputs;
  for (std::size_t i = 0; i < ncap; ++i) tensor_inputs.push_back(3 + static_cast<int>(i));
  const ModDerivative dmod = mod_with_derivatives(at.mod, tensor_inputs);
  std::vector<std::vector<double>> dtensor(ncap);
  for (std::size_t i = 0; i < ncap; ++i) dtensor[i].assign(a.in[6 + i]->data.size(), 0.0);
  Shape score_shape, coord(score_axes.size(), 0);
  for (const auto& x : score_axes) score_shape.push_back(x.extent.value);
  const ModEnv env{score_axes, score_shape, coord, a.in, 3};  // load 3 + i reads the node's input 6 + i
  std::vector<double> vals;
  /// G (the gradient by the modified score) at entry `flat` (row · S + key, the score axes'
  /// row-major order) through the mod: G · f'(s), and G · d score' / d load added into each
  /// differentiated load's element, as the load clamps it. G itself without a score part.
  auto through_mod = [&](std::int64_t flat, double g) {
    if (at.mod.score < 0) return g;
    for (std::size_t d = score_shape.size(), rest = static_cast<std::size_t>(flat); d-- > 0;) {
      coord[d] = static_cast<std::int64_t>(rest % static_cast<std::size_t>(score_shape[d]));
      rest /= static_cast<std::size_t>(score_shape[d]);
    }
    mod_eval(dmod.expr, static_cast<double>(raw[static_cast<std::size_t>(flat)]), env, vals);
    for (const ModLoadDerivative& l : dmod.loads) {
      const ModNode& ld = dmod.expr.nodes[static_cast<std::size_t>(l.load)];
      std::vector<double> coords;
      for (std::size_t d = 0; d < ld.at.size(); ++d)
        coords.push_back(mod_load_index(vals[static_cast<std::size_t>(ld.at[d])], env.extent(ld.input, d)));
      dtensor[static_cast<std::size_t>(ld.input - 3)][env.offset(ld.input, coords)] +=
          g * vals[static_cast<std::size_t>(l.d)];
    }
    return g * vals[static_cast<std::size_t>(dmod.dscore)];
  };

  // Every operand in the canonical order: q [BH, G, L, dk], k [BH, S, dk], v [BH, S, dv],
  // out and d_out [BH, G, L, dv], lse [BH, G, L].
  std::vector<std::string> bh = at.batch;
  bh.insert(bh.end(), at.heads.begin(), at.heads.end());
  auto order = [&](std::vector<std::string> tail, bool group) {
    std::vector<std::string> o = bh;
    if (group) o.insert(o.end(), at.group.begin(), at.group.end());
    o.insert(o.end(), tail.begin(), tail.end());
    return o;
  };
  const std::vector<std::string> q_order = order({at.query, at.dk}, true), k_order = order({at.key, at.dk}, false),
                                 v_order = order({at.key, at.dv}, false), o_order = order({at.query, at.dv}, true),
                                 l_order = order({at.query}, true);
  const std::vector<float> q = permuted(qv, names_of(qn.axes), q_order).data;
  const std::vector<float> k = permuted(kv, names_of(kn.axes), k_order).data;
  const std::vector<float> v = permuted(vv, names_of(vn.axes), v_order).data;
  const std::vector<float> o = permuted(*a.in[3], names_of(a.in_nodes[3]->axes), o_order).data;
  const std::vector<float> dout = permuted(*a.in[4], names_of(a.in_nodes[4]->axes), o_order).data;
  const std::vector<float> lse = permuted(*a.in[5], names_of(a.in_nodes[5]->axes), l_order).data;
  const std::int64_t nbh = extent_of(qn.axes, qv.shape, bh), ng = extent_of(qn.axes, qv.shape, at.group),
                     L = extent_of(qn.axes, qv.shape, {at.query}), S = extent_of(kn.axes, kv.shape, {at.key}),
                     dk = extent_of(qn.axes, qv.shape, {at.dk}), dv = extent_of(vn.axes, vv.shape, {at.dv});
  const double scale = at.scale_dim ? 1.0 / std::sqrt(static_cast<double>(at.scale_dim->value)) : at.scale;
  std::vector<double> dq(static_cast<std::size_t>(nbh * ng * L * dk), 0.0),
      dkk(static_cast<std::size_t>(nbh * S * dk), 0.0), dvv(static_cast<std::size_t>(nbh * S * dv), 0.0);
  std::vector<double> p(static_cast<std::size_t>(S)), ds(static_cast<std::size_t>(S));
  const auto at_ = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  for (std::int64_t b = 0; b < nbh; ++b)
    for (std::int64_t g = 0; g < ng; ++g)
      for (std::int64_t i = 0; i < L; ++i) {
        const std::int64_t row = (b * ng + g) * L + i;
        const double l = lse[at_(row)];
        double delta = 0;
        for (std::int64_t d = 0; d < dv; ++d)
          delta += static_cast<double>(dout[at_(row * dv + d)]) * static_cast<double>(o[at_(row * dv + d)]);
        for (std::int64_t j = 0; j < S; ++j) {
          const double x = s[at_(row * S + j)];
          p[at_(j)] = (l == -std::numeric_limits<double>::infinity() || x == -std::numeric_limits<double>::infinity())
                          ? 0.0
                          : std::exp(x - l);
          // With dropout the forward used P ∘ Z: dV takes it, and dP (by P) is (dO Vᵀ) ∘ Z.
          const double z = zf.empty() ? 1.0 : static_cast<double>(zf[at_(row * S + j)]);
          double dp = 0;
          for (std::int64_t d = 0; d < dv; ++d)
            dp += static_cast<double>(dout[at_(row * dv + d)]) * static_cast<double>(v[at_((b * S + j) * dv + d)]);
          dp *= z;
          // dS through the mod: 0 where P is (a masked entry's derivatives may not be finite).
          ds[at_(j)] = p[at_(j)] == 0.0 ? 0.0 : through_mod(row * S + j, p[at_(j)] * (dp - delta));
          for (std::int64_t d = 0; d < dv; ++d)
            dvv[at_((b * S + j) * dv + d)] += p[at_(j)] * z * static_cast<double>(dout[at_(row * dv + d)]);
          for (std::int64_t d = 0; d < dk; ++d) {
            dq[at_(row * dk + d)] += scale * ds[at_(j)] * static_cast<double>(k[at_((b * S + j) * dk + d)]);
            dkk[at_((b * S + j) * dk + d)] += scale * ds[at_(j)] * static_cast<double>(q[at_(row * dk + d)]);
          }
        }
      }
  auto value = [](const std::vector<double>& x, Shape shape) {
    Value r;
    r.shape = std::move(shape);
    r.data.assign(x.begin(), x.end());
    return r;
  };
  auto canon_shape = [](const std::vector<std::string>& order_names, const Node& n, const Value& like) {
    Shape sh;
    for (const auto& name : order_names)
      for (std::size_t axis = 0; axis < n.axes.size(); ++axis)
        if (n.axes[axis].name == name) sh.push_back(like.shape[axis]);
    return sh;
  };
  std::vector<Value> out{permuted(value(dq, canon_shape(q_order, qn, qv)), q_order, names_of(qn.axes)),
                         permuted(value(dkk, canon_shape(k_order, kn, kv)), k_order, names_of(kn.axes)),
                         permuted(value(dvv, canon_shape(v_order, vn, vv)), v_order, names_of(vn.axes))};
  for (std::size_t i = 0; i < ncap; ++i) out.push_back(value(dtensor[i], a.in[6 + i]->shape));
  return out;
}

}  // namespace qkv::interp
