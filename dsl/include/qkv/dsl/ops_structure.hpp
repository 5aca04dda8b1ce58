// qkv/dsl/ops_structure.hpp — ops that change how axes are arranged, never the values:
// split, merge, permute/transpose, rename, view, chunk, concat.
//
// They are metadata in the graph (the layout pass decides strides later); here they are checked
// by name: a merge of axes that are not adjacent, a view that would move data between
// differently named axes, or a split whose factors do not multiply to the axis are compile
// errors (catalogue entries 1, 5, 9, 11).
#pragma once

#include <qkv/dsl/node_builders.hpp>
#include <qkv/dsl/tensor.hpp>

namespace qkv {

namespace detail {

[[gnu::noinline]] inline Node unary_node_of(int input, DType dtype, Op op, std::vector<Axis> out_axes) {
  Node n;
  n.op = op;
  n.inputs = std::vector<int>{input};
  n.axes = std::move(out_axes);
  n.dtype = dtype;
  return n;
}
template <TensorType T>
Node unary_node(const T& t, Op op, std::vector<Axis> out_axes) {
  return unary_node_of(t.id(), T::dtype::value, op, std::move(out_axes));
}

/// The first axis of L1 that L2 also has, with a different static extent (L1::size if none).
template <class L1, class L2>
constexpr std::size_t first_shared_mismatch() {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    auto bad = []<class X>() {
      if constexpr (!has_axis_named<L2, X>)
        return false;
      else {
        using Y = find_named<L2, X>;
        return X::is_static && Y::is_static && X::extent != Y::extent;
      }
    };
    constexpr bool differ[] = { bad.template operator()<axis_at<L1, I>>()..., true };
    std::size_t i = 0;
    while (!differ[i]) ++i;
    return i;
  }(std::make_index_sequence<L1::size>{});
}

/// L with the axis named like A replaced by the axes in R (in place).
template <class L, class A, class R>
struct replace_axis;
template <class... X, class A, class R>
struct replace_axis<axes<X...>, A, R> {
  using type = decltype((axes<>{} + ... + std::conditional_t<same_name<X, A>, R, axes<X>>{}));
};

template <class L, class A, class R>
using replace_t = typename replace_axis<L, A, R>::type;

template <class... A>
constexpr std::int64_t static_product() {
  return (std::int64_t{1} * ... * (A::is_static ? A::extent : 1));
}
template <class... A>
inline constexpr bool all_static = (A::is_static && ...);

/// "Heads (6) x HeadDim (85)"
template <class First, class... Rest>
constexpr auto factors_fs() {
  return ((First::name_fs + " (" + extent_fs<First>() + ")") + ... +
          (fixed_string(" x ") + Rest::name_fs + " (" + extent_fs<Rest>() + ")"));
}

inline std::vector<Axis> ir_replace(const std::vector<Axis>& in, std::string_view name, std::vector<Axis> with) {
  std::vector<Axis> out;
  for (const auto& a : in) {
    if (a.name == name)
      out.insert(out.end(), with.begin(), with.end());
    else
      out.push_back(a);
  }
  return out;
}

}  // namespace detail

namespace detail {
/// The graph-building half of split: IR extents for the factors, deferred checks. `sizes[i]`
/// gives a dynamic factor a size known when the graph is built (0: the one factor that takes
/// what is left).
template <class A, class... Parts, class T, std::size_t N>
auto split_ir(const T& t, const std::array<std::int64_t, N>& sizes) {
  using Out = replace_t<typename T::axis_list, A, axes<Parts...>>;
  auto text = [](auto a, auto b) {
    return fixed_string("split: `") + A::name_fs + "` (" + a + ") is not a multiple of " + factors_fs<Parts...>() +
           " = " + b + "; fix: choose factors that divide " + A::name_fs;
  };
  static constexpr std::array<std::string_view, N> names{Parts::name...};
  static constexpr std::array<bool, N> is_static{Parts::is_static...};
  static constexpr std::array<std::int64_t, N> static_size{Parts::extent...};
  static constexpr auto factors = factors_fs<Parts...>();
  Graph& g = t.graph();
  return tensor<typename T::dtype, Out, trait::plain>(
      g, add_split(g, t.id(), T::dtype::value, A::name, names, is_static, static_size, sizes, factors.view(),
                   deferred_text<decltype(text)>.view()));
}
}  // namespace detail

/// split<Model, Heads<8>, HeadDim<64>>(x): one axis into named factors, in place.
/// Static factors must multiply to the axis (d_model divisible by the number of heads); a
/// dynamic factor takes what is left.
///
/// split<Model, Heads<dyn>, HeadDim<dyn>>(x, {heads, 0}): the same with sizes only known when
/// the graph is built (e.g. read from a state dict); those checks raise ShapeError.
template <template <auto> class From, AxisType... Parts, class T>
auto split(const T& t, std::array<std::int64_t, sizeof...(Parts)> sizes) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_family<L, From>) {
      return missing_axis<"split", L, From>();
    } else {
      return detail::split_ir<find_family<L, From>, Parts...>(t, sizes);
    }
  }
}

template <template <auto> class From, AxisType... Parts, class T>
auto split(const T& t) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_family<L, From>) {
      return missing_axis<"split", L, From>();
    } else {
      using A = find_family<L, From>;
      constexpr std::int64_t prod = detail::static_product<Parts...>();
      constexpr int n_dyn = ((Parts::is_static ? 0 : 1) + ...);
      if constexpr (n_dyn > 1) {
        return fail<fixed_string("split: at most one factor of `") + A::name_fs + "` may be dynamic, got " +
                    detail::factors_fs<Parts...>() +
                    "; fix: give the other factors sizes, here or as split<...>(x, {sizes...})">();
      } else if constexpr (A::is_static && n_dyn == 0 && prod != A::extent) {
        return fail<fixed_string("split: `") + A::name_fs + "` (" + number<A::extent>() + ") is not " +
                    detail::factors_fs<Parts...>() + " = " + number<prod>() + "; fix: choose factors that divide " +
                    A::name_fs + " (e.g. a number of heads that divides d_model)">();
      } else if constexpr (A::is_static && n_dyn == 1 && A::extent % prod != 0) {
        return fail<fixed_string("split: `") + A::name_fs + "` (" + number<A::extent>() + ") is not divisible by " +
                    detail::factors_fs<Parts...>() + "; fix: choose factors that divide " + A::name_fs>();
      } else {
        return detail::split_ir<A, Parts...>(t, std::array<std::int64_t, sizeof...(Parts)>{});
      }
    }
  }
}

/// merge<Heads, HeadDim, Model>(o): two adjacent axes (in this order) into one.
/// The seeds' `transpose(1, 2).contiguous().view(B, S, E)`: the heads must be permuted back
/// next to the head dimension first, or the merge would interleave data from different tokens.
template <template <auto> class A, template <auto> class B, template <auto> class Into, class T>
auto merge(const T& t) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_family<L, A> || !has_family<L, B>) {
      return fail<fixed_string("merge: x ") + axes_fs<L>() + " needs axes `" + family_name_fs<A> + "` and `" +
                  family_name_fs<B> + "`; fix: merge axes the tensor has">();
    } else {
      using XA = find_family<L, A>;
      using XB = find_family<L, B>;
      constexpr std::size_t ia = index_of<L, XA>, ib = index_of<L, XB>;
      if constexpr (ib != ia + 1) {
        using Fixed = detail::replace_t<without<L, axes<XA>>, XB, axes<XA, XB>>;  // XA moved next to XB
        return fail<fixed_string("merge: `") + XA::name_fs + "` and `" + XB::name_fs + "` are not adjacent in " +
                    axes_fs<L>() + "; fix: " + permute_fix<Fixed>() + " first, then merge">();
      } else {
        using M = std::conditional_t<XA::is_static && XB::is_static, Into<XA::extent * XB::extent>, Into<dyn>>;
        using Out = detail::replace_t<without<L, axes<XB>>, XA, axes<M>>;
        Graph& g = t.graph();
        return tensor<typename T::dtype, Out, trait::plain>(
            g, detail::add_merge(g, t.id(), T::dtype::value, XA::name, XB::name, M::name));
      }
    }
  }
}

/// permute<Batch, Seq, Heads, HeadDim>(x): reorder by names; every axis exactly once.
template <template <auto> class... F, class T>
auto permute(const T& t) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    constexpr bool all_known = (has_family<L, F> && ...);
    constexpr bool complete = sizeof...(F) == L::size;
    if constexpr (!all_known || !complete) {
      return fail<fixed_string("permute: the new order must name every axis of ") + axes_fs<L>() +
                  " exactly once; fix: " + permute_fix<L>() + " lists them">();
    } else {
      using Out = axes<find_family<L, F>...>;
      Graph& g = t.graph();
      // A permute keeps the value's meaning (scores stay scores; a mask stays a mask).
      return tensor<typename T::dtype, Out, typename T::trait_type>(
          g, detail::add_permute(g, t.id(), T::dtype::value, {family_name<F>...}));
    }
  }
}

namespace detail {
template <class L, class A, class B>
struct swap_axes;
template <class... X, class A, class B>
struct swap_axes<axes<X...>, A, B> {
  template <class Y>
  using one = std::conditional_t<same_name<Y, A>, B, std::conditional_t<same_name<Y, B>, A, Y>>;
  using type = axes<one<X>...>;
};
}  // namespace detail

/// transpose<Seq, Heads>(x): swap two axes by name (PyTorch's transpose(1, 2) without the numbers).
template <template <auto> class A, template <auto> class B, class T>
auto transpose(const T& t) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_family<L, A> || !has_family<L, B>) {
      return fail<fixed_string("transpose: x ") + axes_fs<L>() + " needs axes `" + family_name_fs<A> + "` and `" +
                  family_name_fs<B> + "`; fix: transpose axes the tensor has">();
    } else {
      using Out = typename detail::swap_axes<L, find_family<L, A>, find_family<L, B>>::type;
      std::vector<Axis> out = t.node().axes;
      auto& x = out;
      std::size_t ia = 0, ib = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        if (x[i].name == family_name<A>) ia = i;
        if (x[i].name == family_name<B>) ib = i;
      }
      std::swap(x[ia], x[ib]);
      Node n = detail::unary_node(t, Op::permute, std::move(out));
      Graph& g = t.graph();
      return tensor<typename T::dtype, Out, typename T::trait_type>(g, g.add(std::move(n)));
    }
  }
}

/// rename<Seq, Key>(k): the same data under a new axis name — how the key side of
/// self-attention gets its own axis, so that softmax and masks can tell queries from keys.
/// The meaning stays (a mask stays a mask; weights stay normalised over the renamed axis).
template <template <auto> class From, template <auto> class To, class T>
auto rename(const T& t) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_family<L, From>) {
      return missing_axis<"rename", L, From>();
    } else if constexpr (has_family<L, To> && family_name<From> != family_name<To>) {
      return fail<fixed_string("rename: x ") + axes_fs<L>() + " already has an axis `" + family_name_fs<To> +
                  "`; fix: pick a name that is not taken">();
    } else {
      using A = find_family<L, From>;
      using Out = detail::replace_t<L, A, axes<To<A::param>>>;
      using Tr = detail::renamed_t<typename T::trait_type, A::name_fs, family_name_fs<To>>;
      Graph& g = t.graph();
      return tensor<typename T::dtype, Out, Tr>(
          g, detail::add_rename(g, t.id(), T::dtype::value, A::name, family_name<To>));
    }
  }
}

namespace detail {
/// "axis 1 is `Seq` in x but `Heads` in the view" / "the view drops `HeadDim`" / "the view adds
/// `Model`": the first place where the names of x (L) and of a view (N) part.
template <class L, class N>
constexpr auto first_difference_fs() {
  constexpr std::size_t i = first_name_difference<L, N>();
  if constexpr (i < L::size && i < N::size)
    return fixed_string("axis ") + number<static_cast<std::int64_t>(i)>() + " is `" + axis_at<L, i>::name_fs +
           "` in x but `" + axis_at<N, i>::name_fs + "` in the view";
  else if constexpr (i < L::size)
    return fixed_string("the view drops `") + axis_at<L, i>::name_fs + "`";
  else
    return fixed_string("the view adds `") + axis_at<N, i>::name_fs + "`";
}

/// Why a view from axes L to axes N is refused, with the op that does it by name: a reorder is
/// a permute, one axis into several a split, two adjacent axes into one a merge.
template <class L, class N>
constexpr auto view_refusal() {
  using Gone = without<L, N>;  // axes of x the view does not name
  using New = without<N, L>;   // axes the view names that x does not have
  constexpr auto head = fixed_string("view: ") + axes_fs<L>() + " -> " + axes_fs<N>();
  constexpr auto scrambles =
      head + " would move data between differently named axes (" + first_difference_fs<L, N>() + ")";
  if constexpr (Gone::size == 0 && New::size == 0) {
    return fail<head + " reorders the axes, which moves data; fix: " + permute_fix<N>()>();
  } else if constexpr (Gone::size == 1 && New::size >= 2) {
    using X = axis_at<Gone, 0>;
    constexpr auto split = fixed_string("split<") + X::name_fs + ", " + decls_fs<New>() + ">(x)";
    if constexpr (same_names<replace_t<L, X, New>, N>)
      return fail<head + " splits `" + X::name_fs + "`, which a view never does by name; fix: " + split>();
    else
      return fail<scrambles + "; fix: permute<" + names_fs<N>() + ">(" + split + ")">();
  } else if constexpr (Gone::size == 2 && New::size == 1 &&
                       index_of<L, axis_at<Gone, 1>> == index_of<L, axis_at<Gone, 0>> + 1 &&
                       same_names<replace_t<without<L, axes<axis_at<Gone, 1>>>, axis_at<Gone, 0>, New>, N>) {
    using A = axis_at<Gone, 0>;
    using B = axis_at<Gone, 1>;
    using M = axis_at<New, 0>;
    return fail<head + " merges `" + A::name_fs + "` and `" + B::name_fs +
                "`, which a view never does by name; fix: merge<" + A::name_fs + ", " + B::name_fs + ", " + M::name_fs +
                ">(x)">();
  } else {
    return fail<scrambles + "; fix: split<Axis, Factors...> then permute<...> by name">();
  }
}
}  // namespace detail

/// view<Batch<2>, Seq<4>, Model<16>>(x): a raw reinterpretation, as PyTorch's view. It may only
/// restate the axes the tensor has (same names, same order — e.g. fix a dynamic extent); moving
/// data between differently named axes is how heads get scrambled, so it is refused with the
/// split/merge/permute that does it by name.
template <AxisType... New, class T>
auto view(const T& t) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    using N = axes<New...>;
    if constexpr (!detail::same_names<L, N>) {
      return detail::view_refusal<L, N>();
    } else if constexpr (constexpr auto k = detail::first_extent_difference<L, N>(); k != N::size) {
      return fail<fixed_string("view: `") + axis_at<L, k>::name_fs + "` is " + number<axis_at<L, k>::extent>() +
                  " but the view says " + number<axis_at<N, k>::extent>() +
                  "; fix: view with the sizes the tensor has">();
    } else {
      Graph& g = t.graph();
      std::vector<Axis> out = t.node().axes;
      std::size_t pos = 0;
      ((defer_equal(g, out[pos].extent, ir_extent<New>(),
                    [](auto a, auto b) {
                      return fixed_string("view: `") + New::name_fs + "` is " + a + " but the view says " + b +
                             "; fix: view with the sizes the tensor has";
                    }),
        out[pos].extent = New::is_static ? ir_extent<New>() : out[pos].extent, ++pos),
       ...);
      Node n = detail::unary_node(t, Op::view, std::move(out));
      return tensor<typename T::dtype, N, typename T::trait_type>(g, g.add(std::move(n)));
    }
  }
}

/// chunk<QKV, 3, Model>(x): cut axis `From` into K equal parts, each renamed `Into` — the fused
/// QKV projection's output split in three.
template <template <auto> class From, int K, template <auto> class Into, class T>
auto chunk(const T& t) {
  using Poisoned = std::array<poison, K>;  // so that `auto [q, k, v] = chunk<...>(x)` stays silent
  if constexpr (any_poison<T>) {
    return Poisoned{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_family<L, From>) {
      missing_axis<"chunk", L, From>();
      return Poisoned{};
    } else {
      using A = find_family<L, From>;
      if constexpr (A::is_static && A::extent % K != 0) {
        fail<fixed_string("chunk: `") + A::name_fs + "` (" + number<A::extent>() + ") is not divisible by " +
             number<K>() + "; fix: chunk into a number of parts that divides it">();
        return Poisoned{};
      } else {
        using P = std::conditional_t<A::is_static, Into<A::extent / K>, Into<dyn>>;
        using Out = tensor<typename T::dtype, detail::replace_t<L, A, axes<P>>, trait::plain>;
        Graph& g = t.graph();
        std::array<int, K> ids{};
        detail::add_chunks(g, t.id(), T::dtype::value, A::name, P::name, ids);
        return [&]<std::size_t... I>(std::index_sequence<I...>) {
          return std::array<Out, K>{Out(g, ids[I])...};
        }(std::make_index_sequence<K>{});
      }
    }
  }
}

/// concat<HeadDim, Model>(heads): join tensors of one type along `Along`, renaming it `Into`
/// (heads-as-modules: H outputs of [Batch, Seq, HeadDim<D>] -> [Batch, Seq, Model<H*D>]).
template <template <auto> class Along, template <auto> class Into, TensorOrPoison T, std::size_t N>
auto concat(const std::array<T, N>& parts) {
  if constexpr (is_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_family<L, Along>) {
      return fail<fixed_string("concat: parts ") + axes_fs<L>() + " have no axis `" + family_name_fs<Along> +
                  "`; fix: concatenate along an axis the parts have">();
    } else {
      using A = find_family<L, Along>;
      using M = std::conditional_t<A::is_static, Into<A::extent* static_cast<std::int64_t>(N)>, Into<dyn>>;
      using Out = detail::replace_t<L, A, axes<M>>;
      Graph& g = parts[0].graph();
      Node n = detail::unary_node(
          parts[0], Op::concat,
          detail::ir_replace(parts[0].node().axes, A::name,
                             {Axis{std::string(M::name), ir_axis(parts[0].node(), A::name).extent.times(N)}}));
      n.inputs.clear();
      for (const auto& p : parts) n.inputs.push_back(p.id());
      n.attr_axes = {std::string(A::name), std::string(M::name)};
      return tensor<typename T::dtype, Out, trait::plain>(g, g.add(std::move(n)));
    }
  }
}

namespace detail {
template <template <auto> class Ax, class A, class B>
using joined_axis = std::conditional_t<A::is_static && B::is_static, Ax<A::extent + B::extent>, Ax<dyn>>;

template <class T>
Node concat_node(const T& x, int tail, std::string_view axis, const Extent& tail_extent) {
  Node n = unary_node(x, Op::concat, x.node().axes);
  n.inputs.push_back(tail);
  // Two sizes of different symbols (a cache's Past and a step's Seq) have no one-symbol sum: the
  // joined axis gets a fresh symbol, its own name, bound to the sum when the inputs are bound.
  for (auto& a : n.axes)
    if (a.name == axis)
      a.extent = a.extent.is_dynamic() && tail_extent.is_dynamic() && a.extent.symbol != tail_extent.symbol
                     ? Extent::dynamic(std::string(axis))
                     : a.extent.plus_extent(tail_extent);
  n.attr_axes = {std::string(axis), std::string(axis)};
  return n;
}
}  // namespace detail

namespace detail {
/// append (y after x) and prepend (y before x) along Ax: y may lack some of x's other axes (it is
/// repeated along them); the axes it has must match x's, and the result has x's axes.
template <template <auto> class Ax, fixed_string Op, class X, class Y>
auto join(const X& x, const Y& y, bool head_first) {
  if constexpr (any_poison<X, Y>) {
    return poison{};
  } else {
    using LX = typename X::axis_list;
    using LY = typename Y::axis_list;
    if constexpr (!has_family<LX, Ax> || !has_family<LY, Ax>) {
      return fail<fixed_string(Op) + ": both " + axes_fs<LX>() + " and " + axes_fs<LY>() + " need the axis `" +
                  family_name_fs<Ax> + "`; fix: " + Op + " along an axis both have">();
    } else if constexpr (without<LY, LX>::size != 0) {
      return fail<fixed_string(Op) + ": " + axes_fs<LY>() + " has axes that " + axes_fs<LX>() +
                  " lacks; fix: the appended part may only drop axes, not add them">();
    } else if constexpr (constexpr auto k =
                             detail::first_shared_mismatch<detail::replace_t<LX, find_family<LX, Ax>, axes<>>, LY>();
                         k != LX::size - 1) {
      using XO = detail::replace_t<LX, find_family<LX, Ax>, axes<>>;
      using Z = axis_at<XO, k>;
      return fail<fixed_string(Op) + ": `" + family_name_fs<Ax> + "`-joined parts differ on `" + Z::name_fs + "` (" +
                  number<Z::extent>() + " vs " + number<find_named<LY, Z>::extent>() +
                  "); fix: give both parts the same sizes off the joined axis (" + Op + " along `" + Z::name_fs +
                  "` if that is the axis to join)">();
    } else {
      using A = find_family<LX, Ax>;
      using B = find_family<LY, Ax>;
      using Out = detail::replace_t<LX, A, axes<detail::joined_axis<Ax, A, B>>>;
      Graph& g = x.graph();
      const Extent tail_extent = ir_axis(y.node(), A::name).extent;
      for (const auto& ya : y.node().axes)
        if (ya.name != A::name)
          defer_equal(g, ir_axis(x.node(), ya.name).extent, ya.extent, [](auto sa, auto sb) {
            return fixed_string(Op) + ": `" + family_name_fs<Ax> + "`-joined parts differ on another axis (" + sa +
                   " vs " + sb + "); fix: give both parts the same sizes off the joined axis";
          });
      int tail = y.id();
      if (y.node().axes.size() != x.node().axes.size()) {  // repeat y along the axes it lacks
        std::vector<Axis> target = x.node().axes;
        for (auto& a : target)
          if (a.name == A::name) a.extent = tail_extent;
        Node b = detail::unary_node(y, Op::broadcast, std::move(target));
        tail = g.add(std::move(b));
      }
      Node joined = detail::concat_node(x, tail, A::name, tail_extent);
      if (head_first) std::swap(joined.inputs[0], joined.inputs[1]);
      return tensor<typename X::dtype, Out, typename X::trait_type>(g, g.add(std::move(joined)));
    }
  }
}
}  // namespace detail

/// append<Key>(k, bias_k): y laid after x along Ax (PyTorch's add_bias_kv appends one learned
/// key and value). y may lack some of x's other axes; it is repeated along them.
template <template <auto> class Ax, class X, class Y>
auto append(const X& x, const Y& y) {
  return detail::join<Ax, "append">(x, y, /*head_first=*/false);
}

/// prepend<Seq>(x, head): head laid before x along Ax — a learned CLS token [Seq = 1, Model]
/// put in front of every sequence of x [Batch, Seq, Model] (ViT, BERT's pooler input). head may
/// lack some of x's other axes (it is repeated along them); the axes it has must match x's.
template <template <auto> class Ax, class X, class H>
auto prepend(const X& x, const H& head) {
  return detail::join<Ax, "prepend">(x, head, /*head_first=*/true);
}

namespace detail {
/// The slice node of slice and last: Length entries of Ax from `start` (a static or run-time
/// extent), the axis keeping its name.
template <template <auto> class Ax, std::int64_t Length, class T>
auto slice_from(const T& t, const Extent& start) {
  using L = typename T::axis_list;
  using A = find_family<L, Ax>;
  Graph& g = t.graph();
  Node n = detail::unary_node(
      t, Op::slice, detail::ir_replace(t.node().axes, A::name, {Axis{std::string(A::name), Extent::fixed(Length)}}));
  n.attr_axes = {std::string(A::name), std::string(A::name)};
  n.dim = start;
  return tensor<typename T::dtype, detail::replace_t<L, A, axes<Ax<Length>>>, trait::plain>(g, g.add(std::move(n)));
}
}  // namespace detail

/// slice<Seq, Start, Length>(x): entries [Start, Start + Length) of the axis, which keeps its name
/// and becomes Length long (x[..., Start:Start+Length, ...] in PyTorch). On a static axis a slice
/// past its end is a compile error; on a dynamic one, a shape error when the sizes are bound (the
/// compiled function returns 2).
template <template <auto> class Ax, std::int64_t Start, std::int64_t Length, class T>
auto slice(const T& t) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_family<L, Ax>) {
      return missing_axis<"slice", L, Ax>();
    } else if constexpr (Start < 0 || Length <= 0) {
      return fail<fixed_string("slice: the start (") + number<Start>() + ") must be >= 0 and the length (" +
                  number<Length>() + ") > 0; fix: slice<Axis, Start, Length> with a non-empty range">();
    } else if constexpr (find_family<L, Ax>::is_static && Start + Length > find_family<L, Ax>::extent) {
      using A = find_family<L, Ax>;
      return fail<fixed_string("slice: [") + number<Start>() + ", " + number<Start + Length>() + ") is outside `" +
                  A::name_fs + "` (" + number<A::extent>() + "); fix: a range inside the axis">();
    } else {
      using A = find_family<L, Ax>;
      Graph& g = t.graph();
      const Extent whole = ir_axis(t.node(), A::name).extent;
      if (whole.is_dynamic())
        g.require(Constraint{Constraint::Kind::at_most, Extent::fixed(Start + Length), whole,
                             "slice: [" + std::to_string(Start) + ", {a}) is outside `" + std::string(A::name) +
                                 "` ({b}); fix: a longer input, or a range inside it"});
      return detail::slice_from<Ax, Length>(t, Extent::fixed(Start));
    }
  }
}

/// last<Seq>(x): the axis's last entry, kept as an axis of length 1 (x[..., -1:, ...] in
/// PyTorch), whether the axis is static or bound at run time: the next-token logits of a decoder
/// need only the last position's hidden state.
template <template <auto> class Ax, class T>
auto last(const T& t) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else if constexpr (!has_family<typename T::axis_list, Ax>) {
    return missing_axis<"last", typename T::axis_list, Ax>();
  } else if constexpr (find_family<typename T::axis_list, Ax>::is_static) {
    return slice<Ax, find_family<typename T::axis_list, Ax>::extent - 1, 1>(t);
  } else {
    using L = typename T::axis_list;
    using A = find_family<L, Ax>;
    Graph& g = t.graph();
    const Extent whole = ir_axis(t.node(), A::name).extent;
    g.require(Constraint{Constraint::Kind::at_most, Extent::fixed(1), whole,
                         "last: `" + std::string(A::name) + "` is empty ({b}); fix: an input with at least one entry"});
    Extent start = whole;
    start.plus -= 1;
    return detail::slice_from<Ax, 1>(t, start);
  }
}

/// select<Seq, Index>(x): entry Index of the axis, which is dropped (x[..., Index, ...]): BERT's
/// [CLS] row, select<Seq, 0>(hidden) [Batch, Model]. x keeps at least one axis.
template <template <auto> class Ax, std::int64_t Index, class T>
auto select(const T& t) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else if constexpr (T::axis_list::size < 2 && has_family<typename T::axis_list, Ax>) {
    return fail<fixed_string("select: x ") + axes_fs<typename T::axis_list>() +
                " would have no axis left; fix: slice<" + family_name_fs<Ax> + ", " + number<Index>() +
                ", 1>(x) keeps it">();
  } else {
    auto one = slice<Ax, Index, 1>(t);
    if constexpr (is_poison<decltype(one)>) {
      return poison{};
    } else {
      // The axis, now of extent 1, merged into its neighbour (a view: no copy).
      using L = typename T::axis_list;
      using A = find_family<L, Ax>;
      const auto& have = one.node().axes;
      const std::size_t i = index_of<L, A>;
      const std::size_t j = i + 1 < have.size() ? i + 1 : i - 1;
      std::vector<Axis> out;
      for (std::size_t k = 0; k < have.size(); ++k)
        if (k != i) out.push_back(have[k]);
      Node n = detail::unary_node(one, Op::merge, std::move(out));
      n.attr_axes = {have[std::min(i, j)].name, have[std::max(i, j)].name, have[j].name};
      Graph& g = t.graph();
      return tensor<typename T::dtype, without<L, axes<A>>, trait::plain>(g, g.add(std::move(n)));
    }
  }
}

/// pad<Key, N>(x, value): N entries of a constant appended along Ax (zero keys for PyTorch's
/// add_zero_attn; `true` columns extending a keep-mask). Masks stay masks.
template <template <auto> class Ax, int N, class X>
auto pad(const X& x, double value) {
  if constexpr (any_poison<X>) {
    return poison{};
  } else {
    using LX = typename X::axis_list;
    if constexpr (!has_family<LX, Ax>) {
      return missing_axis<"pad", LX, Ax>();
    } else {
      using A = find_family<LX, Ax>;
      using Out = detail::replace_t<LX, A, axes<detail::joined_axis<Ax, A, Ax<N>>>>;
      Graph& g = x.graph();
      Node f;
      f.op = Op::fill;
      f.axes = x.node().axes;
      for (auto& a : f.axes)
        if (a.name == A::name) a.extent = Extent::fixed(N);
      f.dtype = X::dtype::value;
      f.scalar = value;
      const int tail = g.add(std::move(f));
      return tensor<typename X::dtype, Out, typename X::trait_type>(
          g, g.add(detail::concat_node(x, tail, A::name, Extent::fixed(N))));
    }
  }
}

}  // namespace qkv
