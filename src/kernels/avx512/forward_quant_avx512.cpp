// AVX-512 forward quantizers; operation for operation the same as kernels/ref (bit-exact codes).
#include "kernels/avx512/common_avx512.hpp"
#include "kernels/kernels.hpp"
#include "kernels/ref/numerics.hpp"

namespace s3r::kernels::avx512 {

bool quantize_rows_rtne(int8_t* codes, float* scales, const float* x, int64_t r0, int64_t r1,
                        int64_t cols) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = x + r * cols;
    __m512 vmax = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for_each_vector16(0, cols, [&](int64_t c, auto m) {
      const __m512 v = load16(row + c, m);
      bad |= nonfinite_lanes(v);
      vmax = _mm512_max_ps(vmax, _mm512_abs_ps(v));
    });
    if (bad) return false;
    const float scale = ref::absmax_to_scale(_mm512_reduce_max_ps(vmax));
    scales[r] = scale;
    const __m512 vscale = _mm512_set1_ps(scale);
    for_each_vector16(0, cols, [&](int64_t c, auto m) {
      const __m512 q = clamp_code16(round_nearest_even(_mm512_div_ps(load16(row + c, m), vscale)));
      store_codes16(codes + r * cols + c, m, q);
    });
  }
  return true;
}

bool absmax_cols(float* colmax, const float* w, int64_t r0, int64_t r1, int64_t cols, int64_t c0,
                 int64_t c1) {
  for (int64_t c = c0; c < c1; ++c) colmax[c] = 0.0f;
  __mmask16 bad = 0;
  for (int64_t r = r0; r < r1; ++r) {
    for_each_vector16(c0, c1, [&](int64_t c, auto m) {
      const __m512 v = load16(w + r * cols + c, m);
      bad |= nonfinite_lanes(v);
      const __m512 acc = _mm512_max_ps(_mm512_maskz_loadu_ps(m, colmax + c), _mm512_abs_ps(v));
      _mm512_mask_storeu_ps(colmax + c, m, acc);
    });
  }
  return bad == 0;
}

void quantize_cols_rtne(int8_t* codes, const float* w, const float* scales, int64_t r0,
                        int64_t r1, int64_t cols) {
  for (int64_t r = r0; r < r1; ++r) {
    for_each_vector16(0, cols, [&](int64_t c, auto m) {
      // Inactive lanes: 0 / 0 would be NaN, so they divide by 1 (never stored anyway).
      const __m512 s = _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), m, scales + c);
      const __m512 q = clamp_code16(round_nearest_even(_mm512_div_ps(load16(w + r * cols + c, m), s)));
      store_codes16(codes + r * cols + c, m, q);
    });
  }
}

}  // namespace s3r::kernels::avx512
