#include <qkv/codegen/lowering/select.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>

#include <qkv/ir/quant.hpp>

#include "lowering/graph_util.hpp"

namespace qkv::codegen {

static_assert(
    [] {
      int views = 0;
      for (const OpInfo& o : kOps) views += o.view;
      return views == 4 && is_view(Op::split) && is_view(Op::merge) && is_view(Op::rename) && is_view(Op::view);
    }(),
    "select_kernel maps exactly the view ops of kOps to KernelKind::view");

bool dequantize_in_linear(const Graph& g, int id) {
  const Node& n = g.node(id);
  if (n.op != Op::dequantize || n.inputs.size() != 2) return false;
  const Node &q = g.node(n.inputs[0]), &s = g.node(n.inputs[1]);
  if (q.dtype != DType::i8 || !is_array_leaf(q) || !is_array_leaf(s) || s.dtype != DType::f16 || q.axes.size() != 2 ||
      n.offset < 1 || n.offset % kQuantGroupQuantum != 0)
    return false;
  if (dequantizes_q4(n)) {  // (q's bytes: K / 2, its K a run-time size or not: quantize.hpp)
    const Extent& bytes = q.axes.back().extent;
    if (n.offset % (2 * kQuantGroupQuantum) != 0 || !bytes.is_static() || 2 * bytes.value % n.offset != 0) return false;
  }
  for (const auto& o : g.outputs())
    if (o.node == id) return false;
  bool read = false;
  for (int c = id + 1; c < static_cast<int>(g.size()); ++c) {
    const Node& u = g.node(c);
    for (std::size_t k = 0; k < u.inputs.size(); ++k) {
      if (u.inputs[k] != id) continue;
      if (k != 1 || !util::linear_on_last_axis(g, u)) return false;
      read = true;
    }
  }
  return read;
}

std::optional<GemmRoles> contract_gemm_roles(const Graph& g, int id) {
  const Node& n = g.node(id);
  if (n.op != Op::contract || n.inputs.size() != 2) return std::nullopt;
  auto has = [](const std::vector<Axis>& axes, const std::string& name) {
    return std::any_of(axes.begin(), axes.end(), [&](const Axis& a) { return a.name == name; });
  };
  GemmRoles r{n.inputs[0], n.inputs[1], {}, {}, {}, {}};
  if (!n.axes.empty() && !has(g.node(r.a).axes, n.axes[0].name)) std::swap(r.a, r.b);
  const Node &ln = g.node(r.a), &rn = g.node(r.b);
  for (const Axis& a : n.axes) {
    const bool l = has(ln.axes, a.name), rr = has(rn.axes, a.name);
    if (l && rr)
      r.batch.push_back(a);
    else if (l)
      r.m.push_back(a);
    else if (rr)
      r.n.push_back(a);
    else
      return std::nullopt;
  }
  for (const auto& c : n.attr_axes) r.k.push_back(ln.axes[util::axis_pos(ln.axes, c)]);
  for (const Node* in : {&ln, &rn})
    for (const Axis& a : in->axes)
      if (!has(n.axes, a.name) && std::find(n.attr_axes.begin(), n.attr_axes.end(), a.name) == n.attr_axes.end())
        return std::nullopt;
  if (r.m.empty() || r.n.empty() || r.k.empty()) return std::nullopt;
  return r;
}

std::optional<FillSums> contract_fill_sums(const Graph& g, int id) {
  const Node& n = g.node(id);
  if (n.op != Op::contract || n.inputs.size() != 2) return std::nullopt;
  FillSums r{n.inputs[0], n.inputs[1], false};
  if (g.node(r.x).op == Op::fill) std::swap(r.x, r.fill);
  if (g.node(r.fill).op != Op::fill) return std::nullopt;
  const auto& axes = g.node(r.x).axes;
  const std::vector<std::string> out = util::names(n.axes);
  r.columns = !out.empty() && util::laid_out(axes, n.attr_axes, out);
  if (!r.columns && !util::laid_out(axes, out, n.attr_axes)) return std::nullopt;
  return r;
}

namespace {
/// Whether node `id` is read, and only by sums of a fill (contract_fill_sums), each taking it as
/// its x (`as_x`) or as its fill, never both; never an output.
bool read_only_by_sums(const Graph& g, int id, bool as_x) {
  for (const auto& o : g.outputs())
    if (o.node == id) return false;
  bool read = false;
  for (int k = id + 1; k < static_cast<int>(g.size()); ++k)
    for (int in : g.node(k).inputs)
      if (in == id) {
        const auto sums = contract_fill_sums(g, k);
        if (!sums || sums->x == sums->fill || (as_x ? sums->x : sums->fill) != id) return false;
        read = true;
      }
  return read;
}
}  // namespace

bool fill_only_summed(const Graph& g, int id) {
  return g.node(id).op == Op::fill && read_only_by_sums(g, id, /*as_x=*/false);
}

bool elementwise_only_summed(const Graph& g, int id) {
  const Node& n = g.node(id);
  auto real = [](DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; };
  if (!real(n.dtype) || n.inputs.empty()) return false;
  for (int in : n.inputs)
    if (!real(g.node(in).dtype) || g.node(in).axes != n.axes) return false;
  if (n.op == Op::pointwise) {
    if (!n.mod || n.mod->score < 0 || n.mod->keep >= 0) return false;
    const ModExpr& e = *n.mod;
    const auto inputs = static_cast<int>(n.inputs.size());
    auto leaf = [&](int x, ModOp op) { return x >= 0 && e.nodes[static_cast<std::size_t>(x)].op == op; };
    if (leaf(e.score, ModOp::index)) return false;
    for (const ModNode& m : e.nodes) {
      if (m.op == ModOp::position) return false;
      if (m.op == ModOp::load && (m.input < 0 || m.input >= inputs || !mod_loads_in_place(e, m.input, n.axes)))
        return false;
      // An index only as a load's coordinate (the entry's own, in place).
      if (m.op != ModOp::load && (leaf(m.a, ModOp::index) || leaf(m.b, ModOp::index) || leaf(m.c, ModOp::index)))
        return false;
    }
  } else if (n.op != Op::add && n.op != Op::mul) {
    return false;
  }
  return read_only_by_sums(g, id, /*as_x=*/true);
}

KernelKind select_kernel(const Graph& g, int id) {
  const Node& n = g.node(id);
  // Every op has a case and there is no default: an op added without a kernel kind does not build.
  switch (n.op) {
    case Op::input:
    case Op::param:
      return KernelKind::leaf;
    case Op::split:
    case Op::merge:
    case Op::rename:
    case Op::view:
      return KernelKind::view;
    case Op::fused_attention:
      return KernelKind::fused_attention;
    case Op::attention_weights:
      return KernelKind::attention_weights;
    case Op::attention_lse:
      return KernelKind::attention_lse;
    case Op::linear:
      return util::linear_on_last_axis(g, n) ? KernelKind::gemm : KernelKind::linear_strided;
    case Op::layer_norm:
      return util::layer_norm_on_last_axis(g, n) ? KernelKind::layer_norm_rows : KernelKind::layer_norm_strided;
    case Op::relu:
    case Op::gelu:
    case Op::silu:
    case Op::scale:
      return KernelKind::unary;
    case Op::add: {
      const auto &x = g.node(n.inputs[0]).axes, &y = g.node(n.inputs[1]).axes;
      // names and extents; integers never (the row-wise kernels take floats; an integer input is
      // read as integers, storage.hpp)
      const bool floats = !is_integer(g.node(n.inputs[0]).dtype) && !is_integer(g.node(n.inputs[1]).dtype);
      return x == y && floats ? KernelKind::add_same : KernelKind::broadcast_binary;
    }
    case Op::mul:
    case Op::bias:
    case Op::keep_mask:
      return KernelKind::broadcast_binary;
    case Op::permute:
    case Op::broadcast:
    case Op::slice:
    case Op::concat:
      return KernelKind::strided_copy;
    case Op::fill:
      return KernelKind::fill;
    case Op::softmax:
      return KernelKind::softmax;
    case Op::logsumexp:
      return KernelKind::logsumexp;
    case Op::causal:
      return KernelKind::causal;
    case Op::score_mod:
    case Op::pointwise:
      return KernelKind::score_mod;
    case Op::dropout:
      return KernelKind::dropout;
    case Op::contract:
      return KernelKind::contract;
    case Op::rms_norm:
      return KernelKind::rms_norm;
    case Op::rope:
      return KernelKind::rope;
    case Op::embedding:
      return KernelKind::embedding;
    case Op::embedding_grad:
      return KernelKind::embedding_grad;
    case Op::argmax:
      return KernelKind::argmax;
    case Op::update_slice:
      return KernelKind::update_slice;
    case Op::convert:
      return KernelKind::convert;
    case Op::fused_attention_backward:
      return KernelKind::attention_backward;
    case Op::attention_dk:
    case Op::attention_dv:
    case Op::attention_dtensor:
      return KernelKind::attention_grads;
    case Op::dequantize:
      return dequantize_in_linear(g, id) ? KernelKind::dequantize_in_linear : KernelKind::dequantize;
  }
  internal_error("select_kernel: op " + std::string(op_name(n.op)) + " has no kernel kind");
}

std::string_view kernel_kind_name(KernelKind kind) {
  switch (kind) {
    case KernelKind::leaf:
      return "leaf";
    case KernelKind::view:
      return "view";
    case KernelKind::fused_attention:
      return "fused_attention";
    case KernelKind::attention_weights:
      return "attention_weights";
    case KernelKind::attention_lse:
      return "attention_lse";
    case KernelKind::attention_backward:
      return "attention_backward";
    case KernelKind::attention_grads:
      return "attention_grads";
    case KernelKind::gemm:
      return "gemm";
    case KernelKind::linear_strided:
      return "linear_strided";
    case KernelKind::layer_norm_rows:
      return "layer_norm_rows";
    case KernelKind::layer_norm_strided:
      return "layer_norm_strided";
    case KernelKind::unary:
      return "unary";
    case KernelKind::add_same:
      return "add_same";
    case KernelKind::broadcast_binary:
      return "broadcast_binary";
    case KernelKind::strided_copy:
      return "strided_copy";
    case KernelKind::fill:
      return "fill";
    case KernelKind::softmax:
      return "softmax";
    case KernelKind::logsumexp:
      return "logsumexp";
    case KernelKind::causal:
      return "causal";
    case KernelKind::dropout:
      return "dropout";
    case KernelKind::contract:
      return "contract";
    case KernelKind::score_mod:
      return "score_mod";
    case KernelKind::rms_norm:
      return "rms_norm";
    case KernelKind::rope:
      return "rope";
    case KernelKind::embedding:
      return "embedding";
    case KernelKind::embedding_grad:
      return "embedding_grad";
    case KernelKind::argmax:
      return "argmax";
    case KernelKind::update_slice:
      return "update_slice";
    case KernelKind::convert:
      return "convert";
    case KernelKind::dequantize:
      return "dequantize";
    case KernelKind::dequantize_in_linear:
      return "dequantize_in_linear";
  }
  return "?";
}

}  // namespace qkv::codegen
