#include <qkv/codegen/passes/buffer_plan.hpp>

#include <stdexcept>

namespace qkv::codegen {

BufferPlan plan_buffers(const Graph& g, const Bindings& sizes) {
  BufferPlan p;
  p.last_use = last_uses(g);
  p.slot.assign(g.size(), -1);
  std::vector<bool> slot_free;
  std::vector<std::vector<int>> dies_at(g.size() + 1);
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    const Node& n = g.node(id);
    // Values whose last use was the previous node are dead now: their slots can be reused.
    if (id > 0)
      for (int dead : dies_at[static_cast<std::size_t>(id - 1)])
        slot_free[static_cast<std::size_t>(p.slot[static_cast<std::size_t>(dead)])] = true;
    if (n.op == Op::input || n.op == Op::param) continue;
    std::size_t bytes = dtype_size(n.dtype);
    for (const auto& a : n.axes) {
      auto v = a.extent.resolve(sizes);
      if (!v) throw ShapeError("plan_buffers: axis `" + a.name + "` (" + a.extent.str() + ") is not bound");
      bytes *= static_cast<std::size_t>(*v);
    }
    p.unshared_bytes += bytes;
    int best = -1;
    for (std::size_t s = 0; s < p.slot_bytes.size(); ++s)
      if (slot_free[s] && (best < 0 || p.slot_bytes[s] > p.slot_bytes[static_cast<std::size_t>(best)]))
        best = static_cast<int>(s);
    if (best < 0) {
      best = static_cast<int>(p.slot_bytes.size());
      p.slot_bytes.push_back(0);
      slot_free.push_back(false);
    }
    slot_free[static_cast<std::size_t>(best)] = false;
    p.slot_bytes[static_cast<std::size_t>(best)] = std::max(p.slot_bytes[static_cast<std::size_t>(best)], bytes);
    p.slot[static_cast<std::size_t>(id)] = best;
    const int last = p.last_use[static_cast<std::size_t>(id)];
    if (last >= 0 && last < static_cast<int>(g.size())) dies_at[static_cast<std::size_t>(last)].push_back(id);
    if (last < 0) dies_at[static_cast<std::size_t>(id)].push_back(id);  // unused: dead at once
  }
  for (std::size_t b : p.slot_bytes) p.peak_bytes += b;
  return p;
}

}  // namespace qkv::codegen
