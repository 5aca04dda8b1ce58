// qkv/dsl/axis.hpp — named axes whose names are types and whose extents are static or dynamic.
//
//   QKV_AXIS(Seq);            // declares the axis family `Seq`
//   Seq<128>                  // a static extent (checked at compile time)
//   Seq<dyn> / Seq<>          // a dynamic extent (bound at run time; checks become ShapeErrors)
//
// Axes are compared by name; an axis family passed to an op (`softmax<Key>`) is a template
// template argument. Static extents print as numbers (`Model<512>`) and dynamic ones as
// `Seq<qkv::dyn_t::dyn>` in compiler output, and as `Seq?` in shape tables.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include <boost/hana/any_of.hpp>
#include <boost/hana/at.hpp>
#include <boost/hana/count_if.hpp>
#include <boost/hana/filter.hpp>
#include <boost/hana/find_if.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>
#include <boost/hana/unpack.hpp>

#include <qkv/dsl/fixed_string.hpp>
#include <qkv/ir/graph.hpp>

namespace qkv {

namespace hana = boost::hana;

/// The extent of an axis that is only known at run time.
enum class dyn_t { dyn };
inline constexpr dyn_t dyn = dyn_t::dyn;

/// Whether an extent argument (a number or qkv::dyn) is dynamic.
template <auto N>
inline constexpr bool is_dyn = std::is_same_v<std::remove_cv_t<decltype(N)>, dyn_t>;

/// Extent arithmetic on template arguments: dynamic if either side is.
template <auto A, auto B>
consteval auto extent_mul() {
  if constexpr (is_dyn<A> || is_dyn<B>)
    return dyn;
  else
    return A * B;
}
template <auto A, auto B>
consteval auto extent_div() {
  if constexpr (is_dyn<A> || is_dyn<B>)
    return dyn;
  else
    return A / B;
}

template <fixed_string Name, auto N>
struct axis {
  static constexpr auto name_fs = Name;
  static constexpr auto param = N;  // the template argument as written: a number or qkv::dyn
  static constexpr std::string_view name = Name.view();
  static constexpr bool is_static = !std::is_same_v<decltype(N), dyn_t>;
  static constexpr std::int64_t extent = [] {
    if constexpr (is_static)
      return static_cast<std::int64_t>(N);
    else
      return std::int64_t{-1};
  }();
  static_assert(!is_static || extent > 0, "qkv: a static axis extent must be positive");
};

/// Declares an axis family: `QKV_AXIS(Heads);` then `Heads<8>` or `Heads<dyn>`.
#define QKV_AXIS(NAME)                  \
  template <auto N = ::qkv::dyn>        \
  struct NAME : ::qkv::axis<#NAME, N> { \
    template <auto M>                   \
    using resized = NAME<M>;            \
  }

/// Any type declared with QKV_AXIS.
template <class A>
concept AxisType = requires {
  { A::name } -> std::convertible_to<std::string_view>;
  A::is_static;
  A::extent;
  typename A::template resized<1>;
};

/// The axis family F's name (F is a template template argument such as `Key`).
template <template <auto> class F>
inline constexpr std::string_view family_name = F<dyn>::name;
template <template <auto> class F>
inline constexpr auto family_name_fs = F<dyn>::name_fs;

template <class A, class B>
inline constexpr bool same_name = A::name == B::name;

template <class A, template <auto> class F>
inline constexpr bool is_family = A::name == family_name<F>;

/// An ordered list of axis types.
template <class... A>
struct axes {
  static constexpr std::size_t size = sizeof...(A);
  static constexpr auto types = hana::tuple_t<A...>;
};

/// Concatenation of axis lists (used when building result types).
template <class... A, class... B>
constexpr axes<A..., B...> operator+(axes<A...>, axes<B...>) {
  return {};
}

namespace detail {
template <class L>
struct list_ops;
template <class... X>
struct list_ops<axes<X...>> {
  template <template <auto> class F>
  static constexpr std::size_t count_family = (std::size_t{0} + ... + (is_family<X, F> ? 1u : 0u));
  template <class A>
  static constexpr bool has_named = (same_name<X, A> || ...);
  template <class Drop>
  using without = decltype((axes<>{} + ... + std::conditional_t<Drop::template has<X>, axes<>, axes<X>>{}));
};

template <class Pred, class... X>
struct first_match;
template <class Pred>
struct first_match<Pred> {
  using type = void;
};
template <class Pred, class X, class... Rest>
struct first_match<Pred, X, Rest...> {
  using type = std::conditional_t<Pred::template test<X>, X, typename first_match<Pred, Rest...>::type>;
};
template <template <auto> class F>
struct family_pred {
  template <class X>
  static constexpr bool test = is_family<X, F>;
};
template <class A>
struct name_pred {
  template <class X>
  static constexpr bool test = same_name<X, A>;
};
template <class L, class Pred>
struct find_in;
template <class... X, class Pred>
struct find_in<axes<X...>, Pred> {
  using type = typename first_match<Pred, X...>::type;
};
}  // namespace detail

/// Number of axes in L named like F.
template <class L, template <auto> class F>
inline constexpr std::size_t count_family = detail::list_ops<L>::template count_family<F>;

template <class L, template <auto> class F>
inline constexpr bool has_family = count_family<L, F> > 0;

template <class L, class A>
inline constexpr bool has_axis_named = detail::list_ops<L>::template has_named<A>;

/// The axis of L named like F (void when L has none).
template <class L, template <auto> class F>
using find_family = typename detail::find_in<L, detail::family_pred<F>>::type;

/// The axis of L named like A (void when L has none).
template <class L, class A>
using find_named = typename detail::find_in<L, detail::name_pred<A>>::type;

namespace detail {
template <class L>
struct membership {
  template <class X>
  static constexpr bool has = has_axis_named<L, X>;
};
}  // namespace detail

/// L without the axes whose names appear in Drop.
template <class L, class Drop>
using without = typename detail::list_ops<L>::template without<detail::membership<Drop>>;

namespace detail {
template <class L, class A>
struct index_of_impl;
template <class... X, class A>
struct index_of_impl<axes<X...>, A> {
  static constexpr std::size_t value = [] {
    constexpr bool match[] = {same_name<X, A>..., true};
    std::size_t i = 0;
    while (!match[i]) ++i;
    return i;
  }();
};
}  // namespace detail

/// Position of the axis named like A in L (L::size when absent).
template <class L, class A>
inline constexpr std::size_t index_of = detail::index_of_impl<L, A>::value;

/// The I-th axis of L.
template <class L, std::size_t I>
using axis_at = typename decltype(+hana::at_c<I>(L::types))::type;

template <class... L>
struct concat_axes_impl;
template <class... A, class... B>
struct concat_axes_impl<axes<A...>, axes<B...>> {
  using type = axes<A..., B...>;
};
template <class L1, class L2>
using concat_axes = typename concat_axes_impl<L1, L2>::type;

// --- text of axis lists, for diagnostics ---------------------------------------------------

/// "64" for static extents, "dyn" for dynamic ones.
template <class A>
constexpr auto extent_fs() {
  if constexpr (A::is_static)
    return number<A::extent>();
  else
    return fixed_string("dyn");
}

/// "Seq=4" / "Seq=dyn"
template <class A>
constexpr auto axis_fs() {
  return A::name_fs + fixed_string("=") + extent_fs<A>();
}

/// "[Batch=2, Seq=4, Model=16]"
template <class L>
constexpr auto axes_fs() {
  return hana::unpack(L::types, [](auto... t) {
    if constexpr (sizeof...(t) == 0) {
      return fixed_string("[]");
    } else {
      return [](auto first, auto... rest) {
        return ((fixed_string("[") + first) + ... + (fixed_string(", ") + rest)) + fixed_string("]");
      }(axis_fs<typename decltype(t)::type>()...);
    }
  });
}

/// "Batch, Seq, Model" (names only, as in a template argument list)
template <class L>
constexpr auto names_fs() {
  return hana::unpack(L::types, [](auto first, auto... rest) {
    return (decltype(first)::type::name_fs + ... + (fixed_string(", ") + decltype(rest)::type::name_fs));
  });
}

/// "Heads<2>" / "Seq<dyn>" — the axis as it is written in code.
template <class A>
constexpr auto axis_decl_fs() {
  return A::name_fs + fixed_string("<") + extent_fs<A>() + fixed_string(">");
}

/// "Heads<2>, HeadDim<8>"
template <class L>
constexpr auto decls_fs() {
  return hana::unpack(L::types, [](auto first, auto... rest) {
    return (axis_decl_fs<typename decltype(first)::type>() + ... +
            (fixed_string(", ") + axis_decl_fs<typename decltype(rest)::type>()));
  });
}

// --- conversion to the Graph IR -------------------------------------------------------------

template <class A>
Extent ir_extent() {
  if constexpr (A::is_static)
    return Extent::fixed(A::extent);
  else
    return Extent::dynamic(std::string(A::name));
}

namespace detail {
/// ir_axes' run-time half, one copy per program: extents[i] < 0 is a dynamic extent whose size
/// symbol is names[i].
[[gnu::noinline]] inline std::vector<Axis> ir_axes_of(const std::string_view* names, const std::int64_t* extents,
                                                      std::size_t n) {
  std::vector<Axis> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    out.push_back(Axis{std::string(names[i]),
                       extents[i] < 0 ? Extent::dynamic(std::string(names[i])) : Extent::fixed(extents[i])});
  return out;
}
template <class... A>
struct ir_axes_data {
  static constexpr std::string_view names[sizeof...(A) + 1] = {A::name..., ""};
  static constexpr std::int64_t extents[sizeof...(A) + 1] = {A::extent..., 0};
};
}  // namespace detail

template <class... A>
std::vector<Axis> ir_axes(axes<A...>) {
  using data = detail::ir_axes_data<A...>;
  return detail::ir_axes_of(data::names, data::extents, sizeof...(A));
}

}  // namespace qkv
