// qkv/dsl/fixed_string.hpp — compile-time strings: axis names as template arguments, and the
// text of shape diagnostics assembled from axis names and sizes at compile time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qkv {

template <std::size_t N>
struct fixed_string {
  char chars[N]{};  // NUL-terminated

  constexpr fixed_string() = default;
  constexpr fixed_string(const char (&s)[N]) {  // NOLINT(google-explicit-constructor)
    for (std::size_t i = 0; i < N; ++i) chars[i] = s[i];
  }
  [[nodiscard]] constexpr std::size_t size() const { return N - 1; }
  [[nodiscard]] constexpr const char* data() const { return chars; }
  [[nodiscard]] constexpr std::string_view view() const { return {chars, N - 1}; }
  [[nodiscard]] std::string str() const { return std::string(view()); }

  template <std::size_t M>
  constexpr bool operator==(const fixed_string<M>& o) const {
    return view() == o.view();
  }
};

template <std::size_t A, std::size_t B>
constexpr fixed_string<A + B - 1> operator+(const fixed_string<A>& a, const fixed_string<B>& b) {
  fixed_string<A + B - 1> r;
  for (std::size_t i = 0; i < A - 1; ++i) r.chars[i] = a.chars[i];
  for (std::size_t i = 0; i < B; ++i) r.chars[A - 1 + i] = b.chars[i];
  return r;
}
template <std::size_t A, std::size_t B>
constexpr auto operator+(const fixed_string<A>& a, const char (&b)[B]) {
  return a + fixed_string<B>(b);
}
template <std::size_t A, std::size_t B>
constexpr auto operator+(const char (&a)[A], const fixed_string<B>& b) {
  return fixed_string<A>(a) + b;
}

namespace detail {
constexpr std::size_t decimal_digits(std::int64_t v) {
  std::size_t n = v < 0 ? 2 : 1;
  for (v = v < 0 ? -v : v; v >= 10; v /= 10) ++n;
  return n;
}
}  // namespace detail

/// The decimal text of V as a fixed_string: number<512>() == "512".
template <std::int64_t V>
constexpr auto number() {
  constexpr std::size_t n = detail::decimal_digits(V);
  fixed_string<n + 1> r;
  std::int64_t v = V < 0 ? -V : V;
  for (std::size_t i = n; i-- > (V < 0 ? 1u : 0u); v /= 10) r.chars[i] = static_cast<char>('0' + v % 10);
  if (V < 0) r.chars[0] = '-';
  return r;
}

}  // namespace qkv
