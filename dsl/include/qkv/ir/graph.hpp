// qkv/ir/graph.hpp — the Graph IR: the one contract between the DSL, the reference interpreter
// and the code generators.
//
// A Graph is plain data: a list of nodes in topological order (every input of a node precedes
// it), each with its op, the ids of its inputs, its output's named axes with extents, its dtype
// and the op's attributes. It prints as a shape table, hashes (codegen caches on it) and
// compares. Deferred shape checks (those that involve a dynamic extent) are stored with the
// graph as constraints and evaluated by bind().
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <qkv/ir/dtype.hpp>
#include <qkv/ir/extent.hpp>
#include <qkv/ir/hash.hpp>
#include <qkv/ir/mod_expr.hpp>
#include <qkv/ir/ops.hpp>

namespace qkv {

struct Axis {
  std::string name;
  Extent extent;
  friend bool operator==(const Axis&, const Axis&) = default;
};

enum class MaskKind : std::uint8_t { keep, key_padding, attention };

/// What a fused attention node computes, in terms of the axes of its inputs (made by the
/// fuse-attention pass, never by the DSL):
///   out = dropout(softmax_key(mod(scale * contract_dk(q, k)))) contracted with v over key
/// q has axes batch ++ heads ++ group ++ [query, dk], k has batch ++ heads ++ [key, dk], v has
/// batch ++ heads ++ [key, dv] (each in some order the executor lays out); `group` axes are the
/// query heads that share a key/value head (GQA). Every score and mask modification — biases,
/// keep-masks, causal, score_mod nodes — is folded into `mod`, an expression over the score
/// axes (batch ++ heads ++ group ++ [query, key]) whose loads read the node's inputs 3...
struct AttentionAttrs {
  std::vector<std::string> batch, heads, group;
  std::string query, key, dk, dv;
  double scale = 1.0;
  std::optional<Extent> scale_dim;  // set: multiply by 1/sqrt(dim) instead of `scale`
  double dropout = 0.0;
  std::uint64_t seed = 0;
  bool write_weights = false;
  bool write_lse = false;  // also write log-sum-exp of the modified scores per row (attention_lse)
  ModExpr mod;             // applied after the scale: out = keep ? score' : −inf (mod_expr.hpp)
  friend bool operator==(const AttentionAttrs&, const AttentionAttrs&) = default;
};

/// How a rope node turns positions into angles (Hugging Face Llama's rotary embedding): for
/// the D features, pair i < D/2 rotates by position · inv_freq[i], inv_freq[i] = theta^(−2i/D),
/// optionally rescaled by Llama 3's rule (rope_inv_freq in qkv/ir/rope.hpp, the one home of it).
struct RopeAttrs {
  double theta = 10000.0;
  bool llama3 = false;  // rope_scaling {"rope_type": "llama3", ...}
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_positions = 8192.0;
  friend bool operator==(const RopeAttrs&, const RopeAttrs&) = default;
};

struct Node {
  Op op = Op::input;
  std::string name;         // inputs/params: the name to feed; others: optional label
  std::vector<int> inputs;  // node ids, all smaller than this node's id
  std::vector<Axis> axes;   // the output's axes, in layout order (last = contiguous)
  DType dtype = DType::f32;
  // attributes (meaning per op in the enum above)
  std::vector<std::string> attr_axes;
  double scalar = 0.0;
  std::uint64_t seed = 0;
  CausalAlign align = CausalAlign::top_left;
  MaskKind mask = MaskKind::keep;
  std::int64_t offset = 0;    // slice: which part (in units of the output extent)
  std::optional<Extent> dim;  // scale: divide by sqrt(dim); input: the size it feeds; update_slice, slice: start
  std::optional<AttentionAttrs> attention;  // fused_attention only
  std::optional<ModExpr> mod;               // score_mod only
  std::optional<RopeAttrs> rope;            // rope only

  friend bool operator==(const Node&, const Node&) = default;
};

/// An input fed by value as a run-time size (an integer scalar whose value binds `dim`): the
/// compiled code takes it among its sizes, not as an array.
inline bool is_size_input(const Node& n) { return n.op == Op::input && n.dim.has_value(); }
/// An input or parameter the compiled code takes as an array.
inline bool is_array_leaf(const Node& n) { return (n.op == Op::input && !n.dim) || n.op == Op::param; }

/// A check the DSL could not decide at compile time because an extent is dynamic. `message`
/// is the compile-time diagnostic with `{a}` and `{b}` standing for the two sizes.
struct Constraint {
  enum class Kind : std::uint8_t { equal, divisible, at_most } kind = Kind::equal;
  Extent a, b;  // equal: a == b; divisible: a % b == 0; at_most: a <= b
  std::string message;
  friend bool operator==(const Constraint&, const Constraint&) = default;
};

class Graph {
 public:
  /// Appends a node and returns its id.
  int add(Node n) {
    nodes_.push_back(std::move(n));
    return static_cast<int>(nodes_.size()) - 1;
  }
  /// Marks node `id` as a graph output under `name` (e.g. "out", "weights").
  void mark_output(int id, std::string name) { outputs_.push_back({id, std::move(name)}); }
  void require(Constraint c) {
    for (const auto& existing : constraints_)
      if (existing == c) return;
    constraints_.push_back(std::move(c));
  }

  struct Output {
    int node;
    std::string name;
    friend bool operator==(const Output&, const Output&) = default;
  };

  [[nodiscard]] const std::vector<Node>& nodes() const { return nodes_; }
  [[nodiscard]] const Node& node(int id) const { return nodes_.at(static_cast<std::size_t>(id)); }
  /// Node `id` to change in place (a rule that asks an existing node for more, e.g. the
  /// gradient of a fused_attention asking it to write its log-sum-exp).
  Node& mutable_node(int id) { return nodes_.at(static_cast<std::size_t>(id)); }
  [[nodiscard]] const std::vector<Output>& outputs() const { return outputs_; }
  [[nodiscard]] const std::vector<Constraint>& constraints() const { return constraints_; }
  [[nodiscard]] std::size_t size() const { return nodes_.size(); }

  /// Evaluates every deferred shape check under `b`; throws ShapeError with the check's message
  /// (sizes filled in) on the first that fails, or when a symbol the check needs is unbound.
  void check(const Bindings& b) const;

  /// The shape table: one line per node with op, inputs and output axes with sizes.
  [[nodiscard]] std::string table() const;

  /// A stable 64-bit hash of the whole graph (FNV-1a over a canonical serialisation).
  [[nodiscard]] std::uint64_t hash() const;

  friend bool operator==(const Graph&, const Graph&) = default;

 private:
  std::vector<Node> nodes_;
  std::vector<Output> outputs_;
  std::vector<Constraint> constraints_;
};

/// "[Batch?, Seq?, Key=Seq?+1, Model=16]": static sizes as numbers; a dynamic axis sized by its
/// own symbol as `Name?`, any other dynamic size as `Name=expression`.
inline std::string axes_str(const std::vector<Axis>& axes) {
  std::string s = "[";
  for (std::size_t i = 0; i < axes.size(); ++i) {
    if (i) s += ", ";
    const Extent& e = axes[i].extent;
    const bool own = e.is_dynamic() && e.symbol == axes[i].name && e.num == 1 && e.den == 1 && e.plus == 0;
    s += own ? axes[i].name + "?" : axes[i].name + "=" + e.str();
  }
  return s + "]";
}

/// The message of a deferred check with its `{a}` / `{b}` placeholders replaced.
inline std::string fill_sizes(std::string msg, const std::string& a, const std::string& b) {
  for (const auto& [key, v] : {std::pair<std::string_view, const std::string&>{"{a}", a}, {"{b}", b}}) {
    for (auto pos = msg.find(key); pos != std::string::npos; pos = msg.find(key, pos + v.size()))
      msg.replace(pos, key.size(), v);
  }
  return msg;
}

inline void Graph::check(const Bindings& b) const {
  for (const auto& c : constraints_) {
    auto a = c.a.resolve(b), d = c.b.resolve(b);
    if (!a || !d) {
      const auto& missing = !a ? c.a.symbol : c.b.symbol;
      throw ShapeError("bind: no size given for the dynamic extent '" + missing +
                       "' (needed by: " + fill_sizes(c.message, c.a.str(), c.b.str()) + ")");
    }
    bool ok = c.kind == Constraint::Kind::equal     ? *a == *d
              : c.kind == Constraint::Kind::at_most ? *a <= *d
                                                    : (*d != 0 && *a % *d == 0);
    if (!ok) throw ShapeError(fill_sizes(c.message, std::to_string(*a), std::to_string(*d)));
  }
}

inline std::string Graph::table() const {
  std::ostringstream os;
  std::vector<std::string> ops, ins;
  std::size_t w_op = 2, w_in = 6;
  for (const auto& n : nodes_) {
    std::string op(op_name(n.op));
    if (!n.name.empty()) op += " " + n.name;
    if (!n.attr_axes.empty() && n.op != Op::input && n.op != Op::param) {
      op += "<";
      for (std::size_t i = 0; i < n.attr_axes.size(); ++i) op += (i ? "," : "") + n.attr_axes[i];
      op += ">";
    }
    std::string in;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) in += (i ? ", %" : "%") + std::to_string(n.inputs[i]);
    if (in.empty()) in = "-";
    w_op = std::max(w_op, op.size());
    w_in = std::max(w_in, in.size());
    ops.push_back(std::move(op));
    ins.push_back(std::move(in));
  }
  auto pad = [](std::string s, std::size_t w) {
    s.resize(std::max(w, s.size()), ' ');
    return s;
  };
  os << pad("%", 4) << pad("op", w_op + 2) << pad("inputs", w_in + 2) << "output\n";
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    os << pad("%" + std::to_string(i), 4) << pad(ops[i], w_op + 2) << pad(ins[i], w_in + 2) << axes_str(nodes_[i].axes)
       << " " << dtype_name(nodes_[i].dtype) << "\n";
  }
  for (const auto& o : outputs_) os << "output " << o.name << " = %" << o.node << "\n";
  return os.str();
}

inline std::uint64_t Graph::hash() const {
  Fnv1a h;
  auto mix_extent = [&](const Extent& e) { h.i(e.value).str(e.symbol).i(e.num).i(e.den).i(e.plus); };
  for (const auto& n : nodes_) {
    h.i(static_cast<std::int64_t>(n.op)).str(n.name).i(static_cast<std::int64_t>(n.inputs.size()));
    for (int i : n.inputs) h.i(i);
    h.i(static_cast<std::int64_t>(n.axes.size()));
    for (const auto& a : n.axes) {
      h.str(a.name);
      mix_extent(a.extent);
    }
    h.i(static_cast<std::int64_t>(n.dtype)).i(static_cast<std::int64_t>(n.attr_axes.size()));
    for (const auto& a : n.attr_axes) h.str(a);
    h.d(n.scalar).i(static_cast<std::int64_t>(n.seed)).i(static_cast<std::int64_t>(n.align));
    h.i(static_cast<std::int64_t>(n.mask)).i(n.offset).i(n.dim.has_value());
    if (n.dim) mix_extent(*n.dim);
    h.i(n.attention.has_value());
    if (const auto& at = n.attention) {
      for (const auto* list : {&at->batch, &at->heads, &at->group}) {
        h.i(static_cast<std::int64_t>(list->size()));
        for (const auto& a : *list) h.str(a);
      }
      for (const auto* name : {&at->query, &at->key, &at->dk, &at->dv}) h.str(*name);
      h.d(at->scale).i(at->scale_dim.has_value());
      if (at->scale_dim) mix_extent(*at->scale_dim);
      h.d(at->dropout).i(static_cast<std::int64_t>(at->seed));
      h.i(at->write_weights).i(at->write_lse);
      mix_hash(h, at->mod);
    }
    h.i(n.mod.has_value());
    if (n.mod) mix_hash(h, *n.mod);
    h.i(n.rope.has_value());
    if (const auto& r = n.rope)
      h.d(r->theta).i(r->llama3).d(r->factor).d(r->low_freq_factor).d(r->high_freq_factor).d(r->original_max_positions);
  }
  for (const auto& o : outputs_) h.i(o.node).str(o.name);
  for (const auto& c : constraints_) {
    h.i(static_cast<std::int64_t>(c.kind));
    mix_extent(c.a);
    mix_extent(c.b);
    h.str(c.message);
  }
  return h.value();
}

}  // namespace qkv
