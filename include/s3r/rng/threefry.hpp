#pragma once
// Threefry-2x32-20 (Salmon et al., Random123) and JAX's key handling, bit-compatible with
// jax.random in its default "partitionable" layout (jax_threefry_partitionable=True, the default
// since JAX 0.5). SPEC section 3.
//
// random_bits32(key, i) depends only on (key, i): any split of a tensor over threads, ranks or
// shards gives bitwise-identical bits with no communication. The span overload is the
// vectorized (AVX-512: 16 lanes, AVX2: 8) and OpenMP-threaded batch form; it equals the scalar function
// element for element, for any thread count.
#include <array>
#include <cstdint>
#include <span>

namespace s3r {

struct Key {
  uint32_t k0, k1;
  friend constexpr bool operator==(Key, Key) = default;
};

namespace threefry_detail {
constexpr uint32_t rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }
inline constexpr int kRotations[8] = {13, 15, 26, 6, 17, 29, 16, 24};
inline constexpr uint32_t kParity = 0x1BD11BDAu;  // Skein key-schedule parity constant
}  // namespace threefry_detail

// Threefry-2x32 with `rounds` rounds (20 is the standard; 13 is Random123's reduced variant,
// offered only for its known answers). Key injection after every 4 rounds.
constexpr std::array<uint32_t, 2> threefry2x32_rounds(Key key, uint32_t c0, uint32_t c1,
                                                      int rounds) {
  using namespace threefry_detail;
  const uint32_t ks[3] = {key.k0, key.k1, key.k0 ^ key.k1 ^ kParity};
  uint32_t x0 = c0 + ks[0];
  uint32_t x1 = c1 + ks[1];
  for (int r = 0; r < rounds; ++r) {
    x0 += x1;
    x1 = rotl(x1, kRotations[r % 8]);
    x1 ^= x0;
    if (r % 4 == 3) {
      const uint32_t s = static_cast<uint32_t>(r / 4 + 1);  // injection number
      x0 += ks[s % 3];
      x1 += ks[(s + 1) % 3] + s;
    }
  }
  return {x0, x1};
}

constexpr std::array<uint32_t, 2> threefry2x32(Key key, uint32_t c0, uint32_t c1) {
  return threefry2x32_rounds(key, c0, c1, 20);
}

// jax.random.key(seed) for a 32-bit seed: (0, seed).
constexpr Key key_from_seed(uint32_t seed) { return Key{0u, seed}; }

// jax.random.fold_in(key, data) = threefry2x32(key, (0, data)).
constexpr Key fold_in(Key key, uint32_t data) {
  const auto y = threefry2x32(key, 0u, data);
  return Key{y[0], y[1]};
}

// jax.random.bits(key, shape, uint32) element `flat_index` (row-major) in the partitionable
// layout: y0 ^ y1 of threefry2x32(key, (hi32(i), lo32(i))).
constexpr uint32_t random_bits32(Key key, uint64_t flat_index) {
  const auto y = threefry2x32(key, static_cast<uint32_t>(flat_index >> 32),
                              static_cast<uint32_t>(flat_index));
  return y[0] ^ y[1];
}

// out[j] = random_bits32(key, first_index + j) for every j; vectorized and OpenMP-threaded.
void random_bits32(Key key, uint64_t first_index, std::span<uint32_t> out);

// jax.random.uniform's float32 mapping: the top 23 bits as a mantissa, (bits >> 9) * 2^-23,
// in [0, 1) (exact in f32).
constexpr float uniform23(uint32_t bits) {
  return static_cast<float>(bits >> 9) * (1.0f / 8388608.0f);
}

}  // namespace s3r
