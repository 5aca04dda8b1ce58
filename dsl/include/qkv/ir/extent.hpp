// qkv/ir/extent.hpp — axis extents in the Graph IR: static numbers or symbolic sizes bound at run time.
//
// Plain data, no templates over axes: codegen and the runtime read these without Boost.Hana.
#pragma once

#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include <qkv/ir/error.hpp>

namespace qkv {

/// Concrete sizes for the symbolic extents of a graph, by symbol name (e.g. {"Seq", 128}).
using Bindings = std::map<std::string, std::int64_t, std::less<>>;

/// An extent is either static (`value`) or symbolic: `symbol * num / den + plus` with the symbol
/// bound at run time (splitting a dynamic axis into a static factor gives `Seq * 1 / 4`, merging
/// gives `Seq * 4 / 1`, appending a bias row gives `Seq + 1`). Only extents derived from one
/// symbol are representable; that is all the DSL produces.
struct Extent {
  std::int64_t value = 0;  // the size when static
  std::string symbol;      // non-empty when dynamic
  std::int64_t num = 1;
  std::int64_t den = 1;
  std::int64_t plus = 0;

  static Extent fixed(std::int64_t v) { return Extent{v, {}, 1, 1, 0}; }
  static Extent dynamic(std::string sym) { return Extent{0, std::move(sym), 1, 1, 0}; }

  [[nodiscard]] bool is_static() const { return symbol.empty(); }
  [[nodiscard]] bool is_dynamic() const { return !symbol.empty(); }

  /// The concrete size under `b`; nullopt if the symbol is unbound.
  [[nodiscard]] std::optional<std::int64_t> resolve(const Bindings& b) const {
    if (is_static()) return value;
    auto it = b.find(symbol);
    if (it == b.end()) return std::nullopt;
    return it->second * num / den + plus;
  }

  /// "16" for static extents, "Seq?" / "Seq?/4" / "Seq?*4" for dynamic ones: the question mark
  /// keeps run-time sizes visibly apart from compile-time ones.
  [[nodiscard]] std::string str() const {
    if (is_static()) return std::to_string(value);
    // Appended piece by piece: `"*" + std::to_string(n)` makes g++ 12 -O3 warn -Wrestrict (a
    // false positive in its inlined memcpy, GCC bug 105329).
    std::string s = symbol;
    s.push_back('?');
    auto part = [&s](char sign, std::int64_t v) {
      if (sign) s.push_back(sign);
      s.append(std::to_string(v));
    };
    if (num != 1) part('*', num);
    if (den != 1) part('/', den);
    if (plus != 0) part(plus > 0 ? '+' : '\0', plus);
    return s;
  }

  [[nodiscard]] Extent times(std::int64_t k) const {
    Extent e = *this;
    if (is_static()) {
      e.value *= k;
    } else {
      e.num *= k;
      e.plus *= k;
      e.reduce();
    }
    return e;
  }
  [[nodiscard]] Extent divided(std::int64_t k) const {
    Extent e = *this;
    if (is_static()) {
      e.value /= k;
    } else {
      if (plus % k != 0) internal_error("cannot divide " + str() + " by " + std::to_string(k));
      e.den *= k;
      e.plus /= k;
      e.reduce();
    }
    return e;
  }

  /// The extent of two parts laid end to end (concat/append): static + static stays static; a
  /// dynamic part plus a static one shifts `plus`; two dynamic parts must share their symbol.
  [[nodiscard]] Extent plus_extent(const Extent& o) const {
    if (is_static() && o.is_static()) return fixed(value + o.value);
    if (o.is_static()) {
      Extent e = *this;
      e.plus += o.value;
      return e;
    }
    if (is_static()) return o.plus_extent(*this);
    if (symbol == o.symbol && den == o.den) {
      Extent e = *this;
      e.num += o.num;
      e.plus += o.plus;
      return e;
    }
    internal_error("cannot add extents " + str() + " and " + o.str());
  }

  friend bool operator==(const Extent&, const Extent&) = default;

 private:
  /// num/den in lowest terms, so equal sizes compare equal (Model?*2/2 is Model?).
  void reduce() {
    const std::int64_t g = std::gcd(num, den);
    if (g > 1) {
      num /= g;
      den /= g;
    }
  }
};

}  // namespace qkv
