// qkv/ir/hash.hpp — the one hash qkv uses for cache keys: 64-bit FNV-1a over the bytes of the
// values mixed in, in order (Graph::hash, the kernels' spec hashes, the PTX cache). Stable across
// runs and processes; not for adversarial input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace qkv {

class Fnv1a {
 public:
  Fnv1a& bytes(const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      h_ ^= c[i];
      h_ *= 1099511628211ull;
    }
    return *this;
  }
  Fnv1a& i(std::int64_t v) { return bytes(&v, sizeof v); }
  Fnv1a& d(double v) { return bytes(&v, sizeof v); }
  /// The length, then the characters (so "ab"+"c" and "a"+"bc" differ).
  Fnv1a& str(std::string_view s) {
    i(static_cast<std::int64_t>(s.size()));
    return bytes(s.data(), s.size());
  }
  [[nodiscard]] std::uint64_t value() const { return h_; }

 private:
  std::uint64_t h_ = 1469598103934665603ull;
};

}  // namespace qkv
