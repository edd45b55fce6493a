// Threefry-2x32 and JAX's key handling: Random123 known answers and JAX's own outputs.
#include "s3r/rng/threefry.hpp"

#include <gtest/gtest.h>

#include <string>

#include "test_util.hpp"

namespace s3r {
namespace {

// The constexpr functions work at compile time (later code builds keys in constant expressions).
static_assert(threefry2x32(Key{0, 0}, 0, 0)[0] == 0x6b200159u);
static_assert(threefry2x32(Key{0, 0}, 0, 0)[1] == 0x99ba4efeu);
static_assert(random_bits32(key_from_seed(0), 0) == 4070199207u);

TEST(Threefry, Random123KnownAnswers) {
  const auto lines = testing::read_kat_file(testing::kat_path());
  int checked = 0;
  for (const auto& k : lines) {
    if (k.name != "threefry2x32") continue;
    ASSERT_EQ(k.words.size(), 6u) << "malformed KAT line";
    // Format: counter (2 words), key (2 words), expected (2 words).
    const auto y = threefry2x32_rounds(Key{k.words[2], k.words[3]}, k.words[0], k.words[1], k.rounds);
    EXPECT_EQ(y[0], k.words[4]) << "rounds " << k.rounds << " counter " << std::hex << k.words[0];
    EXPECT_EQ(y[1], k.words[5]) << "rounds " << k.rounds << " counter " << std::hex << k.words[0];
    if (k.rounds == 20) {
      EXPECT_EQ(threefry2x32(Key{k.words[2], k.words[3]}, k.words[0], k.words[1]), y);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 6) << "expected 6 threefry2x32 vectors in " << testing::kat_path();
}

TEST(Threefry, SpecKnownAnswers) {
  EXPECT_EQ(threefry2x32(Key{0x13198a2e, 0x03707344}, 0x243f6a88, 0x85a308d3),
            (std::array<uint32_t, 2>{0xc4923a9c, 0x483df7a0}));
}

// jax.random.bits and jax.random.uniform (partitionable layout), tests/known_answers/jax_threefry.txt.
TEST(Threefry, JaxKnownAnswers) {
  const auto lines = testing::read_jax_file(testing::jax_path());
  int bits = 0, uniforms = 0;
  for (const auto& j : lines) {
    const uint32_t word = random_bits32(key_from_seed(j.seed), j.index);
    if (j.kind == "bits32") {
      EXPECT_EQ(word, static_cast<uint32_t>(std::stoul(j.expected))) << "seed " << j.seed << " index " << j.index;
      ++bits;
    } else if (j.kind == "uniform") {
      // The file names a float32 by decimal digits: round them to float32, then compare exactly.
      EXPECT_EQ(uniform23(word), std::stof(j.expected)) << "seed " << j.seed << " index " << j.index;
      ++uniforms;
    } else {
      ADD_FAILURE() << "unknown kind " << j.kind << " in " << testing::jax_path();
    }
  }
  EXPECT_EQ(bits, 12) << "expected 12 bits32 vectors in " << testing::jax_path();
  EXPECT_EQ(uniforms, 8) << "expected 8 uniform vectors in " << testing::jax_path();
}

TEST(Threefry, KeysAndFoldIn) {
  EXPECT_EQ(key_from_seed(42), (Key{0u, 42u}));
  const auto y = threefry2x32(key_from_seed(7), 0, 3);
  EXPECT_EQ(fold_in(key_from_seed(7), 3), (Key{y[0], y[1]}));
  EXPECT_NE(fold_in(key_from_seed(7), 3), fold_in(key_from_seed(7), 4));
  EXPECT_NE(fold_in(key_from_seed(7), 3), fold_in(key_from_seed(8), 3));
}

// The flat index is split as (hi32, lo32): indices past 2^32 use the high counter word.
TEST(Threefry, FlatIndexSplit) {
  const Key key{0x12345678u, 0x9abcdef0u};
  const uint64_t i = (uint64_t{5} << 32) | 17u;
  const auto y = threefry2x32(key, 5u, 17u);
  EXPECT_EQ(random_bits32(key, i), y[0] ^ y[1]);
  EXPECT_NE(random_bits32(key, i), random_bits32(key, 17u));
}

TEST(Threefry, Uniform23Mapping) {
  EXPECT_EQ(uniform23(0u), 0.0f);
  EXPECT_EQ(uniform23(0xFFFFFFFFu), 1.0f - 0x1p-23f);
  EXPECT_EQ(uniform23(1u << 9), 0x1p-23f);
  EXPECT_EQ(uniform23(0x80000000u), 0.5f);
}

}  // namespace
}  // namespace s3r
