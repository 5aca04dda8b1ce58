#include <qkv/runtime/rng.hpp>

namespace qkv {

namespace {
// The Philox4x32 constants from the paper (Random123): two round multipliers and the two Weyl
// increments that bump the key between rounds.
constexpr std::uint32_t kMul0 = 0xD2511F53u;
constexpr std::uint32_t kMul1 = 0xCD9E8D57u;
constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1
constexpr int kRounds = 10;

void mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}
}  // namespace

std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> c, std::uint64_t key) {
  std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int r = 0; r < kRounds; ++r) {
    std::uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c[0], hi0, lo0);
    mulhilo(kMul1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

float dropout_uniform(std::uint64_t seed, std::uint32_t batch, std::uint32_t head, std::uint32_t row,
                      std::uint32_t col) {
  const auto out = philox4x32({row, col, head, batch}, seed);
  // The top 24 bits give a float in [0, 1) exactly: 2^-24 steps, no rounding up to 1.
  return static_cast<float>(out[0] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace qkv
