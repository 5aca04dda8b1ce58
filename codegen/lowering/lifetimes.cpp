#include <qkv/codegen/lowering/lifetimes.hpp>

#include <algorithm>
#include <numeric>

#include <qkv/codegen/lowering/storage.hpp>
#include <qkv/ir/ops.hpp>

namespace qkv::codegen {

std::vector<int> last_uses(const Graph& g) {
  std::vector<int> last(g.size(), -1);
  for (int id = 0; id < static_cast<int>(g.size()); ++id)
    for (int in : g.node(id).inputs) last[static_cast<std::size_t>(in)] = id;
  for (const auto& o : g.outputs()) last[static_cast<std::size_t>(o.node)] = static_cast<int>(g.size());
  // A value its sums compute entry by entry (select.hpp's elementwise_only_summed): its inputs
  // are read where the sums run.
  for (int id = 0; id < static_cast<int>(g.size()); ++id)
    if (elementwise_only_summed(g, id))
      for (int in : g.node(id).inputs)
        last[static_cast<std::size_t>(in)] =
            std::max(last[static_cast<std::size_t>(in)], last[static_cast<std::size_t>(id)]);
  return last;
}

bool shares_input_memory(const Graph& g, int id) {
  const Op op = g.node(id).op;
  return is_view(op) || (op == Op::dequantize && dequantize_in_linear(g, id));
}

std::vector<int> memory_roots(const Graph& g) {
  std::vector<int> root(g.size());
  for (int id = 0; id < static_cast<int>(g.size()); ++id)
    root[static_cast<std::size_t>(id)] =
        shares_input_memory(g, id) ? root[static_cast<std::size_t>(g.node(id).inputs[0])] : id;
  return root;
}

std::vector<int> memory_ends(const Graph& g) {
  const std::vector<int> root = memory_roots(g);
  std::vector<int> end = last_uses(g);
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {  // a value never read dies where it is born
    auto& e = end[static_cast<std::size_t>(id)];
    e = std::max(e, id);
  }
  for (int id = static_cast<int>(g.size()); id-- > 0;) {
    const auto r = static_cast<std::size_t>(root[static_cast<std::size_t>(id)]);
    end[r] = std::max(end[r], end[static_cast<std::size_t>(id)]);
  }
  for (int id = 0; id < static_cast<int>(g.size()); ++id)
    end[static_cast<std::size_t>(id)] = end[static_cast<std::size_t>(root[static_cast<std::size_t>(id)])];
  return end;
}

std::vector<int> assign_slots(const std::vector<Lifetime>& blocks) {
  std::vector<std::size_t> order(blocks.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  // By start, ties by index: stable_sort's order, by std::sort with a total order (libstdc++-12's
  // stable_sort trips a deprecation warning in clang-19 that -Werror turns into an error).
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return blocks[x].start != blocks[y].start ? blocks[x].start < blocks[y].start : x < y;
  });
  std::vector<int> slot(blocks.size(), -1);
  std::vector<int> busy_until;           // per slot: the last node at which it is read
  std::vector<std::int64_t> slot_bytes;  // per slot: its largest block so far
  // Best fit: the smallest free slot that holds the block, else the largest free one (the least
  // growth). Taking the largest free slot for every block let small values occupy the slots of
  // large short-lived blocks (a GEMM's packed weights), which then took new slots, each as large
  // as a weight: the arena held several weights' worth of packing space.
  auto better = [&](std::size_t s, int best, std::int64_t bytes) {
    if (best < 0) return true;
    const std::int64_t have = slot_bytes[s], other = slot_bytes[static_cast<std::size_t>(best)];
    const bool fits = have >= bytes, other_fits = other >= bytes;
    if (fits != other_fits) return fits;
    return fits ? have < other : have > other;
  };
  for (std::size_t k : order) {
    const Lifetime& b = blocks[k];
    int best = -1;
    for (std::size_t s = 0; s < busy_until.size(); ++s)
      if (busy_until[s] < b.start && better(s, best, b.bytes)) best = static_cast<int>(s);
    if (best < 0) {
      best = static_cast<int>(busy_until.size());
      busy_until.push_back(0);
      slot_bytes.push_back(0);
    }
    const auto s = static_cast<std::size_t>(best);
    busy_until[s] = b.end;
    slot_bytes[s] = std::max(slot_bytes[s], b.bytes);
    slot[k] = best;
  }
  return slot;
}

BufferPlan plan_buffers(const Graph& g, const Bindings& sizes) {
  BufferPlan p;
  p.last_use = last_uses(g);
  p.slot.assign(g.size(), -1);
  const std::vector<int> root = memory_roots(g), end = memory_ends(g);
  std::vector<Lifetime> blocks;
  std::vector<int> owner;  // the node of each block
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    const Node& n = g.node(id);
    if (n.op == Op::input || n.op == Op::param || root[static_cast<std::size_t>(id)] != id) continue;
    std::size_t bytes = storage_bytes(n.dtype);
    for (const auto& a : n.axes) {
      auto v = a.extent.resolve(sizes);
      if (!v) throw ShapeError("plan_buffers: axis `" + a.name + "` (" + a.extent.str() + ") is not bound");
      bytes *= static_cast<std::size_t>(*v);
    }
    p.unshared_bytes += bytes;
    blocks.push_back({id, end[static_cast<std::size_t>(id)], static_cast<std::int64_t>(bytes)});
    owner.push_back(id);
  }
  const std::vector<int> slots = assign_slots(blocks);
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    const auto s = static_cast<std::size_t>(slots[k]);
    if (p.slot_bytes.size() <= s) p.slot_bytes.resize(s + 1, 0);
    p.slot_bytes[s] = std::max(p.slot_bytes[s], static_cast<std::size_t>(blocks[k].bytes));
    p.slot[static_cast<std::size_t>(owner[k])] = slots[k];
  }
  for (int id = 0; id < static_cast<int>(g.size()); ++id)  // a view (or alike) lives in its root's slot
    if (root[static_cast<std::size_t>(id)] != id)
      p.slot[static_cast<std::size_t>(id)] = p.slot[static_cast<std::size_t>(root[static_cast<std::size_t>(id)])];
  for (std::size_t b : p.slot_bytes) p.peak_bytes += b;
  return p;
}

}  // namespace qkv::codegen
