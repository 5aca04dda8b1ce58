// qkv/dsl/diagnose.hpp — how the DSL reports a shape mistake: one diagnostic, qkv's own text
// on the first `error:` line, and nothing after it.
//
// Every op checks its operands up front. On the first violated check it calls
// `qkv::fail<Message>()` and returns `qkv::poison`; every op accepts a poison operand and
// returns poison without checking anything, and poison converts to any type, so no template
// backtrace or follow-on error is printed for the same mistake.
//
// How the message reaches the first `error:` line depends on the compiler:
//   * C++26 `static_assert` with a computed message (P2741; clang >= 17 and gcc >= 14 in
//     -std=c++2c):      error: static assertion failed: softmax: ...
//   * g++ in C++20:     error: use of deleted function 'void qkv::shape_error() [with ... =
//                       fixed_string<..>{"softmax: ..."}]'   (the message is printed whole)
//   * clang in C++20:   clang elides NTTP strings after 36 characters, so the full message needs
//                       -std=c++2c; the C++20 fallback shows the start of it and says so.
#pragma once

#include <qkv/dsl/fixed_string.hpp>

namespace qkv {

/// What an op returns after it reported a shape error: accepted silently by every op and
/// convertible to anything, so one mistake produces one diagnostic.
struct poison {
  template <class T>
  operator T() const;  // NOLINT(google-explicit-constructor): never defined, never odr-used
};

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
constexpr poison fail() {
#if defined(__cpp_static_assert) && __cpp_static_assert >= 202306L
  static_assert(false, Message);  // P2593: allowed in a template, fires on instantiation
#elif defined(__clang__)
  static_assert(detail::always_false<Message>, "qkv shape error; clang prints the whole message with -std=c++2c");
#else
  shape_error<Message>();
#endif
  return {};
}

}  // namespace qkv
