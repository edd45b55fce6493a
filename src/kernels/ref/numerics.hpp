#pragma once
// Scalar numerics shared by the reference kernels and mirrored, operation for operation, by the
// AVX-512 kernels (so that codes agree bit for bit).
#include <cmath>
#include <cstdint>

namespace s3r::kernels::ref {

// Absmax -> scale: absmax / 127, and 1 for an all-zero row/column (or one so small that the
// scale underflows to 0; its codes are then rne(x) = 0).
inline float absmax_to_scale(float absmax) {
  const float scale = absmax / 127.0f;
  return scale > 0.0f ? scale : 1.0f;
}

// Clamp to the symmetric int8 code range [-127, 127] (in f32: NaN-free inputs only).
inline float clamp_code(float q) { return q < -127.0f ? -127.0f : (q > 127.0f ? 127.0f : q); }

// rne(v) as an int8 code; v is finite. Rounding happens before the clamp, as in the kernels.
inline int8_t rtne_code(float v) { return static_cast<int8_t>(clamp_code(std::nearbyint(v))); }

// floor(x + r) as an int8 code: one f32 add, then floor, then the clamp.
inline int8_t sr_code(float x, float r) {
  return static_cast<int8_t>(clamp_code(std::floor(x + r)));
}

}  // namespace s3r::kernels::ref
