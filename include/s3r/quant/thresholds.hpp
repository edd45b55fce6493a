#pragma once
// Stochastic-rounding thresholds (SPEC section 2).
//
// 7-bit shared thresholds (modes s3r, s3r-bcast): threshold i is byte (i % 4) of Threefry word
// (i / 4); its top 7 bits k give r = (k + 0.5) / 128, exact in bf16 and f32. The half-step
// shift bounds the bias of one rounding by D/256.
// 23-bit uniforms (mode sr): r = uniform23(bits32) = (bits >> 9) * 2^-23.
#include <cstdint>

#include "s3r/rng/threefry.hpp"

namespace s3r {

// r = (k + 0.5) / 128 for the 7-bit value k = byte >> 1 of one random byte.
constexpr float threshold7_from_byte(uint32_t byte) {
  return (static_cast<float>((byte & 0xFFu) >> 1) + 0.5f) * (1.0f / 128.0f);
}

// Threshold i of the shared-threshold stream of `key`: byte i % 4 of random_bits32(key, i / 4).
constexpr float threshold7(Key key, uint64_t i) {
  const uint32_t word = random_bits32(key, i >> 2);
  return threshold7_from_byte(word >> (8 * (i & 3)));
}

}  // namespace s3r
