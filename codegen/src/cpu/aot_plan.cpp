// The AOT compiler's plan (aot_module.hpp): every value's size, the arena blocks and their
// offsets (first fit over lifetimes, a view extending its root's), and the C signature. No LLVM.
#include <algorithm>
#include <cctype>
#include <stdexcept>
#include <string>

#include <qkv/codegen/cpu/fused_call.hpp>
#include <qkv/codegen/passes/buffer_plan.hpp>

#include "../graph_util.hpp"
#include "aot_module.hpp"
#include "gemm_kernel.hpp"

namespace qkv::codegen::cpu {

using namespace util;  // graph_util.hpp: numel, element_bytes, is_view, Shape

AotPlan plan_aot(const Graph& g, const Bindings& sizes, const HostTarget& target) {
  const int count = static_cast<int>(g.size());
  AotPlan plan;
  plan.shape.resize(static_cast<std::size_t>(count));
  plan.alloc.assign(static_cast<std::size_t>(count), -1);
  for (int id = 0; id < count; ++id) {
    for (const auto& ax : g.node(id).axes) {
      const auto v = ax.extent.resolve(sizes);
      if (!v) throw ShapeError("aot: `" + ax.name + "` (" + ax.extent.str() + ") is not bound; give its size");
      plan.shape[static_cast<std::size_t>(id)].push_back(*v);
    }
  }

  // A value stays alive until the last use of any view of it.
  const std::vector<int> last = last_uses(g);
  std::vector<int> root(static_cast<std::size_t>(count)), end(static_cast<std::size_t>(count));
  for (int id = 0; id < count; ++id) {
    const Node& n = g.node(id);
    root[static_cast<std::size_t>(id)] = is_view(n.op) ? root[static_cast<std::size_t>(n.inputs[0])] : id;
    end[static_cast<std::size_t>(id)] = last[static_cast<std::size_t>(id)];
  }
  for (int id = count; id-- > 0;) {
    const auto r = static_cast<std::size_t>(root[static_cast<std::size_t>(id)]);
    end[r] = std::max(end[r], end[static_cast<std::size_t>(id)]);
  }

  auto add = [&](std::size_t bytes, int start, int stop) {
    plan.allocs.push_back({bytes, 0, start, stop});
    return static_cast<int>(plan.allocs.size() - 1);
  };
  const GemmConfig gemm = choose_gemm_config(GemmSpec{}, target);
  for (int id = 0; id < count; ++id) {
    const Node& n = g.node(id);
    const auto i = static_cast<std::size_t>(id);
    if (n.op == Op::input || n.op == Op::param || is_view(n.op)) continue;
    const std::size_t bytes = static_cast<std::size_t>(numel(plan.shape[i])) * element_bytes(n.dtype);
    if (n.op == Op::attention_weights) {  // written by its fused node: alive from there
      plan.alloc[i] = add(bytes, n.inputs[0], end[i]);
      plan.weights[n.inputs[0]] = plan.alloc[i];
      continue;
    }
    plan.alloc[i] = add(bytes, id, end[i]);
    if (n.op == Op::fused_attention) {
      const FusedAttentionCall call = describe_fused_attention(g, id, sizes);
      if (!call.bias_terms.empty()) plan.bias[id] = add(static_cast<std::size_t>(call.len_q * call.len_k) * 4, id, id);
    } else if (util::linear_on_last_axis(g, n)) {
      const Shape& w = plan.shape[static_cast<std::size_t>(n.inputs[1])];
      const std::int64_t nr = gemm.cols(), panels = (w[0] + nr - 1) / nr;
      plan.gemm[id] = {add(static_cast<std::size_t>(panels * nr * w[1]) * 4, id, id),
                       add(static_cast<std::size_t>(panels * nr) * 4, id, id)};
    }
  }
  // Weights a fused node writes that nothing reads still need somewhere to go.
  for (int id = 0; id < count; ++id) {
    const Node& n = g.node(id);
    if (n.op == Op::fused_attention && n.attention->write_weights && !plan.weights.count(id)) {
      const FusedAttentionCall call = describe_fused_attention(g, id, sizes);
      plan.weights[id] = add(static_cast<std::size_t>(call.batch * call.spec.hq * call.len_q * call.len_k) * 4, id, id);
    }
  }

  // First fit, in order of birth: the lowest 64-byte aligned offset that overlaps no block alive
  // at the same time.
  std::vector<int> order(plan.allocs.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(k);
  std::sort(order.begin(), order.end(), [&](int x, int y) {
    const int sx = plan.allocs[static_cast<std::size_t>(x)].start, sy = plan.allocs[static_cast<std::size_t>(y)].start;
    return sx != sy ? sx < sy : x < y;
  });
  std::vector<int> placed;
  for (int k : order) {
    AotPlan::Alloc& a = plan.allocs[static_cast<std::size_t>(k)];
    std::vector<std::pair<std::size_t, std::size_t>> busy;  // [offset, offset + bytes) of live blocks
    for (int p : placed) {
      const AotPlan::Alloc& o = plan.allocs[static_cast<std::size_t>(p)];
      if (o.start <= a.end && a.start <= o.end) busy.emplace_back(o.offset, o.offset + o.bytes);
    }
    std::sort(busy.begin(), busy.end());
    std::size_t offset = 0;
    for (const auto& [lo, hi] : busy) {
      if (offset + a.bytes <= lo) break;
      offset = std::max(offset, (hi + 63) / 64 * 64);
    }
    a.offset = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + a.bytes);
    placed.push_back(k);
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

AotSignature aot_signature_of(const Graph& g, const Bindings& sizes, const AotOptions& options, const AotPlan& plan) {
  (void)sizes;
  AotSignature sig;
  sig.arena_bytes = plan.arena_bytes;
  std::vector<std::string> used{options.function, options.function + "_packed"};
  auto unique = [&](std::string s) {
    std::string base = s;
    for (int k = 2; std::find(used.begin(), used.end(), s) != used.end(); ++k) s = base + "_" + std::to_string(k);
    used.push_back(s);
    return s;
  };
  auto argument = [&](const std::string& name, int id, bool output) {
    const Node& n = g.node(id);
    AotArgument a;
    a.name = name;
    a.c_name = unique(c_identifier(name));
    a.dtype = n.dtype == DType::boolean ? DType::boolean : DType::f32;
    if (n.dtype != DType::boolean && n.dtype != DType::f32)
      throw std::invalid_argument("aot: `" + name + "` is " + std::string(dtype_name(n.dtype)) +
                                  "; compiled functions take f32 and bool tensors only");
    const auto& shape = plan.shape[static_cast<std::size_t>(id)];
    for (std::size_t k = 0; k < n.axes.size(); ++k) a.axes.push_back({n.axes[k].name, Extent::fixed(shape[k])});
    a.numel = numel(shape);
    a.output = output;
    sig.args.push_back(std::move(a));
  };
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    const Node& n = g.node(id);
    if (n.op == Op::input || n.op == Op::param) argument(n.name, id, false);
  }
  for (const auto& o : g.outputs()) argument(o.name, o.node, true);
  return sig;
}

}  // namespace qkv::codegen::cpu
