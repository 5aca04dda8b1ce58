#include <qkv/codegen/passes/legalize_dtypes.hpp>

#include <map>
#include <utility>

#include <qkv/codegen/lowering/storage.hpp>

#include "passes/rewrite.hpp"

namespace qkv::codegen {

namespace {
bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

int add_convert(Graph& out, int id, DType to) {
  Node c;
  c.op = Op::convert;
  c.inputs = {id};
  c.axes = out.node(id).axes;
  c.dtype = to;
  return out.add(std::move(c));
}
}  // namespace

Graph legalize_dtypes(const Graph& g) {
  std::map<int, int> as_f32;  // node of `out` -> its value converted to f32 (made once)
  return Rewrite(g).run([&](Rewrite& r, int id) {
    Graph& out = r.out;
    Node n = r.remapped(id);
    if (n.op == Op::attention_weights || n.op == Op::attention_lse || n.op == Op::attention_dk ||
        n.op == Op::attention_dv || n.op == Op::attention_dtensor) {
      // They name the fused node that writes them, not its value: past its conversion.
      if (out.node(n.inputs[0]).op == Op::convert) n.inputs[0] = out.node(n.inputs[0]).inputs[0];
    } else {
      for (std::size_t k = 0; k < n.inputs.size(); ++k) {
        int& in = n.inputs[k];
        if (!is_half(out.node(in).dtype) || half_operand(g, id, k)) continue;
        auto it = as_f32.find(in);
        if (it == as_f32.end()) it = as_f32.emplace(in, add_convert(out, in, DType::f32)).first;
        in = it->second;
      }
    }
    if (!is_half(n.dtype) || half_native(g, id)) return out.add(std::move(n));
    const DType stored = n.dtype;
    n.dtype = DType::f32;
    const int computed = out.add(std::move(n));
    return add_convert(out, computed, stored);
  });
}

}  // namespace qkv::codegen
