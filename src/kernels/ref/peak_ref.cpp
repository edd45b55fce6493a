// Baseline x86-64 loops of kernels/peak_loops.hpp.
#include <emmintrin.h>

#include "kernels/peak_loops.hpp"

namespace s3r::kernels::peak {

uint64_t mul_add_f32_xmm(int64_t iterations) {
  __m128 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm_set1_ps(0.0f);
  __m128 a = _mm_set1_ps(1.0000001f), b = _mm_set1_ps(0.9999999f);
  for (int64_t it = 0; it < iterations; ++it) {
    asm volatile("" : "+x"(a), "+x"(b));
    for (int i = 0; i < 8; ++i) acc[i] = _mm_add_ps(acc[i], _mm_mul_ps(a, b));
  }
  __m128 s = acc[0];
  for (int i = 1; i < 8; ++i) s = _mm_add_ps(s, acc[i]);
  volatile float sink = _mm_cvtss_f32(s);
  (void)sink;
  return static_cast<uint64_t>(iterations) * 8 * 4;
}

uint64_t stream_read_xmm(const uint32_t* words, int64_t n, uint32_t* sink) {
  constexpr int64_t kLanes = sizeof(__m128i) / 4;
  __m128i acc[4] = {_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
  const int64_t quarter = n / 4;
  for (int64_t i = 0; i < quarter; i += kLanes) {
    for (int s = 0; s < 4; ++s) acc[s] = _mm_add_epi32(acc[s], _mm_load_si128(reinterpret_cast<const __m128i*>(words + s * quarter + i)));
  }
  alignas(64) uint32_t lanes[kLanes];
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes), _mm_add_epi32(_mm_add_epi32(acc[0], acc[1]), _mm_add_epi32(acc[2], acc[3])));
  uint32_t total = 0;
  for (uint32_t x : lanes) total += x;
  *sink = total;
  return static_cast<uint64_t>(n) * 4;
}

}  // namespace s3r::kernels::peak
