// qkv/dsl/grad.hpp — gradients in the DSL: reductions to a scalar loss, and grad().
//
//   auto loss = mean_all(y * y);                // a scalar: Tensor<f32> (no axes)
//   auto [dx, dw] = grad(loss, x, w);           // dx has x's type, dw has w's
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

#include <qkv/dsl/ops_math.hpp>
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

/// The gradients of the scalar `loss` with respect to each of `wrt` (inputs, parameters or
/// intermediate tensors of the same graph), each of its primal's type: one tensor for one wrt,
/// a std::tuple for several.
template <TensorOrPoison L, TensorOrPoison... W>
auto grad(const L& loss, const W&... wrt) {
  if constexpr (any_poison<L, W...>) {
    return poison{};
  } else if constexpr (L::axis_list::size != 0) {
    return fail<fixed_string("grad: the loss ") + axes_fs<typename L::axis_list>() +
                " is not a scalar; fix: reduce it first, e.g. sum_all(loss) or mean_all(loss)">();
  } else if constexpr (!detail::is_float_dtype<typename L::dtype>) {
    return fail<fixed_string("grad: the loss is ") + L::dtype::name + ", not a floating-point value">();
  } else if constexpr (constexpr auto why = detail::grad_wrt_problem<W...>(); why.size() > 0) {
    return fail<why>();
  } else {
    Graph& g = loss.graph();
    const std::vector<int> ids = append_gradients(g, loss.id(), {wrt.id()...});
    auto typed = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple{tensor<typename W::dtype, typename W::axis_list, trait::plain>(g, ids[I])...};
    }(std::index_sequence_for<W...>{});
    if constexpr (sizeof...(W) == 1)
      return std::get<0>(typed);
    else
      return typed;
  }
}

}  // namespace qkv
