// The counter-based dropout generator: known answers, and the statistics dropout relies on.
#include <gtest/gtest.h>

#include <cmath>

#include <qkv/runtime/rng.hpp>

namespace qkv {
namespace {

// Known-answer vectors for Philox4x32-10 published with Random123 (kat_vectors).
TEST(Philox, MatchesRandom123KnownAnswers) {
  using A = std::array<std::uint32_t, 4>;
  EXPECT_EQ(philox4x32(A{0, 0, 0, 0}, 0), (A{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32(A{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0xffffffffffffffffull),
            (A{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32(A{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0x299f31d0a4093822ull),
            (A{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Dropout, UniformIsInUnitIntervalAndDeterministic) {
  for (std::uint32_t i = 0; i < 1000; ++i) {
    const float u = dropout_uniform(42, 1, 2, i, i * 7);
    EXPECT_GE(u, 0.0f);
    EXPECT_LT(u, 1.0f);
    EXPECT_EQ(u, dropout_uniform(42, 1, 2, i, i * 7));
  }
}

TEST(Dropout, KeepRateIsOneMinusP) {
  for (double p : {0.1, 0.5, 0.9}) {
    const int n = 512;
    long kept = 0;
    for (std::uint32_t r = 0; r < n; ++r)
      for (std::uint32_t c = 0; c < n; ++c) kept += dropout_keep(p, 7, 0, 0, r, c);
    const double rate = static_cast<double>(kept) / (n * n);
    const double sigma = std::sqrt(p * (1 - p) / (n * n));
    EXPECT_NEAR(rate, 1.0 - p, 6 * sigma) << "p=" << p;
  }
}

TEST(Dropout, SeedsGiveIndependentMasks) {
  // Agreement between two independent masks with keep-rate 1/2 is 1/2.
  const int n = 512;
  long agree = 0;
  for (std::uint32_t r = 0; r < n; ++r)
    for (std::uint32_t c = 0; c < n; ++c) agree += dropout_keep(0.5, 1, 0, 0, r, c) == dropout_keep(0.5, 2, 0, 0, r, c);
  EXPECT_NEAR(static_cast<double>(agree) / (n * n), 0.5, 6 * 0.5 / n);
}

}  // namespace
}  // namespace qkv
