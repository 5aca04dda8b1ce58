// codegen/passes/rewrite.hpp — the loop every graph -> graph pass is made of (private): rebuild
// the graph node by node, each node's inputs renumbered to what now stands for them, then carry
// the outputs and the deferred shape checks over.
//
//   return Rewrite(g).run([&](Rewrite& r, int id) {
//     Node n = r.remapped(id);      // node `id` with its inputs renumbered into r.out
//     ...                           // change it, add nodes before it, or drop it (return -1)
//     return r.out.add(std::move(n));
//   });
#pragma once

#include <vector>

#include <qkv/ir/graph.hpp>

namespace qkv::codegen {

class Rewrite {
 public:
  explicit Rewrite(const Graph& g) : g_(g), map_(g.size(), -1) {}

  Graph out;

  /// What stands for node `old` of the source in `out` (-1: dropped, or not visited yet).
  [[nodiscard]] int operator[](int old) const { return map_[static_cast<std::size_t>(old)]; }
  /// Makes `now` stand for node `old` (for a node visited earlier whose value another node takes over).
  void set(int old, int now) { map_[static_cast<std::size_t>(old)] = now; }
  /// Node `id` of the source with its inputs renumbered.
  [[nodiscard]] Node remapped(int id) const {
    Node n = g_.node(id);
    for (int& in : n.inputs) in = (*this)[in];
    return n;
  }

  /// step(*this, id) for every node in order returns what stands for it in `out` (or -1).
  template <class Step>
  Graph run(Step&& step) {
    for (int id = 0; id < static_cast<int>(g_.size()); ++id) set(id, step(*this, id));
    for (const auto& o : g_.outputs()) out.mark_output((*this)[o.node], o.name);
    for (const auto& c : g_.constraints()) out.require(c);
    return std::move(out);
  }

 private:
  const Graph& g_;
  std::vector<int> map_;
};

}  // namespace qkv::codegen
