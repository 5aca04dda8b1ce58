// The module's plan (module_builder.hpp): which sizes are dynamic, the attention calls, the arena
// blocks and their slots (lowering/lifetimes.hpp), and the C signature. No LLVM.
#include <algorithm>
#include <cctype>
#include <set>
#include <stdexcept>
#include <string>

#include <qkv/codegen/cpu/compiled_graph.hpp>
#include <qkv/codegen/cpu/tuning.hpp>
#include <qkv/codegen/lowering/lifetimes.hpp>
#include <qkv/codegen/lowering/select.hpp>
#include <qkv/codegen/lowering/storage.hpp>
#include <qkv/ir/quant.hpp>

#include "cpu/kernels/decode_kernel.hpp"
#include "cpu/kernels/gemm_kernel.hpp"
#include "cpu/module/module_builder.hpp"
#include "lowering/graph_util.hpp"

namespace qkv::codegen::cpu {

namespace {

/// Every symbol the graph's extents use, sorted.
std::set<std::string> graph_symbols(const Graph& g) {
  std::set<std::string> s;
  auto add = [&](const Extent& e) {
    if (e.is_dynamic()) s.insert(e.symbol);
  };
  for (const auto& n : g.nodes()) {
    for (const auto& a : n.axes) add(a.extent);
    if (n.dim) add(*n.dim);
    if (n.attention && n.attention->scale_dim) add(*n.attention->scale_dim);
  }
  for (const auto& c : g.constraints()) {
    add(c.a);
    add(c.b);
  }
  return s;
}

/// A slice the attention kernels can read in place: the first rows along the second-to-last axis
/// (a KV cache's positions, [.., Slot, HeadDim]) of its input, read only as the keys or values
/// of fused attentions, whose key axis it is.
bool cache_prefix(const Graph& g, int id, const std::vector<std::vector<int>>& users, const std::set<int>& outputs) {
  const Node& n = g.node(id);
  if (n.op != Op::slice || n.offset != 0 || n.dim || n.attr_axes.size() != 2 || outputs.count(id)) return false;
  const auto& in = g.node(n.inputs[0]).axes;
  if (in.size() < 2 || in[in.size() - 2].name != n.attr_axes[0] || n.axes.size() != in.size()) return false;
  for (int u : users[static_cast<std::size_t>(id)]) {
    const Node& a = g.node(u);
    if (a.op != Op::fused_attention || !a.attention || a.attention->key != n.attr_axes[1]) return false;
    for (std::size_t k = 0; k < a.inputs.size(); ++k)
      if (a.inputs[k] == id && k != 1 && k != 2) return false;
  }
  return true;
}

/// plan.kv_alias / kv_rows: the attentions whose K and V are both cache prefixes of equal
/// capacity read them in place; a prefix is aliased when every attention that reads it does.
void plan_cache_reads(const Graph& g, ModulePlan& plan) {
  const int count = static_cast<int>(g.size());
  std::vector<std::vector<int>> users(static_cast<std::size_t>(count));
  for (int id = 0; id < count; ++id)
    for (int in : g.node(id).inputs) users[static_cast<std::size_t>(in)].push_back(id);
  std::set<int> outputs;
  for (const auto& o : g.outputs()) outputs.insert(o.node);
  std::set<int> ok;
  for (int id = 0; id < count; ++id)
    if (cache_prefix(g, id, users, outputs)) ok.insert(id);
  auto rows = [&](int slice) {
    const auto& in = g.node(g.node(slice).inputs[0]).axes;
    return in[in.size() - 2].extent;
  };
  for (bool changed = true; changed;) {  // drop prefixes one of whose readers cannot read in place
    changed = false;
    plan.kv_rows.clear();
    for (int id = 0; id < count; ++id) {
      const Node& n = g.node(id);
      if (n.op != Op::fused_attention) continue;
      const int k = n.inputs[1], v = n.inputs[2];
      if (ok.count(k) && ok.count(v) && rows(k) == rows(v)) plan.kv_rows.emplace(id, rows(k));
    }
    for (auto it = ok.begin(); it != ok.end();) {
      const auto& us = users[static_cast<std::size_t>(*it)];
      if (std::all_of(us.begin(), us.end(), [&](int u) { return plan.kv_rows.count(u) > 0; })) {
        ++it;
      } else {
        it = ok.erase(it);
        changed = true;
      }
    }
  }
  plan.kv_alias = ok;
}

/// What the planner assumes of a size it does not know (it only steers which blocks share slots).
constexpr std::int64_t kTypicalSize = 512;

}  // namespace

std::vector<std::string> specialised_sizes(const Graph& g) {
  std::vector<std::string> out;
  for (int id = 0; id < static_cast<int>(g.size()); ++id)
    if (g.node(id).op == Op::fused_attention || g.node(id).op == Op::fused_attention_backward)
      for (auto& s : attention_kernel_symbols(g, id))
        if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  return out;
}

GemmConfig linear_gemm_config(const Graph& lowered, int id, const HostTarget& target) {
  GemmSpec spec;
  const Node& n = lowered.node(id);
  const DType x = storage_dtype(lowered.node(n.inputs[0]).dtype);
  spec.bf16 = x == DType::bf16;
  spec.f16 = x == DType::f16;
  GemmConfig cfg = choose_gemm_config(spec, target);
  const Node& w = lowered.node(n.inputs[1]);
  if (w.op != Op::dequantize) return cfg;
  // A quantized W: the kernels read x's rows rounded to 8 bits (f32, or 8-bit integers with
  // int8_dot), whatever x's dtype (module_quantized.cpp).
  cfg = choose_gemm_config(GemmSpec{}, target);
  if (!dequantize_in_linear(lowered, n.inputs[1])) {  // W written out in f32
    cfg.round_group = static_cast<int>(w.offset);
    return cfg;
  }
  cfg.quant_group = static_cast<int>(lowered.node(n.inputs[1]).offset);
  cfg.q4 = dequantizes_q4(lowered.node(n.inputs[1]));
  static_assert(kQuantGroupQuantum % 4 == 0, "the int8 panels hold words of four entries of a group");
  cfg.int8_dot = int8_dot_products(target, cfg.lanes);
  if (cfg.int8_dot) {
    const KernelTuning t = kernel_tuning(target, cfg.lanes);
    cfg.rows = t.gemm_int8_rows;
    cfg.small_rows = 0;
    cfg.col_vectors = 2;
    cfg.k_block = std::max(1, t.gemm_int8_k_block / cfg.quant_group) * cfg.quant_group;
  }
  return cfg;
}

ModulePlan plan_module(const Graph& g, const Bindings& fixed, const HostTarget& target) {
  const int count = static_cast<int>(g.size());
  ModulePlan plan;
  for (const auto& s : graph_symbols(g)) {
    if (auto it = fixed.find(s); it != fixed.end())
      plan.fixed[s] = it->second;
    else
      plan.dynamic.push_back(s);
  }
  plan.alloc.assign(static_cast<std::size_t>(count), -1);
  plan.output_arg.assign(static_cast<std::size_t>(count), -1);

  // Outputs computed in place: a node that is neither a leaf nor a view, output under one name.
  std::size_t arg = 0;
  for (const auto& n : g.nodes()) arg += is_array_leaf(n);
  for (const auto& o : g.outputs()) {
    const Node& n = g.node(o.node);
    auto& slot = plan.output_arg[static_cast<std::size_t>(o.node)];
    if (n.op != Op::input && n.op != Op::param && !is_view(n.op) && slot < 0) slot = static_cast<int>(arg);
    ++arg;
  }

  plan_cache_reads(g, plan);
  std::vector<int> end = memory_ends(g);
  if (!plan.kv_alias.empty()) {  // an aliased slice keeps what it reads alive, as a view does
    const std::vector<int> root = memory_roots(g);
    for (int s : plan.kv_alias) {
      const int r = root[static_cast<std::size_t>(g.node(s).inputs[0])];
      auto& e = end[static_cast<std::size_t>(r)];
      e = std::max(e, end[static_cast<std::size_t>(s)]);
      for (std::size_t k = 0; k < end.size(); ++k)
        if (root[k] == r) end[k] = e;
    }
  }
  auto add = [&](ModulePlan::Block kind, int node, int start, int stop) {
    plan.allocs.push_back({kind, node, start, stop, 0});
    return static_cast<int>(plan.allocs.size() - 1);
  };
  for (int id = 0; id < count; ++id) {
    const Node& n = g.node(id);
    const auto i = static_cast<std::size_t>(id);
    if (n.op == Op::fused_attention) {
      AttentionCall call = describe_attention(g, id, plan.fixed);
      for (std::size_t k = 0; k < call.tensor_inputs.size(); ++k) {  // integer inputs read as integers
        const int t = n.inputs[static_cast<std::size_t>(call.tensor_inputs[k])];
        if (integer_array(g, t)) call.spec.tensors[k].dtype = g.node(t).dtype;
      }
      plan.attention.emplace(id, std::move(call));
    }
    if (n.op == Op::fused_attention_backward) {
      ModulePlan::Backward bw;
      bw.call = describe_attention(g, id, plan.fixed);
      if (const std::string why = backward_unsupported(bw.call.spec); !why.empty())
        throw std::invalid_argument("codegen: the fused attention backward does not cover " + why);
      for (std::size_t k = 0; k < 6; ++k) {  // q, k, v, out, d_out as the spec stores them; lse f32
        const DType want = k < 5 ? bw.call.spec.storage : DType::f32;
        if (storage_dtype(g.node(n.inputs[k]).dtype) != want)
          throw std::invalid_argument("codegen: the fused attention backward reads input " + std::to_string(k) +
                                      " as " + std::string(dtype_name(want)) + ", not " +
                                      std::string(dtype_name(g.node(n.inputs[k]).dtype)));
      }
      bw.config = choose_backward_config(bw.call.spec, target);
      bw.delta = add(ModulePlan::Block::backward_delta, id, id, id);
      bw.partial = add(ModulePlan::Block::backward_dq, id, id, id);
      for (const auto& t : bw.call.spec.tensor_grads)  // sized by the first attention_dtensor of the tensor
        bw.tensor_partial.push_back(
            add(ModulePlan::Block::backward_dtensor, tensor_grad_nodes(g, id, t.tensor).at(0), id, id));
      plan.backward.emplace(id, std::move(bw));
    }
    if (n.op == Op::input || n.op == Op::param || shares_input_memory(g, id) || plan.kv_alias.count(id)) continue;
    // attention_weights and attention_lse are written by their fused node, attention_dk and
    // attention_dv by their fused backward: alive from there.
    const bool side = n.op == Op::attention_weights || n.op == Op::attention_lse;
    const bool grads = n.op == Op::attention_dk || n.op == Op::attention_dv || n.op == Op::attention_dtensor;
    auto& side_map = n.op == Op::attention_lse ? plan.lse : plan.weights;
    if (plan.output_arg[i] < 0) {
      plan.alloc[i] = add(ModulePlan::Block::value, id, side || grads ? n.inputs[0] : id, end[i]);
      if (side) side_map[n.inputs[0]] = plan.alloc[i];
    } else if (side) {
      side_map[n.inputs[0]] = -1;  // written straight into its output argument
    }
    if (n.op != Op::fused_attention && util::linear_on_last_axis(g, n)) {
      plan.gemm[id] = {add(ModulePlan::Block::gemm_panels, id, id, id), add(ModulePlan::Block::gemm_bias, id, id, id)};
      plan.gemm_config[id] = linear_gemm_config(g, id, target);
      // A quantized weight is not: its panels would hold it unquantized, four times its bytes; a
      // call with more rows than the GEMV takes packs them from q and the scales, into the arena.
      auto param = [&](std::size_t k) { return k >= n.inputs.size() || g.node(n.inputs[k]).op == Op::param; };
      if (param(1) && param(2)) plan.prepared.push_back(id);
    }
  }
  // dK or dV a fused backward writes that no node takes still need somewhere to go.
  for (auto& [id, bw] : plan.backward) {
    auto taken = [&, node = id](Op op) {
      return std::any_of(g.nodes().begin(), g.nodes().end(),
                         [&](const Node& c) { return c.op == op && c.inputs.size() == 1 && c.inputs[0] == node; });
    };
    if (!taken(Op::attention_dk)) bw.dk = add(ModulePlan::Block::backward_dk, id, id, id);
    if (!taken(Op::attention_dv)) bw.dv = add(ModulePlan::Block::backward_dv, id, id, id);
  }
  // Weights or a log-sum-exp a fused node writes that nothing reads still need somewhere to go.
  for (const auto& [id, call] : plan.attention) {
    if (call.spec.write_weights && !plan.weights.count(id))
      plan.weights[id] = add(ModulePlan::Block::weights, id, id, id);
    if (call.spec.write_lse && !plan.lse.count(id)) plan.lse[id] = add(ModulePlan::Block::lse, id, id, id);
    const KernelConfig config = choose_kernel_config(call.spec, target);
    if (const std::int64_t most = decode_max_queries(call.spec, config); most > 0) {
      plan.decode[id] = {choose_decode_config(call.spec, config), most, add(ModulePlan::Block::split_kv, id, id, id)};
    }
  }

  auto estimate = [&](const Extent& e) -> std::int64_t {
    if (auto v = e.resolve(plan.fixed)) return *v;
    return std::max<std::int64_t>(0, kTypicalSize * e.num / e.den + e.plus);
  };
  std::vector<Lifetime> lives;
  for (const auto& a : plan.allocs) lives.push_back({a.start, a.end, block_bytes<std::int64_t>(g, plan, a, estimate)});
  const std::vector<int> slot = assign_slots(lives);
  for (std::size_t k = 0; k < slot.size(); ++k) {
    plan.allocs[k].slot = slot[k];
    plan.slots = std::max(plan.slots, slot[k] + 1);
  }
  return plan;
}

namespace {

std::string c_identifier(const std::string& name) {
  std::string s;
  for (char c : name) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) s = "t_" + s;
  return s;
}

}  // namespace

AotSignature module_signature(const Graph& g, const AotOptions& options, const ModulePlan& plan) {
  AotSignature sig;
  std::vector<std::string> used{options.function, options.function + "_packed", options.function + "_entry",
                                options.function + "_set_threads", options.function + "_set_parallel"};
  auto unique = [&](std::string s) {
    std::string base = s;
    for (int k = 2; std::find(used.begin(), used.end(), s) != used.end(); ++k) s = base + "_" + std::to_string(k);
    used.push_back(s);
    return s;
  };
  for (const auto& s : plan.dynamic) sig.sizes.push_back({s, unique(c_identifier(s))});
  auto argument = [&](const std::string& name, int id, bool output) {
    const Node& n = g.node(id);
    AotArgument a;
    a.name = name;
    a.c_name = unique(c_identifier(name));
    a.dtype = output ? storage_dtype(n.dtype) : cpu_storage_dtype(g, id);
    a.numel = 1;
    for (const auto& x : n.axes) {
      Extent e = x.extent;
      if (auto v = e.resolve(plan.fixed)) e = Extent::fixed(*v);
      a.axes.push_back({x.name, e});
      a.numel = a.numel >= 0 && e.is_static() ? a.numel * e.value : -1;
    }
    a.output = output;
    a.param = n.op == Op::param;
    a.integer_values = output && is_integer(n.dtype);
    sig.args.push_back(std::move(a));
  };
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    const Node& n = g.node(id);
    if (is_array_leaf(n)) argument(n.name, id, false);
  }
  for (const auto& o : g.outputs()) argument(o.name, o.node, true);
  if (plan.dynamic.empty()) {
    auto fixed = [&](const Extent& e) { return *e.resolve(plan.fixed); };
    sig.arena_bytes = static_cast<std::size_t>(arena_layout<std::int64_t>(g, plan, fixed).total);
  }
  return sig;
}

}  // namespace qkv::codegen::cpu
