// Philox-4x32-10: Random123 known answers and the word layout of the batch stream.
#include "s3r/rng/philox.hpp"

#include <gtest/gtest.h>

#include "test_util.hpp"

namespace s3r {
namespace {

TEST(Philox, Random123KnownAnswers) {
  const auto lines = testing::read_kat_file(testing::kat_path());
  int checked = 0;
  for (const auto& k : lines) {
    if (k.name != "philox4x32") continue;
    ASSERT_EQ(k.words.size(), 10u) << "malformed KAT line";
    // Format: counter (4 words), key (2 words), expected (4 words).
    const std::array<uint32_t, 4> ctr{k.words[0], k.words[1], k.words[2], k.words[3]};
    const auto y = philox4x32_rounds(PhiloxKey{k.words[4], k.words[5]}, ctr, k.rounds);
    for (int w = 0; w < 4; ++w) {
      EXPECT_EQ(y[w], k.words[6 + w]) << "rounds " << k.rounds << " word " << w;
    }
    if (k.rounds == 10) {
      EXPECT_EQ(philox4x32(PhiloxKey{k.words[4], k.words[5]}, ctr), y);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 6) << "expected 6 philox4x32 vectors in " << testing::kat_path();
}

TEST(Philox, StreamLayout) {
  const PhiloxKey key{0xdeadbeefu, 0x01234567u};
  const uint64_t block = (uint64_t{3} << 32) | 9u;
  const auto y = philox4x32(key, {9u, 3u, 0u, 0u});
  for (uint64_t w = 0; w < 4; ++w) EXPECT_EQ(philox_bits32(key, block * 4 + w), y[w]) << w;
}

}  // namespace
}  // namespace s3r
