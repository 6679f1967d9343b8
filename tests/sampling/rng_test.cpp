#include "sampling/rng.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

namespace shardline::sampling {
namespace sampling_rng_test {

// Known-answer vectors from Random123's kat_vectors (philox4x32 10 rounds).
TEST(Philox, KnownAnswerZero) {
  const PhiloxCounter out = philox4x32_10({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(out, (PhiloxCounter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
}

TEST(Philox, KnownAnswerOnes) {
  const PhiloxCounter out =
      philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(out, (PhiloxCounter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(Philox, KnownAnswerPi) {
  const PhiloxCounter out =
      philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u});
  EXPECT_EQ(out, (PhiloxCounter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, IsConstexpr) {
  static_assert(philox4x32_10({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5u);
  SUCCEED();
}

TEST(Philox, UnitFloatRange) {
  EXPECT_EQ(u32_to_unit_float(0u), 0.0f);
  EXPECT_LT(u32_to_unit_float(0xffffffffu), 1.0f);
  EXPECT_FLOAT_EQ(u32_to_unit_float(0x80000000u), 0.5f);
}

// philox_uniform keys Philox with the seed and counts with {position lo,
// position hi, stream, 0}, then maps word 0. The words below come from an
// independent Philox4x32-10 (written from the Random123 spec in Python and
// checked against the three known-answer vectors above).
TEST(Philox, UniformKnownValues) {
  EXPECT_EQ(philox_uniform(0, 0), u32_to_unit_float(0x6627e8d5u));  // the zero KAT vector's word 0
  EXPECT_EQ(philox_uniform(42, 7), u32_to_unit_float(0x5bbd83b1u));
  EXPECT_EQ(philox_uniform(42, 8), u32_to_unit_float(0x8c4a529cu));
  EXPECT_EQ(philox_uniform(43, 7), u32_to_unit_float(0x80f7e4c9u));
  EXPECT_EQ(philox_uniform(42, 7, 1), u32_to_unit_float(0x4c78c45fu));
  EXPECT_EQ(philox_uniform(1ull << 32, 7), u32_to_unit_float(0xe62a60c3u));
  EXPECT_EQ(philox_uniform(1, 1ull << 32), u32_to_unit_float(0x833ff8dcu));
  EXPECT_EQ(philox_uniform(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, 0x13198a2eu),
            u32_to_unit_float(0xae120e9du));
  EXPECT_EQ(philox_uniform(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, 0x13198a2eu),
            u32_to_unit_float(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0u},
                                            {0xa4093822u, 0x299f31d0u})[0]));
}

TEST(Philox, DistinctKeysAndCountersDistinctValues) {
  EXPECT_NE(philox_uniform(42, 7), philox_uniform(42, 8));
  EXPECT_NE(philox_uniform(42, 7), philox_uniform(43, 7));
  EXPECT_NE(philox_uniform(42, 7, 0), philox_uniform(42, 7, 1));
  EXPECT_NE(philox_uniform(1ull << 32, 7), philox_uniform(0, 7));  // high seed bits matter
  EXPECT_NE(philox_uniform(1, 1ull << 32), philox_uniform(1, 0));  // high position bits matter
}

// mix_seed is a hash-combine step followed by the SplitMix64 finalizer
// (Steele, Lea, Flood, OOPSLA'14; Vigna's splitmix64.c). mix_seed(0, 0)
// finalizes the golden gamma, which is SplitMix64's first output from state 0:
// 0xe220a8397b1dcdaf. The other values come from the same independent Python
// implementation as the Philox words above.
TEST(MixSeed, KnownValues) {
  EXPECT_EQ(mix_seed(0, 0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(mix_seed(42, 7), 0x00dca12dcaa9cc19ull);
  EXPECT_NE(mix_seed(42, 7), mix_seed(7, 42));
}

TEST(Philox, UniformOverPositionsChiSquare) {
  constexpr int kBins = 32, kDraws = 320000;
  std::vector<int> counts(kBins, 0);
  double sum = 0.0;
  for (int p = 0; p < kDraws; ++p) {
    const float u = philox_uniform(12345, static_cast<std::uint64_t>(p));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    ++counts[static_cast<int>(u * kBins)];
  }
  const double expected = double(kDraws) / kBins;
  double chi2 = 0.0;
  for (int c : counts) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 61.1);  // 31 dof, p = 0.001
  EXPECT_NEAR(sum / kDraws, 0.5, 0.003);
}

TEST(Philox, UniformOverSeeds) {
  constexpr int kBins = 16, kDraws = 160000;
  std::vector<int> counts(kBins, 0);
  for (int s = 0; s < kDraws; ++s) ++counts[static_cast<int>(philox_uniform(mix_seed(0, s), 5) * kBins)];
  const double expected = double(kDraws) / kBins;
  double chi2 = 0.0;
  for (int c : counts) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 37.7);  // 15 dof, p = 0.001
}

}  // namespace
}  // namespace shardline::sampling
