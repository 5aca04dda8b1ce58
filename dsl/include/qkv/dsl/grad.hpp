// qkv/dsl/grad.hpp — gradients in the DSL: reductions to a scalar loss, and grad().
//
//   auto loss = mean_all(y * y);                // a scalar: Tensor<f32> (no axes)
//   auto [dx, dw] = grad(loss, x, w);           // dx has x's type, dw has w's
//   auto dfc = grad(loss, fc);                  // a Linear: dfc.weight, dfc.bias are the gradients
//   output(dw, "dw");
//
// grad() appends the backward nodes to the same graph (reverse mode over the Graph IR,
// qkv/ir/grad.hpp), so the forward values are read where they are and every backend runs the
// result. The types are the checks: a loss with axes is a compile error naming them, an integer
// or mask has no gradient, and a gradient is a tensor of its primal's type — using it where the
// primal would not fit fails as the primal would.
#pragma once

#include <tuple>
#include <utility>
#include <vector>

#include <qkv/dsl/ops_decoder.hpp>
#include <qkv/dsl/ops_math.hpp>
#include <qkv/dsl/params.hpp>
#include <qkv/ir/grad.hpp>

namespace qkv {

namespace detail {
/// x summed over the axes named in `drop` (a contraction with ones), as the tensor type R.
template <class R, class T>
R sum_named(const T& x, const std::vector<std::string>& drop) {
  Graph& g = x.graph();
  grad_detail::Builder b(g);
  return R(g, b.sum_over(x.id(), drop));
}
/// The first of W that has no gradient (an integer or a mask), as a message; "" when none.
template <class W, class... R>
constexpr auto grad_wrt_problem() {
  if constexpr (!is_float_dtype<typename W::dtype>)
    return fixed_string("grad: ") + axes_fs<typename W::axis_list>() + " is " + W::dtype::name +
           ", which has no gradient; fix: ask for the gradients of floating-point tensors";
  else if constexpr (sizeof...(R) > 0)
    return grad_wrt_problem<R...>();
  else
    return fixed_string("");
}
}  // namespace detail

/// Every entry of x added up: a scalar (torch.sum).
template <TensorType T>
auto sum_all(const T& x) {
  using R = tensor<typename T::dtype, axes<>, trait::plain>;
  std::vector<std::string> all;
  for (const auto& a : x.node().axes) all.push_back(a.name);
  return detail::sum_named<R>(x, all);
}

/// The mean of every entry of x: a scalar (torch.mean); run-time sizes are read at run time.
template <TensorType T>
auto mean_all(const T& x) {
  Graph& g = x.graph();
  ModExpr e;
  int n = e.add(mod_constant(1.0));
  for (const auto& a : x.node().axes) {
    ModNode len;
    len.op = ModOp::length;
    len.axis = a.name;
    n = e.add(mod_node(ModOp::mul, n, e.add(std::move(len))));
  }
  e.score = e.add(mod_node(ModOp::div, e.add(mod_node(ModOp::score)), n));
  grad_detail::Builder b(g);
  return sum_all(
      tensor<typename T::dtype, typename T::axis_list, trait::plain>(g, b.pointwise({x.id()}, std::move(e))));
}

/// x summed over the axes Ax... (dropped from the result).
template <template <auto> class... Ax, TensorType T>
auto sum(const T& x) {
  using L = typename T::axis_list;
  if constexpr (!(has_family<L, Ax> && ...)) {
    return fail<fixed_string("sum: x ") + axes_fs<L>() + " lacks an axis to sum over; fix: sum over axes x has">();
  } else {
    using R = tensor<typename T::dtype, without<L, axes<find_family<L, Ax>...>>, trait::plain>;
    return detail::sum_named<R>(x, {std::string(find_family<L, Ax>::name)...});
  }
}

namespace detail {
/// How grad() takes one `wrt`: a tensor (its node), or a parameter group (Linear, LayerNorm,
/// RmsNorm, Embedding: its nodes), and how it gives the gradient back as the same type — a
/// group's gradient is a group of the same type whose ids are the gradients' (a Linear without a
/// bias has none).
template <class W>
struct grad_of;
template <class DT, class L, class Tr>
struct grad_of<tensor<DT, L, Tr>> {
  using result = tensor<DT, L, trait::plain>;
  static std::vector<int> ids(const tensor<DT, L, Tr>& t) { return {t.id()}; }
  static result rebuild(const tensor<DT, L, Tr>& t, const int*& g) { return result(t.graph(), *g++); }
};
template <class In, class Out>
struct grad_of<Linear<In, Out>> {
  using result = Linear<In, Out>;
  static std::vector<int> ids(const Linear<In, Out>& l) {
    return l.bias >= 0 ? std::vector<int>{l.weight, l.bias} : std::vector<int>{l.weight};
  }
  static result rebuild(Linear<In, Out> l, const int*& g) {
    l.weight = *g++;
    if (l.bias >= 0) l.bias = *g++;
    l.prefix = "d" + l.prefix;
    return l;
  }
};
template <class Over>
struct grad_of<LayerNorm<Over>> {
  using result = LayerNorm<Over>;
  static std::vector<int> ids(const LayerNorm<Over>& n) { return {n.gamma, n.beta}; }
  static result rebuild(LayerNorm<Over> n, const int*& g) {
    n.gamma = *g++;
    n.beta = *g++;
    return n;
  }
};
template <class Over>
struct grad_of<RmsNorm<Over>> {
  using result = RmsNorm<Over>;
  static std::vector<int> ids(const RmsNorm<Over>& n) { return {n.weight}; }
  static result rebuild(RmsNorm<Over> n, const int*& g) {
    n.weight = *g++;
    return n;
  }
};
template <class Rows, class Features>
struct grad_of<Embedding<Rows, Features>> {
  using result = Embedding<Rows, Features>;
  static std::vector<int> ids(const Embedding<Rows, Features>& e) { return {e.weight}; }
  static result rebuild(Embedding<Rows, Features> e, const int*& g) {
    e.weight = *g++;
    return e;
  }
};
template <class W>
concept Differentiable = requires { typename grad_of<std::remove_cvref_t<W>>::result; };

template <class W>
constexpr auto wrt_problem() {
  if constexpr (TensorType<W>)
    return grad_wrt_problem<W>();
  else
    return fixed_string("");
}
}  // namespace detail

/// The gradients of the scalar `loss` with respect to each of `wrt` — tensors (inputs,
/// parameters or intermediate values of the same graph) or parameter groups (Linear, LayerNorm,
/// RmsNorm, Embedding) — each of its primal's type: one for one wrt, a std::tuple for several.
template <TensorOrPoison L, class... W>
  requires((is_poison<W> || detail::Differentiable<W>) && ...)
auto grad(const L& loss, const W&... wrt) {
  if constexpr (any_poison<L, W...>) {
    return poison{};
  } else if constexpr (L::axis_list::size != 0) {
    return fail<fixed_string("grad: the loss ") + axes_fs<typename L::axis_list>() +
                " is not a scalar; fix: reduce it first, e.g. sum_all(loss) or mean_all(loss)">();
  } else if constexpr (!detail::is_float_dtype<typename L::dtype>) {
    return fail<fixed_string("grad: the loss is ") + L::dtype::name + ", not a floating-point value">();
  } else if constexpr (constexpr auto why = (detail::wrt_problem<W>() + ... + fixed_string("")); why.size() > 0) {
    return fail<why>();
  } else {
    Graph& g = loss.graph();
    std::vector<int> ids;
    (
        [&] {
          for (int id : detail::grad_of<W>::ids(wrt)) ids.push_back(id);
        }(),
        ...);
    const std::vector<int> grads = append_gradients(g, loss.id(), ids);
    const int* next = grads.data();
    // Braced initialisation: the groups are rebuilt left to right, in the order of `ids`.
    std::tuple<typename detail::grad_of<W>::result...> typed{detail::grad_of<W>::rebuild(wrt, next)...};
    if constexpr (sizeof...(W) == 1)
      return std::get<0>(typed);
    else
      return typed;
  }
}

}  // namespace qkv
