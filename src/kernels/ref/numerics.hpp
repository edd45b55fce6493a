#pragma once
// Scalar numerics shared by the reference kernels and mirrored, operation for operation, by the
// vectorized tiers (so that codes agree bit for bit).
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

// exp(x) by Cephes' single-precision method: x = n ln2 + r (Cody-Waite, two-part ln2), a
// degree-5 polynomial for exp(r) on |r| <= ln2/2, times 2^n. Relative error <= 2^-21 on
// [-87, 88] (tests/nn/elementwise_test.cpp); x is clamped to that range, so the result is finite
// and, at the low end, a tiny normal number. The vectorized twins perform the same operations in
// the same order (no FMA), so all give the same bits.
inline float exp_poly(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  return std::ldexp(p, static_cast<int>(n));
}

// sigmoid(z) = 1 / (1 + exp(-z)).
inline float sigmoid_poly(float z) { return 1.0f / (1.0f + exp_poly(-z)); }

// GELU, tanh approximation: gelu(z) = 0.5 z (1 + tanh(u)), u = sqrt(2/pi) (z + 0.044715 z^3),
// computed as z sigmoid(2u) (the same function: 0.5 (1 + tanh(u)) = sigmoid(2u)) with
// 2u = (c kGeluK) (1 + kGeluA c^2), c = z clamped to [-10, 10] (beyond it sigmoid(2u) is 0 or 1
// to f32 precision, and the clamp keeps c^3 finite). The derivative, with s = sigmoid(2u):
// s + (c (s (1 - s))) (kGeluK (1 + kGelu3A c^2)).
inline constexpr float kGeluK = 1.5957691216057308f;  // 2 sqrt(2 / pi)
inline constexpr float kGeluA = 0.044715f;
inline constexpr float kGelu3A = 0.134145f;  // 3 kGeluA
inline constexpr float kGeluClamp = 10.0f;
inline float gelu_clamp(float z) {
  return z < -kGeluClamp ? -kGeluClamp : (z > kGeluClamp ? kGeluClamp : z);  // NaN stays NaN
}
// sigmoid(2u) of the clamped input c.
inline float gelu_gate(float c) { return sigmoid_poly((c * kGeluK) * (1.0f + kGeluA * (c * c))); }
inline float gelu_slope(float c, float s) { return s + (c * (s * (1.0f - s))) * (kGeluK * (1.0f + kGelu3A * (c * c))); }

}  // namespace s3r::kernels::ref
