// AVX2 forward quantizers; operation for operation the same as kernels/ref (bit-exact codes).
#include "kernels/avx2/common_avx2.hpp"
#include "kernels/kernels.hpp"
#include "kernels/ref/numerics.hpp"

namespace s3r::kernels::avx2 {

bool quantize_rows_rtne(int8_t* codes, float* scales, const float* x, int64_t r0, int64_t r1,
                        int64_t cols) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = x + r * cols;
    // Two accumulators (even / odd vectors); max is exact, so the order does not matter.
    __m256 vmax0 = _mm256_setzero_ps(), vmax1 = _mm256_setzero_ps();
    __m256i bad = _mm256_setzero_si256();
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
      const __m256 v0 = _mm256_loadu_ps(row + c);
      const __m256 v1 = _mm256_loadu_ps(row + c + 8);
      bad = _mm256_or_si256(bad, _mm256_or_si256(nonfinite_lanes(v0), nonfinite_lanes(v1)));
      vmax0 = _mm256_max_ps(vmax0, abs8(v0));
      vmax1 = _mm256_max_ps(vmax1, abs8(v1));
    }
    for (; c < cols; c += 8) {  // the last 1..15 columns; inactive lanes read as 0
      const __m256 v = load8(row + c, cols - c);
      bad = _mm256_or_si256(bad, nonfinite_lanes(v));
      vmax0 = _mm256_max_ps(vmax0, abs8(v));
    }
    if (any_lane(bad)) return false;
    const float scale = ref::absmax_to_scale(reduce_max8(_mm256_max_ps(vmax0, vmax1)));
    scales[r] = scale;
    const __m256 vscale = _mm256_set1_ps(scale);
    for (c = 0; c < cols; c += 8) {
      const int64_t m = cols - c;
      const __m256 q = clamp_code8(round_nearest_even(_mm256_div_ps(load8(row + c, m), vscale)));
      store_codes8(codes + r * cols + c, m, q);
    }
  }
  return true;
}

bool absmax_cols(float* colmax, const float* w, int64_t r0, int64_t r1, int64_t cols, int64_t c0,
                 int64_t c1) {
  for (int64_t c = c0; c < c1; ++c) colmax[c] = 0.0f;
  __m256i bad = _mm256_setzero_si256();
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; c += 8) {
      // Only the lanes of [c0, c1) are read and written: other threads own the columns beyond.
      const int64_t m = c1 - c;
      const __m256 v = load8(w + r * cols + c, m);
      bad = _mm256_or_si256(bad, nonfinite_lanes(v));
      store8(colmax + c, m, _mm256_max_ps(load8(colmax + c, m), abs8(v)));
    }
  }
  return !any_lane(bad);
}

void quantize_cols_rtne(int8_t* codes, const float* w, const float* scales, int64_t r0,
                        int64_t r1, int64_t cols) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = 0; c < cols; c += 8) {
      const int64_t m = cols - c;
      __m256 s;
      if (m >= 8) {
        s = _mm256_loadu_ps(scales + c);
      } else {
        // Inactive lanes: 0 / 0 would be NaN, so they divide by 1 (never stored anyway).
        const __m256i active = first_lanes(m);
        s = _mm256_blendv_ps(one, _mm256_maskload_ps(scales + c, active),
                             _mm256_castsi256_ps(active));
      }
      const __m256 v = load8(w + r * cols + c, m);
      const __m256 q = clamp_code8(round_nearest_even(_mm256_div_ps(v, s)));
      store_codes8(codes + r * cols + c, m, q);
    }
  }
}

}  // namespace s3r::kernels::avx2
