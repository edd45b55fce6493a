// Scalar reference of the forward (RTNE, absmax) quantizers: SPEC section 1.
#include <cmath>

#include "kernels/kernels.hpp"
#include "kernels/ref/numerics.hpp"

namespace s3r::kernels::ref {

bool quantize_rows_rtne(int8_t* codes, float* scales, const float* x, int64_t r0, int64_t r1,
                        int64_t cols) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = x + r * cols;
    float absmax = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      if (!std::isfinite(row[c])) return false;
      absmax = std::fmax(absmax, std::fabs(row[c]));
    }
    const float scale = absmax_to_scale(absmax);
    scales[r] = scale;
    for (int64_t c = 0; c < cols; ++c) codes[r * cols + c] = rtne_code(row[c] / scale);
  }
  return true;
}

bool absmax_cols(float* colmax, const float* w, int64_t r0, int64_t r1, int64_t cols, int64_t c0,
                 int64_t c1) {
  for (int64_t c = c0; c < c1; ++c) colmax[c] = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) {
      const float v = w[r * cols + c];
      if (!std::isfinite(v)) return false;
      colmax[c] = std::fmax(colmax[c], std::fabs(v));
    }
  }
  return true;
}

void quantize_cols_rtne(int8_t* codes, const float* w, const float* scales, int64_t r0,
                        int64_t r1, int64_t cols) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = 0; c < cols; ++c) codes[r * cols + c] = rtne_code(w[r * cols + c] / scales[c]);
  }
}

}  // namespace s3r::kernels::ref
