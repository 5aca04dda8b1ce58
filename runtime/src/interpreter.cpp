// runtime/src/interpreter.cpp — the reference interpreter's driver: binds the feeds to the
// graph's extents, runs the nodes in order (the ops are in interpreter_ops.cpp), checks each
// value against the shape the IR declares, and hands the values back as arrays.
#include <qkv/runtime/interpreter.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <utility>

#include "interpreter_ops.hpp"

namespace qkv {

namespace {

using interp::internal_error;
using interp::Value;

/// "input 'x'" / "param 'out_proj.weight'"
std::string tensor_label(const Node& n) { return std::string(op_name(n.op)) + " '" + n.name + "'"; }

bool is_leaf(const Node& n) { return n.op == Op::input || n.op == Op::param; }

/// The feed's dtype must suit the node: bool arrays for boolean (mask) nodes and only there;
/// any numeric dtype for the others (converted to f32). Its bytes must fit its shape.
void check_feed_array(const Node& n, const NdArray& a) {
  const std::string who = tensor_label(n);
  if (n.dtype == DType::boolean && a.dtype != DType::boolean)
    throw ShapeError(who + " is a boolean keep-mask (true = may attend) and must be fed a bool array, got " +
                     std::string(dtype_name(a.dtype)));
  if (n.dtype != DType::boolean && a.dtype == DType::boolean)
    throw ShapeError(who + " is " + std::string(dtype_name(n.dtype)) + " but was fed a bool array");
  const std::size_t want = checked_nbytes(a.shape, a.dtype, who);
  if (a.bytes.size() != want)
    throw IoError(who + ": the array's shape " + shape_to_string(a.shape) + " needs " + std::to_string(want) +
                  " bytes of " + std::string(dtype_name(a.dtype)) + " but it holds " + std::to_string(a.bytes.size()));
}

/// For a slice at offset 0 of an update_slice along the updated axis: where the update's rows
/// end (start + their extent), once bound.
std::optional<std::int64_t> update_end(const Graph& g, const Node& n, const Bindings& b) {
  if (n.op != Op::slice || n.offset != 0 || n.dim || n.attr_axes.size() != 2 || n.inputs.size() != 1)
    return std::nullopt;
  if (n.inputs[0] < 0 || static_cast<std::size_t>(n.inputs[0]) >= g.size()) return std::nullopt;
  const Node& u = g.node(n.inputs[0]);
  if (u.op != Op::update_slice || !u.dim || u.attr_axes.size() != 2 || u.attr_axes[0] != n.attr_axes[0] ||
      u.inputs.size() != 3 || u.inputs[1] < 0 || static_cast<std::size_t>(u.inputs[1]) >= g.size())
    return std::nullopt;
  const auto start = u.dim->resolve(b);
  std::optional<std::int64_t> rows;
  for (const Axis& x : g.node(u.inputs[1]).axes)
    if (x.name == u.attr_axes[1]) rows = x.extent.resolve(b);
  if (!start || !rows) return std::nullopt;
  return *start + *rows;
}

/// A merge of two dynamic axes declares a fresh symbol (named after the merged axis) that no
/// input binds; its size is the product of the two parts, known once the inputs are bound. A
/// concat of parts sized by different symbols does the same with the sum of the parts.
void bind_merged_symbols(const Graph& g, Bindings& b) {
  for (const Node& n : g.nodes()) {
    if (const auto end = update_end(g, n, b)) {  // the written prefix of a KV cache: start + rows
      for (const Axis& out : n.axes)
        if (out.name == n.attr_axes[1] && out.extent.is_dynamic() && !out.extent.resolve(b) && out.extent.num == 1 &&
            out.extent.den == 1 && out.extent.plus == 0)
          b[out.extent.symbol] = *end;
      continue;
    }
    if (n.op == Op::concat && !n.attr_axes.empty()) {
      for (const Axis& out : n.axes) {
        if (out.name != n.attr_axes.back() || out.extent.is_static() || out.extent.resolve(b)) continue;
        std::int64_t total = 0;
        bool known = true;
        for (int in : n.inputs) {
          if (in < 0 || static_cast<std::size_t>(in) >= g.size()) return;  // reported when the node runs
          std::optional<std::int64_t> part;
          for (const Axis& x : g.node(in).axes)
            if (x.name == n.attr_axes[0]) part = x.extent.resolve(b);
          known = known && part.has_value();
          if (part) total += *part;
        }
        if (known && out.extent.num == 1 && out.extent.den == 1 && out.extent.plus == 0) b[out.extent.symbol] = total;
      }
      continue;
    }
    if (n.op != Op::merge || n.attr_axes.size() != 3 || n.inputs.size() != 1) continue;
    const int in = n.inputs[0];
    if (in < 0 || static_cast<std::size_t>(in) >= g.size()) continue;  // reported when the node runs
    for (const Axis& out : n.axes) {
      if (out.name != n.attr_axes[2] || out.extent.is_static() || out.extent.num != 1 || out.extent.den != 1) continue;
      if (b.contains(out.extent.symbol)) continue;
      std::optional<std::int64_t> pa, pb;
      for (const Axis& x : g.node(in).axes) {
        if (x.name == n.attr_axes[0]) pa = x.extent.resolve(b);
        if (x.name == n.attr_axes[1]) pb = x.extent.resolve(b);
      }
      if (pa && pb) b[out.extent.symbol] = *pa * *pb;
    }
  }
}

/// A value's shape against the extents its node declares: bound extents must match; a symbol
/// still unbound (one a merge or similar op introduced) is bound from the value.
void settle_shape(const Graph& g, int id, const Value& v, Bindings& b) {
  const Node& n = g.node(id);
  if (static_cast<std::int64_t>(v.data.size()) != interp::numel(v.shape))
    internal_error(interp::node_label(g, id) + ": computed " + std::to_string(v.data.size()) + " values for its shape");
  if (v.shape.size() != n.axes.size())
    internal_error(interp::node_label(g, id) + ": computed a value of rank " + std::to_string(v.shape.size()) +
                   " but the IR declares " + axes_str(n.axes));
  for (std::size_t k = 0; k < n.axes.size(); ++k) {
    const Extent& e = n.axes[k].extent;
    const std::int64_t got = v.shape[k];
    if (auto want = e.resolve(b)) {
      if (*want != got)
        internal_error(interp::node_label(g, id) + ": axis `" + n.axes[k].name + "` (extent " + e.str() + ") is " +
                       std::to_string(*want) + " under the bindings, but the computed value has " +
                       std::to_string(got));
    } else if (e.num != 0 && ((got - e.plus) * e.den) % e.num == 0) {
      b[e.symbol] = (got - e.plus) * e.den / e.num;
    } else {
      internal_error(interp::node_label(g, id) + ": cannot bind " + e.str() + " to " + std::to_string(got));
    }
  }
}

/// Runs the graph; one value per node.
std::vector<Value> run(const Graph& g, const Feeds& feeds, Bindings& b) {
  b = bind_extents(g, feeds);
  std::vector<Value> values;
  values.reserve(g.size());
  std::map<int, std::vector<Value>> side;  // fused node -> its values and its companions'
  for (std::size_t i = 0; i < g.size(); ++i) {
    const int id = static_cast<int>(i);
    const Node& n = g.node(id);
    Value v;
    if (is_leaf(n)) {
      if (!n.inputs.empty()) internal_error(interp::node_label(g, id) + ": a leaf has inputs");
      const NdArray& a = feeds.find(n.name)->second;  // bind_extents checked it is there
      v = Value{a.shape, a.to_f32()};
    } else {
      interp::OpArgs args{g, id, n, {}, {}, b};
      for (int in : n.inputs) {
        if (in < 0 || in >= id)
          internal_error(interp::node_label(g, id) + ": input %" + std::to_string(in) + " does not precede it");
        args.in_nodes.push_back(&g.node(in));
        args.in.push_back(&values[static_cast<std::size_t>(in)]);
      }
      // A fused node computes its companions' values too: kept here until they are read.
      if (n.op == Op::fused_attention || n.op == Op::fused_attention_backward) {
        auto all =
            n.op == Op::fused_attention ? interp::eval_fused_attention(args) : interp::eval_attention_backward(args);
        v = std::move(all[0]);
        side[id] = std::move(all);
      } else if (n.op == Op::attention_lse || n.op == Op::attention_weights || n.op == Op::attention_dk ||
                 n.op == Op::attention_dv || n.op == Op::attention_dtensor) {
        auto it = n.inputs.size() == 1 ? side.find(n.inputs[0]) : side.end();
        if (it == side.end()) internal_error(interp::node_label(g, id) + ": does not read a fused node");
        const Node& fused = g.node(n.inputs[0]);
        const bool backward = fused.op == Op::fused_attention_backward;
        const bool grad = n.op == Op::attention_dk || n.op == Op::attention_dv || n.op == Op::attention_dtensor;
        if (backward != grad) internal_error(interp::node_label(g, id) + ": reads the wrong kind of fused node");
        // A backward's values: {dq, dk, dv, the captured tensors' gradients...}.
        const std::int64_t pick = n.op == Op::attention_dk ? 1 : n.op == Op::attention_dv ? 2 : 3 + n.offset;
        if (backward && (pick < 0 || static_cast<std::size_t>(pick) >= it->second.size()))
          internal_error(interp::node_label(g, id) + ": its fused backward has no tensor " + std::to_string(n.offset));
        if (backward)
          v = it->second[static_cast<std::size_t>(pick)];
        else
          v = interp::attention_side_value(args, fused, it->second[n.op == Op::attention_lse ? 1 : 2],
                                           n.op == Op::attention_weights);
      } else {
        v = interp::eval_op(args);
      }
    }
    settle_shape(g, id, v, b);
    // A value is what its dtype can hold: f16 / bf16 values are rounded once, where they are
    // made (a feed of another dtype included), and read back exactly by every later node.
    if (n.dtype == DType::f16 || n.dtype == DType::bf16)
      for (float& x : v.data) x = round_to_dtype(x, n.dtype);
    values.push_back(std::move(v));
  }
  return values;
}

NdArray to_array(const Node& n, const Value& v) {
  if (n.dtype == DType::f16 || n.dtype == DType::bf16) return NdArray::from_f32_as(n.dtype, v.data, v.shape);
  if (n.dtype != DType::boolean) return NdArray::from_f32(v.data, v.shape);
  NdArray a = NdArray::zeros(DType::boolean, v.shape);
  for (std::size_t i = 0; i < v.data.size(); ++i)
    a.bytes[i] = std::byte{v.data[i] != 0.0f ? std::uint8_t{1} : std::uint8_t{0}};
  return a;
}

}  // namespace

Bindings bind_extents(const Graph& g, const Feeds& feeds) {
  Bindings b;
  std::map<std::string, std::string, std::less<>> bound_by;  // symbol -> the tensor that bound it
  struct Derived {
    const Node* node;
    std::size_t axis;
    std::int64_t size;
  };
  std::vector<Derived> derived;

  for (const Node& n : g.nodes()) {
    if (!is_leaf(n)) continue;
    const std::string who = tensor_label(n);
    auto it = feeds.find(n.name);
    if (it == feeds.end()) throw ShapeError("missing " + who + " (expected " + axes_str(n.axes) + ")");
    const NdArray& a = it->second;
    check_feed_array(n, a);
    if (n.op == Op::input && n.dim) {  // a size fed by value
      if (!is_integer(a.dtype) || !a.shape.empty())
        throw ShapeError(who + " is the size " + n.dim->symbol + " and must be fed an integer scalar, not " +
                         std::string(dtype_name(a.dtype)) + " " + shape_to_string(a.shape));
      const std::int64_t v = a.dtype == DType::i64 ? a.as<std::int64_t>()[0] : a.as<std::int32_t>()[0];
      if (v < 0)
        throw ShapeError(who + " is the size " + n.dim->symbol + " and must be >= 0, not " + std::to_string(v));
      if (auto f = b.find(n.dim->symbol); f != b.end() && f->second != v)
        throw ShapeError(who + " feeds " + n.dim->symbol + " = " + std::to_string(v) + " but '" +
                         bound_by[n.dim->symbol] + "' bound it to " + std::to_string(f->second));
      b[n.dim->symbol] = v;
      bound_by[n.dim->symbol] = n.name;
      continue;
    }
    if (a.shape.size() != n.axes.size())
      throw ShapeError(who + ": expected " + std::to_string(n.axes.size()) + " axes " + axes_str(n.axes) +
                       " but the array has shape " + shape_to_string(a.shape));
    for (std::size_t k = 0; k < n.axes.size(); ++k) {
      const Axis& ax = n.axes[k];
      const std::int64_t got = a.shape[k];
      if (ax.extent.is_static()) {
        if (got != ax.extent.value)
          throw ShapeError(who + ": axis `" + ax.name + "` is " + std::to_string(ax.extent.value) +
                           " but the array has " + std::to_string(got) + " there (shape " + shape_to_string(a.shape) +
                           ")");
      } else if (ax.extent.num == 1 && ax.extent.den == 1 && ax.extent.plus == 0) {
        const std::string& sym = ax.extent.symbol;
        if (auto f = b.find(sym); f == b.end()) {
          b[sym] = got;
          bound_by[sym] = n.name;
        } else if (f->second != got) {
          // Two inputs that each declare the axis (not one renamed from the other) are most often
          // two sequences given one name: say how to tell them apart.
          const std::string hint =
              ax.name == sym && bound_by[sym] != n.name
                  ? "; both declare `" + sym + "` with one run-time size: if they are different sequences (an " +
                        "encoder's source and a decoder's target), give one its own axis (e.g. QKV_AXIS(Mem) and " +
                        "Mem<dyn>), as the memory of CrossAttention has"
                  : "";
          throw ShapeError(who + ": axis `" + ax.name + "` (extent " + ax.extent.str() + ") is " + std::to_string(got) +
                           " but '" + bound_by[sym] + "' bound " + sym + " = " + std::to_string(f->second) + hint);
        }
      } else {
        derived.push_back({&n, k, got});
      }
    }
  }

  for (const Derived& d : derived) {
    const Axis& ax = d.node->axes[d.axis];
    const Extent& e = ax.extent;
    const std::string head =
        tensor_label(*d.node) + ": axis `" + ax.name + "` (extent " + e.str() + ") is " + std::to_string(d.size);
    auto f = b.find(e.symbol);
    if (f == b.end())
      throw ShapeError(head + ", but no input binds " + e.symbol + " by itself; feed an input with an axis of extent " +
                       e.symbol + "?");
    const std::string bound = " but '" + bound_by[e.symbol] + "' bound " + e.symbol + " = " + std::to_string(f->second);
    if ((f->second * e.num) % e.den != 0)  // `plus` shifts the size, never the divisibility
      throw ShapeError(head + bound + ", which is not divisible by " +
                       std::to_string(e.den / std::max<std::int64_t>(1, std::gcd(e.num, e.den))));
    if (const std::int64_t want = f->second * e.num / e.den + e.plus; want != d.size)
      throw ShapeError(head + bound + ", which makes it " + std::to_string(want));
  }

  bind_merged_symbols(g, b);
  g.check(b);
  return b;
}

std::vector<NdArray> interpret_all(const Graph& g, const Feeds& feeds, Bindings* bindings_out) {
  Bindings b;
  const std::vector<Value> values = run(g, feeds, b);
  std::vector<NdArray> out;
  out.reserve(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out.push_back(to_array(g.node(static_cast<int>(i)), values[i]));
  if (bindings_out) *bindings_out = std::move(b);
  return out;
}

RunResult interpret(const Graph& g, const Feeds& feeds) {
  RunResult r;
  const std::vector<Value> values = run(g, feeds, r.bindings);
  for (const auto& o : g.outputs()) {
    if (o.node < 0 || static_cast<std::size_t>(o.node) >= values.size())
      internal_error("output '" + o.name + "' names node %" + std::to_string(o.node) + ", which does not exist");
    r.outputs.insert_or_assign(o.name, to_array(g.node(o.node), values[static_cast<std::size_t>(o.node)]));
  }
  return r;
}

NdArray evaluate_node(const Graph& g, int id, const std::vector<const NdArray*>& inputs, const Bindings& b) {
  const Node& n = g.node(id);
  if (inputs.size() != n.inputs.size())
    internal_error(interp::node_label(g, id) + ": evaluate_node got " + std::to_string(inputs.size()) + " inputs for " +
                   std::to_string(n.inputs.size()));
  std::vector<Value> in;
  in.reserve(inputs.size());
  for (const NdArray* a : inputs) in.push_back(Value{a->shape, a->to_f32()});
  interp::OpArgs args{g, id, n, {}, {}, b};
  for (std::size_t k = 0; k < in.size(); ++k) {
    args.in_nodes.push_back(&g.node(n.inputs[k]));
    args.in.push_back(&in[k]);
  }
  return to_array(n, interp::eval_op(args));
}

NdArray mean_over_axis(const NdArray& a, std::size_t axis) {
  if (axis >= a.shape.size())
    throw std::invalid_argument("mean_over_axis: axis " + std::to_string(axis) + " is out of range for shape " +
                                shape_to_string(a.shape));
  const std::vector<float> x = a.to_f32();
  std::int64_t outer = 1, inner = 1;
  for (std::size_t k = 0; k < axis; ++k) outer *= a.shape[k];
  for (std::size_t k = axis + 1; k < a.shape.size(); ++k) inner *= a.shape[k];
  const std::int64_t n = a.shape[axis];
  std::vector<std::int64_t> shape = a.shape;
  shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(axis));
  std::vector<float> out(static_cast<std::size_t>(outer * inner));
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      double sum = 0.0;
      for (std::int64_t k = 0; k < n; ++k) sum += x[static_cast<std::size_t>((o * n + k) * inner + i)];
      out[static_cast<std::size_t>(o * inner + i)] = static_cast<float>(sum / static_cast<double>(n));
    }
  }
  return NdArray::from_f32(std::move(out), std::move(shape));
}

}  // namespace qkv
