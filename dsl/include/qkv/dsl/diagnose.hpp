// qkv/dsl/diagnose.hpp — how the DSL reports a shape mistake: one diagnostic, qkv's own text
// on the first `error:` line, and nothing after it.
//
// Every op checks its operands up front. On the first violated check it calls
// `qkv::fail<Message>()` and returns `qkv::poison`. Poison never speaks again: every op, output(),
// input(), the building blocks and conversions to declared tensor types accept it silently and
// give poison back; a building block whose make() failed is poison and may be called; poison
// decomposes like the {out, weights} pair the blocks return. So one mistake prints one
// diagnostic, in every coding style (auto, declared types, lambdas, building blocks).
//
// `fail` has a deduced return type on purpose: the compiler must instantiate it where it is
// called (to learn the type), so the message is printed at the mistake, before anything the
// compiler finds later in the same file. (With a declared return type, g++ defers the body to
// the end of the file and prints unrelated later errors first.)
//
// How the message reaches the first `error:` line depends on the compiler:
//   * C++26 `static_assert` with a computed message (P2741; clang >= 17 and gcc >= 14 in
//     -std=c++2c):      error: static assertion failed: softmax: ...
//   * g++ in C++20:     error: use of deleted function 'void qkv::shape_error() [with ... =
//                       fixed_string<..>{"softmax: ..."}]'   (the message is printed whole)
//   * clang in C++20:   clang elides NTTP strings after 36 characters, so the full message needs
//                       -std=c++2c; the C++20 fallback shows the start of it and says so.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>

#include <qkv/dsl/fixed_string.hpp>

namespace qkv {

/// What an op returns after it reported a shape error: accepted silently by every op and
/// convertible to anything, so one mistake produces one diagnostic.
struct poison {
  template <class T>
  operator T() const;  // NOLINT(google-explicit-constructor): never defined; the program never links

  /// A building block whose make() failed is poison: calling it gives poison.
  template <class... A>
  poison operator()(const A&... /*unused*/) const {
    return {};
  }
  template <class... A>
  poison cross(const A&... /*unused*/) const {
    return {};
  }

  /// The blocks return {out, weights}: `auto [out, weights] = block(x)` and `block(x).first`.
  template <std::size_t I>
  [[nodiscard]] poison get() const {
    return {};
  }
  static const poison first;
  static const poison second;
};
inline const poison poison::first{};
inline const poison poison::second{};

template <class T>
inline constexpr bool is_poison = std::is_same_v<std::remove_cvref_t<T>, poison>;

template <class... T>
inline constexpr bool any_poison = (is_poison<T> || ...);

namespace detail {
template <auto>
inline constexpr bool always_false = false;
}  // namespace detail

/// The compiler prints the message of a shape error as (part of) its error line.
template <fixed_string Message>
void shape_error() = delete;

template <fixed_string Message>
constexpr auto fail() {
#if defined(__cpp_static_assert) && __cpp_static_assert >= 202306L
  static_assert(false, Message);  // P2593: allowed in a template, fires on instantiation
#elif defined(__clang__)
  static_assert(detail::always_false<Message>, "qkv shape error; clang prints the whole message with -std=c++2c");
#else
  shape_error<Message>();
#endif
  return poison{};
}

}  // namespace qkv

template <>
struct std::tuple_size<qkv::poison> : std::integral_constant<std::size_t, 2> {};
template <std::size_t I>
struct std::tuple_element<I, qkv::poison> {
  using type = qkv::poison;
};
