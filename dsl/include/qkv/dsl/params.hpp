// qkv/dsl/params.hpp — parameter groups named as PyTorch names them (`<prefix>.weight`,
// `<prefix>.bias`), and the ops that use them: linear and layer_norm.
#pragma once

#include <tuple>

#include <qkv/dsl/ops_math.hpp>

namespace qkv {

/// A linear map In -> Out: weight [out, in] (PyTorch's layout) and an optional bias [out].
template <AxisType In, AxisType Out>
struct Linear {
  using in_axis = In;
  using out_axis = Out;
  Graph* graph = nullptr;
  int weight = -1;
  int bias = -1;  // -1: no bias
  std::string prefix;
};

/// Declares a linear layer's parameters under explicit names (PyTorch's flat names, such as
/// `in_proj_weight`); an empty `bias` name means no bias.
template <AxisType In, AxisType Out>
Linear<In, Out> linear_params_named(Graph& g, std::string weight, std::string bias) {
  Linear<In, Out> l{&g, -1, -1, weight};
  std::tie(l.weight, l.bias) =
      detail::add_linear_params(g, std::move(weight), std::move(bias), ir_extent<Out>(), ir_extent<In>());
  return l;
}

/// Declares the parameters of a linear layer as torch.nn.Linear names them: `<prefix>.weight`
/// [out, in] and, if `bias`, `<prefix>.bias` [out].
template <AxisType In, AxisType Out>
Linear<In, Out> linear_params(Graph& g, const std::string& prefix, bool bias = true) {
  auto l = linear_params_named<In, Out>(g, prefix + ".weight", bias ? prefix + ".bias" : "");
  l.prefix = prefix;
  return l;
}

/// Declares the parameters of Hugging Face's Conv1D (GPT-2's attention and MLP projections):
/// `<prefix>.weight` stored [in, out] — the transpose of torch.nn.Linear's — and `<prefix>.bias`
/// [out]; y = x·W + b. The result is a Linear: linear(x, w) runs it on the GEMM kernel like any
/// other, the weight transposed to [out, in] in the graph first (a permute: one strided copy of W
/// per call, not a loop nest over the product).
template <AxisType In, AxisType Out>
Linear<In, Out> conv1d_params(Graph& g, const std::string& prefix, bool bias = true) {
  Linear<In, Out> l{&g, -1, -1, prefix + ".weight"};
  std::tie(l.weight, l.bias) = detail::add_conv1d_params(g, prefix, bias, ir_extent<Out>(), ir_extent<In>());
  l.prefix = prefix;
  return l;
}

/// linear(x, W): x's axis named like In becomes Out (x·Wᵀ + b, as torch.nn.Linear).
template <class T, class In, class Out>
auto linear(const T& x, const Linear<In, Out>& w) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_axis_named<L, In>) {
      return fail<fixed_string("linear: x ") + axes_fs<L>() + " has no axis `" + In::name_fs +
                  "` for the input of the projection; fix: rename or merge the features into `" + In::name_fs + "`">();
    } else if constexpr (find_named<L, In>::is_static && In::is_static && find_named<L, In>::extent != In::extent) {
      using X = find_named<L, In>;
      return fail<fixed_string("linear: `") + In::name_fs + "` of x (" + number<X::extent>() +
                  ") must equal the input width of the projection (" + number<In::extent>() +
                  "); fix: the features entering a projection (e.g. heads x d_v into W_o) must match its weight">();
    } else {
      Graph& g = x.graph();
      const Extent have = ir_axis(x.node(), In::name).extent;
      defer_equal(g, have, ir_extent<In>(), [](auto a, auto b) {
        return fixed_string("linear: `") + In::name_fs + "` of x (" + a +
               ") must equal the input width of the projection (" + b +
               "); fix: the features entering a projection must match its weight";
      });
      using OutL = detail::replace_t<L, find_named<L, In>, axes<Out>>;
      return tensor<typename T::dtype, OutL, trait::plain>(
          g, detail::add_linear(g, x.id(), T::dtype::value, w.weight, w.bias, In::name,
                                detail::ir_axis_of(Out::name, Out::is_static, Out::extent), w.prefix));
    }
  }
}

/// Layer norm over one axis with learned gain and shift (`<prefix>.weight`, `<prefix>.bias`).
template <AxisType Over>
struct LayerNorm {
  Graph* graph = nullptr;
  int gamma = -1;
  int beta = -1;
  double eps = 1e-5;
  std::string prefix;
};

template <AxisType Over>
LayerNorm<Over> layer_norm_params(Graph& g, std::string prefix, double eps = 1e-5) {
  LayerNorm<Over> ln{&g, -1, -1, eps, prefix};
  for (auto [which, id] : {std::pair<const char*, int*>{".weight", &ln.gamma}, {".bias", &ln.beta}})
    *id = detail::add_param(g, prefix + which, {detail::ir_axis_of(Over::name, Over::is_static, Over::extent)});
  return ln;
}

template <class T, class Over>
auto layer_norm(const T& x, const LayerNorm<Over>& ln) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_axis_named<L, Over>) {
      return fail<fixed_string("layer_norm: x ") + axes_fs<L>() + " has no axis `" + Over::name_fs +
                  "`; fix: normalise over the feature axis">();
    } else if constexpr (find_named<L, Over>::is_static && Over::is_static &&
                         find_named<L, Over>::extent != Over::extent) {
      using X = find_named<L, Over>;
      return fail<fixed_string("layer_norm: `") + Over::name_fs + "` of x (" + number<X::extent>() +
                  ") must equal the width of the norm (" + number<Over::extent>() +
                  "); fix: size the norm like the features">();
    } else {
      Graph& g = x.graph();
      return tensor<typename T::dtype, L, trait::plain>(
          g, detail::add_layer_norm(g, x.id(), T::dtype::value, ln.gamma, ln.beta, Over::name, ln.eps, ln.prefix));
    }
  }
}

}  // namespace qkv
