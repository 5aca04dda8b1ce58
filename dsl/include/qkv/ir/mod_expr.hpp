// qkv/ir/mod_expr.hpp — score and mask modifications as plain data: a small expression IR over
// the score of one entry and the positions of that entry along the score's axes.
//
// A `pointwise` node carries one too, as element-wise math on tensors: out(e) = nodes[score](e),
// its `score` leaf the entry of the node's first input, its loads the other inputs (keep: −1).
//
// A `score_mod` node (and a fused attention) carries one ModExpr:
//
//   score'(e) = nodes[score](e)        (−1: the score unchanged)
//   keep(e)   = nodes[keep](e)         (−1: every entry kept)
//   out(e)    = keep(e) ? score'(e) : −inf
//
// for every entry e of the scores. The nodes are in topological order (operands first) and
// typed: `number` (double in the interpreter, f32 in the kernels) or `boolean`. The leaves:
//   score                 the entry's score (after the scale)
//   index   axis          the entry's coordinate along `axis` (an integer)
//   position axis         the same, as a position: the query axis's coordinate is aligned
//                         (bottom-right: i + S − L), any other axis's is its index
//   length  axis          the extent of `axis` in this call
//   constant value
//   load    input, at...  element at[0], at[1], ... (one index per axis, each rounded toward
//                         zero and clamped into [0, extent − 1]) of the node's input `input`, a
//                         small tensor captured by the mod (bool: 0 / 1; ints: their value)
// Everything else is arithmetic (+ − · / min max neg abs exp log tanh sqrt rsqrt sigmoid erf
// pow), comparisons, logic and where(c, a, b). Booleans and numbers never mix implicitly: the DSL checks the types.
//
// Plain data, no templates beyond the evaluators: the DSL, codegen and the runtime include it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <qkv/ir/hash.hpp>

namespace qkv {

enum class CausalAlign : std::uint8_t { top_left, bottom_right };

enum class ModOp : std::uint8_t {
  score,
  index,
  position,
  length,
  constant,
  load,
  add,
  sub,
  mul,
  div,
  min,
  max,
  neg,
  abs,
  exp,
  log,
  tanh,
  sqrt,
  rsqrt,
  sigmoid,
  erf,
  pow,
  lt,
  le,
  gt,
  ge,
  eq,
  ne,
  logical_and,
  logical_or,
  logical_not,
  where,
};

inline const char* mod_op_name(ModOp op) {
  static constexpr const char* names[] = {"score", "index", "position", "length",  "constant", "load", "add", "sub",
                                          "mul",   "div",   "min",      "max",     "neg",      "abs",  "exp", "log",
                                          "tanh",  "sqrt",  "rsqrt",    "sigmoid", "erf",      "pow",  "lt",  "le",
                                          "gt",    "ge",    "eq",       "ne",      "and",      "or",   "not", "where"};
  static_assert(std::size(names) == static_cast<std::size_t>(ModOp::where) + 1, "a ModOp without a name");
  const auto k = static_cast<std::size_t>(op);
  return k < std::size(names) ? names[k] : "?";
}

/// Whether the node's value is a boolean (comparisons and logic; `where` takes its arms' type).
inline bool mod_op_is_bool(ModOp op) { return op >= ModOp::lt && op <= ModOp::logical_not; }

/// Operand count of an op (load: `at.size()` indices instead).
inline int mod_op_arity(ModOp op) {
  switch (op) {
    case ModOp::score:
    case ModOp::index:
    case ModOp::position:
    case ModOp::length:
    case ModOp::constant:
    case ModOp::load:
      return 0;
    case ModOp::neg:
    case ModOp::abs:
    case ModOp::exp:
    case ModOp::log:
    case ModOp::tanh:
    case ModOp::sqrt:
    case ModOp::rsqrt:
    case ModOp::sigmoid:
    case ModOp::erf:
    case ModOp::logical_not:
      return 1;
    case ModOp::add:
    case ModOp::sub:
    case ModOp::mul:
    case ModOp::div:
    case ModOp::min:
    case ModOp::max:
    case ModOp::pow:
    case ModOp::lt:
    case ModOp::le:
    case ModOp::gt:
    case ModOp::ge:
    case ModOp::eq:
    case ModOp::ne:
    case ModOp::logical_and:
    case ModOp::logical_or:
      return 2;
    case ModOp::where:
      return 3;
  }
  return 2;  // not an op (a corrupt expression): verify reports it
}

struct ModNode {
  ModOp op = ModOp::constant;
  int a = -1, b = -1, c = -1;  // operands: ids of earlier nodes
  std::string axis;            // index / position / length: an axis of the scores
  double value = 0.0;          // constant
  int input = -1;              // load: which input of the owning node holds the tensor
  std::vector<int> at;         // load: one index expression per axis of that tensor
  friend bool operator==(const ModNode&, const ModNode&) = default;
};

/// A node of operator `op` over the nodes a, b, c (−1: none); a constant node.
inline ModNode mod_node(ModOp op, int a = -1, int b = -1, int c = -1) {
  ModNode n;
  n.op = op;
  n.a = a;
  n.b = b;
  n.c = c;
  return n;
}
inline ModNode mod_constant(double v) {
  ModNode n;
  n.op = ModOp::constant;
  n.value = v;
  return n;
}

struct ModExpr {
  std::vector<ModNode> nodes;
  int score = -1;  // the modified score, or −1
  int keep = -1;   // the keep predicate, or −1
  /// The axes `position` aligns: the query axis and the key axis of the scores (the DSL always
  /// sets them; an expression built by hand may leave them empty when it reads no position), and
  /// how.
  std::string query, key;
  CausalAlign align = CausalAlign::top_left;

  [[nodiscard]] bool empty() const { return score < 0 && keep < 0; }
  /// Whether a position along `axis` is the coordinate shifted by S − L (the query axis,
  /// bottom-right aligned): the one rule every evaluator of `position` follows.
  [[nodiscard]] bool shifts(const std::string& axis) const {
    return axis == query && align == CausalAlign::bottom_right;
  }
  /// Appends a node and returns its id.
  int add(ModNode n) {
    nodes.push_back(std::move(n));
    return static_cast<int>(nodes.size()) - 1;
  }
  friend bool operator==(const ModExpr&, const ModExpr&) = default;
};

/// Per node, whether its value is a boolean (mod_op_is_bool, and `where` of boolean arms).
inline std::vector<bool> mod_bool_nodes(const ModExpr& e) {
  std::vector<bool> out(e.nodes.size(), false);
  for (std::size_t i = 0; i < e.nodes.size(); ++i) {
    const ModNode& n = e.nodes[i];
    out[i] = n.op == ModOp::where ? (n.b >= 0 && out[static_cast<std::size_t>(n.b)]) : mod_op_is_bool(n.op);
  }
  return out;
}

inline void mix_hash(Fnv1a& h, const ModExpr& e) {
  h.i(static_cast<std::int64_t>(e.nodes.size()));
  for (const auto& n : e.nodes) {
    h.i(static_cast<std::int64_t>(n.op)).i(n.a).i(n.b).i(n.c).str(n.axis).d(n.value).i(n.input);
    h.i(static_cast<std::int64_t>(n.at.size()));
    for (int x : n.at) h.i(x);
  }
  h.i(e.score).i(e.keep).str(e.query).str(e.key).i(static_cast<std::int64_t>(e.align));
}

/// Appends a load of input `input` at the entry's own coordinates along `axes` (an index leaf per
/// axis, by name, in that order) and returns its id: what mod_loads_in_place recognises.
template <class AxisList>
int mod_load_in_place(ModExpr& e, int input, const AxisList& axes) {
  ModNode l;
  l.op = ModOp::load;
  l.input = input;
  for (const auto& a : axes) {
    ModNode i;
    i.op = ModOp::index;
    i.axis = a.name;
    l.at.push_back(e.add(std::move(i)));
  }
  return e.add(std::move(l));
}

/// Whether every load of input `input` reads it at the entry's own coordinates along `axes` (in
/// that order): the input can be read at the entry's offset, like the first input.
template <class AxisList>
bool mod_loads_in_place(const ModExpr& e, int input, const AxisList& axes) {
  for (const ModNode& m : e.nodes) {
    if (m.op != ModOp::load || m.input != input) continue;
    if (m.at.size() != axes.size()) return false;
    for (std::size_t k = 0; k < axes.size(); ++k) {
      const ModNode& i = e.nodes[static_cast<std::size_t>(m.at[k])];
      if (i.op != ModOp::index || i.axis != axes[k].name) return false;
    }
  }
  return true;
}

/// The nodes that `root` depends on (itself included), as a mask over expr.nodes.
inline std::vector<bool> mod_reachable(const ModExpr& e, int root) {
  std::vector<bool> used(e.nodes.size(), false);
  if (root < 0) return used;
  used[static_cast<std::size_t>(root)] = true;
  for (int id = root; id >= 0; --id) {
    if (!used[static_cast<std::size_t>(id)]) continue;
    const ModNode& n = e.nodes[static_cast<std::size_t>(id)];
    for (int x : {n.a, n.b, n.c})
      if (x >= 0) used[static_cast<std::size_t>(x)] = true;
    for (int x : n.at) used[static_cast<std::size_t>(x)] = true;
  }
  return used;
}

/// Whether the value of `root` depends on the axis `axis` (through index / position, or
/// through a load indexed by something that does). `score` counts as depending on every axis.
inline bool mod_depends_on(const ModExpr& e, int root, const std::string& axis) {
  const auto used = mod_reachable(e, root);
  for (std::size_t i = 0; i < e.nodes.size(); ++i) {
    if (!used[i]) continue;
    const ModNode& n = e.nodes[i];
    if (n.op == ModOp::score) return true;
    if ((n.op == ModOp::index || n.op == ModOp::position) && n.axis == axis) return true;
    // bottom-right positions of the query axis depend on nothing more than the axis itself
  }
  return false;
}

/// The index a load reads along an axis of `extent` entries, from its computed coordinate x:
/// truncated toward zero and clamped into [0, extent − 1] (NaN: 0).
inline double mod_load_index(double x, std::int64_t extent) {
  const double t = std::trunc(x);
  return std::isnan(t) ? 0.0 : std::clamp(t, 0.0, std::max(static_cast<double>(extent - 1), 0.0));
}

/// One entry's value of every node (doubles; booleans as 0 / 1). `Env` supplies
///   double index(const std::string& axis), double length(const std::string& axis),
///   double load(int input, const std::vector<double>& at)   (indices already clamped)
///   std::int64_t extent(int input, std::size_t axis)
/// The interpreter is the reference semantics; the kernels compute the same in f32.
template <class Env>
void mod_eval(const ModExpr& e, double score, const Env& env, std::vector<double>& v) {
  v.resize(e.nodes.size());
  for (std::size_t i = 0; i < e.nodes.size(); ++i) {
    const ModNode& n = e.nodes[i];
    auto x = [&](int id) { return v[static_cast<std::size_t>(id)]; };
    double r = 0.0;
    switch (n.op) {
      case ModOp::score:
        r = score;
        break;
      case ModOp::index:
        r = env.index(n.axis);
        break;
      case ModOp::position:
        r = env.index(n.axis);
        if (e.shifts(n.axis)) r += env.length(e.key) - env.length(e.query);
        break;
      case ModOp::length:
        r = env.length(n.axis);
        break;
      case ModOp::constant:
        r = n.value;
        break;
      case ModOp::load: {
        std::vector<double> at;
        for (std::size_t k = 0; k < n.at.size(); ++k) at.push_back(mod_load_index(x(n.at[k]), env.extent(n.input, k)));
        r = env.load(n.input, at);
        break;
      }
      case ModOp::add:
        r = x(n.a) + x(n.b);
        break;
      case ModOp::sub:
        r = x(n.a) - x(n.b);
        break;
      case ModOp::mul:
        r = x(n.a) * x(n.b);
        break;
      case ModOp::div:
        r = x(n.a) / x(n.b);
        break;
      case ModOp::min:
        r = std::min(x(n.a), x(n.b));
        break;
      case ModOp::max:
        r = std::max(x(n.a), x(n.b));
        break;
      case ModOp::neg:
        r = -x(n.a);
        break;
      case ModOp::abs:
        r = std::fabs(x(n.a));
        break;
      case ModOp::exp:
        r = std::exp(x(n.a));
        break;
      case ModOp::log:
        r = std::log(x(n.a));
        break;
      case ModOp::tanh:
        r = std::tanh(x(n.a));
        break;
      case ModOp::sqrt:
        r = std::sqrt(x(n.a));
        break;
      case ModOp::rsqrt:
        r = 1.0 / std::sqrt(x(n.a));
        break;
      case ModOp::sigmoid:
        r = 1.0 / (1.0 + std::exp(-x(n.a)));
        break;
      case ModOp::erf:
        r = std::erf(x(n.a));
        break;
      case ModOp::pow:
        r = std::pow(x(n.a), x(n.b));
        break;
      case ModOp::lt:
        r = x(n.a) < x(n.b);
        break;
      case ModOp::le:
        r = x(n.a) <= x(n.b);
        break;
      case ModOp::gt:
        r = x(n.a) > x(n.b);
        break;
      case ModOp::ge:
        r = x(n.a) >= x(n.b);
        break;
      case ModOp::eq:
        r = x(n.a) == x(n.b);
        break;
      case ModOp::ne:
        r = x(n.a) != x(n.b);
        break;
      case ModOp::logical_and:
        r = (x(n.a) != 0.0) && (x(n.b) != 0.0);
        break;
      case ModOp::logical_or:
        r = (x(n.a) != 0.0) || (x(n.b) != 0.0);
        break;
      case ModOp::logical_not:
        r = x(n.a) == 0.0;
        break;
      case ModOp::where:
        r = x(n.a) != 0.0 ? x(n.b) : x(n.c);
        break;
    }
    v[i] = r;
  }
}

/// Assembles an expression term by term, as the fuse pass (from masked / biased / causal /
/// score_mod nodes) and the kernel (from its shorthand flags) do: score terms rewrite the
/// current score, keep terms are and-ed. finish() leaves `score` at −1 when no term changed it.
class ModBuilder {
 public:
  ModBuilder() : score_(leaf(ModOp::score)), leaf_(score_) {}

  int leaf(ModOp op, std::string axis = {}) {
    ModNode n;
    n.op = op;
    n.axis = std::move(axis);
    return e_.add(std::move(n));
  }
  int op(ModOp op, int a, int b = -1) {
    ModNode n;
    n.op = op;
    n.a = a;
    n.b = b;
    return e_.add(std::move(n));
  }
  int constant(double v) {
    ModNode n;
    n.op = ModOp::constant;
    n.value = v;
    return e_.add(std::move(n));
  }
  int load(int input, std::vector<int> at) {
    ModNode n;
    n.op = ModOp::load;
    n.input = input;
    n.at = std::move(at);
    return e_.add(std::move(n));
  }
  /// A load whose indices are the coordinates along the named axes.
  int load_by_axes(int input, const std::vector<std::string>& axes) {
    std::vector<int> at;
    for (const auto& a : axes) at.push_back(leaf(ModOp::index, a));
    return load(input, std::move(at));
  }

  [[nodiscard]] int score() const { return score_; }
  [[nodiscard]] bool masked() const { return keep_ >= 0; }
  void add_to_score(int x) { score_ = op(ModOp::add, score_, x); }
  /// A term that computes the new score itself (from score()).
  void replace_score(int x) { score_ = x; }
  void keep_also(int k) { keep_ = keep_ < 0 ? k : op(ModOp::logical_and, keep_, k); }
  /// keep ∧= (x != 0): a keep-mask tensor's value.
  void keep_nonzero(int x) { keep_also(op(ModOp::ne, x, constant(0.0))); }
  /// keep ∧= key <= query (+ S − L bottom-right), written with indices so that the expression's
  /// own alignment (of `position` leaves) stays free for other terms.
  void keep_causal(const std::string& query, const std::string& key, CausalAlign align) {
    int row = leaf(ModOp::index, query);
    if (align == CausalAlign::bottom_right)
      row = op(ModOp::add, row, op(ModOp::sub, leaf(ModOp::length, key), leaf(ModOp::length, query)));
    keep_also(op(ModOp::le, leaf(ModOp::index, key), row));
  }
  /// Appends `from`: its score leaf reads the current score, each load's input becomes
  /// input_of(input); then its score and keep roots apply. Alignment is the caller's to merge.
  template <class F>
  void splice(const ModExpr& from, F input_of) {
    std::vector<int> id(from.nodes.size());
    for (std::size_t i = 0; i < from.nodes.size(); ++i) {
      ModNode n = from.nodes[i];
      if (n.op == ModOp::score) {
        id[i] = score_;
        continue;
      }
      for (int* x : {&n.a, &n.b, &n.c})
        if (*x >= 0) *x = id[static_cast<std::size_t>(*x)];
      for (int& x : n.at) x = id[static_cast<std::size_t>(x)];
      if (n.op == ModOp::load) n.input = input_of(n.input);
      id[i] = e_.add(std::move(n));
    }
    if (from.score >= 0) score_ = id[static_cast<std::size_t>(from.score)];
    if (from.keep >= 0) keep_also(id[static_cast<std::size_t>(from.keep)]);
  }

  /// The aligning axes (ModExpr::query / key / align) of the result.
  ModExpr& expr() { return e_; }
  ModExpr finish() {
    e_.score = score_ == leaf_ ? -1 : score_;
    e_.keep = keep_;
    return std::move(e_);
  }

 private:
  ModExpr e_;
  int score_, leaf_;
  int keep_ = -1;
};

// ------------------------------------------------------------------------------------------------
// Intervals: what a block of entries can make of an expression (block skipping).

/// A closed interval of numbers, or of a boolean: lo/hi ∈ {0, 1} (lo = 1: always true; hi = 0:
/// always false). NaN bounds mean "unknown" and never decide anything.
struct ModInterval {
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  [[nodiscard]] bool always() const { return lo == 1.0; }
  [[nodiscard]] bool never() const { return hi == 0.0; }
};

/// Bounds of every node over a block of entries. `Env` supplies
///   ModInterval index(const std::string& axis)    (the block's range of that axis's coordinate)
///   double length(const std::string& axis)
///   ModInterval load(int input, const ModNode& n, const std::vector<ModInterval>& at)
/// (the load's index intervals; an Env that cannot bound it returns the default, unbounded).
/// The score is unbounded. Sound: every entry's value lies in its node's interval.
template <class Env>
void mod_bounds(const ModExpr& e, const Env& env, std::vector<ModInterval>& v) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  v.assign(e.nodes.size(), ModInterval{});
  const std::vector<bool> is_bool = mod_bool_nodes(e);
  auto lo_of = [](double a, double b, double c, double d) {
    if (std::isnan(a) || std::isnan(b) || std::isnan(c) || std::isnan(d)) return std::nan("");
    return std::min(std::min(a, b), std::min(c, d));
  };
  auto hi_of = [](double a, double b, double c, double d) {
    if (std::isnan(a) || std::isnan(b) || std::isnan(c) || std::isnan(d)) return std::nan("");
    return std::max(std::max(a, b), std::max(c, d));
  };
  auto tri = [](bool always, bool never) { return ModInterval{always ? 1.0 : 0.0, never ? 0.0 : 1.0}; };
  for (std::size_t i = 0; i < e.nodes.size(); ++i) {
    const ModNode& n = e.nodes[i];
    auto x = [&](int id) { return v[static_cast<std::size_t>(id)]; };
    ModInterval r;
    switch (n.op) {
      case ModOp::score:
        break;
      case ModOp::index:
        r = env.index(n.axis);
        break;
      case ModOp::position:
        r = env.index(n.axis);
        if (e.shifts(n.axis)) {
          const double off = env.length(e.key) - env.length(e.query);
          r = {r.lo + off, r.hi + off};
        }
        break;
      case ModOp::length:
        r = {env.length(n.axis), env.length(n.axis)};
        break;
      case ModOp::constant:
        r = {n.value, n.value};
        break;
      case ModOp::load: {
        std::vector<ModInterval> at;
        for (int k : n.at) at.push_back(x(k));
        r = env.load(n.input, n, at);
        break;
      }
      case ModOp::add:
        r = {x(n.a).lo + x(n.b).lo, x(n.a).hi + x(n.b).hi};
        break;
      case ModOp::sub:
        r = {x(n.a).lo - x(n.b).hi, x(n.a).hi - x(n.b).lo};
        break;
      case ModOp::mul: {
        const ModInterval a = x(n.a), b = x(n.b);
        r = {lo_of(a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi),
             hi_of(a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi)};
        break;
      }
      case ModOp::div:
        break;  // unbounded (division by an interval holding 0)
      case ModOp::min:
        r = {lo_of(x(n.a).lo, x(n.b).lo, inf, inf), lo_of(x(n.a).hi, x(n.b).hi, inf, inf)};
        break;
      case ModOp::max:
        r = {hi_of(x(n.a).lo, x(n.b).lo, -inf, -inf), hi_of(x(n.a).hi, x(n.b).hi, -inf, -inf)};
        break;
      case ModOp::neg:
        r = {-x(n.a).hi, -x(n.a).lo};
        break;
      case ModOp::abs: {
        const ModInterval a = x(n.a);
        if (a.lo >= 0)
          r = a;
        else if (a.hi <= 0)
          r = {-a.hi, -a.lo};
        else if (a.lo < 0 && a.hi > 0)
          r = {0.0, std::max(-a.lo, a.hi)};
        else
          r = {std::nan(""), std::nan("")};
        break;
      }
      case ModOp::exp:
        r = {std::exp(x(n.a).lo), std::exp(x(n.a).hi)};
        break;
      case ModOp::log:
        r = x(n.a).lo >= 0 ? ModInterval{std::log(x(n.a).lo), std::log(x(n.a).hi)} : ModInterval{};
        break;
      case ModOp::tanh:
        r = {std::tanh(x(n.a).lo), std::tanh(x(n.a).hi)};
        break;
      case ModOp::sqrt:
        r = x(n.a).lo >= 0 ? ModInterval{std::sqrt(x(n.a).lo), std::sqrt(x(n.a).hi)} : ModInterval{};
        break;
      case ModOp::rsqrt:
        r = x(n.a).lo > 0 ? ModInterval{1.0 / std::sqrt(x(n.a).hi), 1.0 / std::sqrt(x(n.a).lo)} : ModInterval{};
        break;
      case ModOp::sigmoid:
        r = {1.0 / (1.0 + std::exp(-x(n.a).lo)), 1.0 / (1.0 + std::exp(-x(n.a).hi))};
        break;
      case ModOp::erf:
        r = {std::erf(x(n.a).lo), std::erf(x(n.a).hi)};
        break;
      case ModOp::pow:
        break;  // unbounded
      // Comparisons: decided only when the intervals separate (NaN bounds compare false).
      case ModOp::lt:
        r = tri(x(n.a).hi < x(n.b).lo, x(n.a).lo >= x(n.b).hi);
        break;
      case ModOp::le:
        r = tri(x(n.a).hi <= x(n.b).lo, x(n.a).lo > x(n.b).hi);
        break;
      case ModOp::gt:
        r = tri(x(n.a).lo > x(n.b).hi, x(n.a).hi <= x(n.b).lo);
        break;
      case ModOp::ge:
        r = tri(x(n.a).lo >= x(n.b).hi, x(n.a).hi < x(n.b).lo);
        break;
      case ModOp::eq:
        r = tri(x(n.a).lo == x(n.a).hi && x(n.b).lo == x(n.b).hi && x(n.a).lo == x(n.b).lo,
                x(n.a).hi < x(n.b).lo || x(n.b).hi < x(n.a).lo);
        break;
      case ModOp::ne:
        r = tri(x(n.a).hi < x(n.b).lo || x(n.b).hi < x(n.a).lo,
                x(n.a).lo == x(n.a).hi && x(n.b).lo == x(n.b).hi && x(n.a).lo == x(n.b).lo);
        break;
      case ModOp::logical_and:
        r = tri(x(n.a).always() && x(n.b).always(), x(n.a).never() || x(n.b).never());
        break;
      case ModOp::logical_or:
        r = tri(x(n.a).always() || x(n.b).always(), x(n.a).never() && x(n.b).never());
        break;
      case ModOp::logical_not:
        r = tri(x(n.a).never(), x(n.a).always());
        break;
      case ModOp::where: {
        const ModInterval c = x(n.a), a = x(n.b), b = x(n.c);
        if (c.always())
          r = a;
        else if (c.never())
          r = b;
        else
          r = {lo_of(a.lo, b.lo, inf, inf), hi_of(a.hi, b.hi, -inf, -inf)};
        break;
      }
    }
    // A NaN bound (inf − inf, 0 · inf) poisons the interval: unknown.
    if (std::isnan(r.lo) || std::isnan(r.hi)) r = is_bool[i] ? ModInterval{0.0, 1.0} : ModInterval{};
    v[i] = r;
  }
}

/// How a block of entries stands under the keep predicate.
enum class BlockClass : std::uint8_t { empty, full, partial };

template <class Env>
BlockClass mod_classify(const ModExpr& e, const Env& env) {
  if (e.keep < 0) return BlockClass::full;
  std::vector<ModInterval> v;
  mod_bounds(e, env, v);
  const ModInterval k = v[static_cast<std::size_t>(e.keep)];
  return k.never() ? BlockClass::empty : k.always() ? BlockClass::full : BlockClass::partial;
}

}  // namespace qkv
