#pragma once
// bfloat16 storage type: the top 16 bits of an IEEE binary32. Conversions follow the usual
// hardware rules: widening is exact (bits << 16); narrowing rounds to nearest even and keeps
// NaN a (quiet) NaN.
#include <bit>
#include <cstdint>

namespace s3r {

struct bf16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2);

constexpr float to_float(bf16 v) { return std::bit_cast<float>(uint32_t{v.bits} << 16); }

constexpr bf16 to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) {
    return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};  // quiet NaN, sign kept
  }
  const uint32_t rounding_bias = 0x7FFFu + ((u >> 16) & 1u);  // round half to even
  return bf16{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

}  // namespace s3r
