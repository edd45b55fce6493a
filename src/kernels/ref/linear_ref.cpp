// Scalar reference of the linear layer's correction kernels (SPEC section 4).
#include "kernels/kernels.hpp"

namespace s3r::kernels::ref {

void gemv_s8_f32(float* out, const int8_t* w, const float* a, int64_t B, int64_t K, int64_t N,
                 int64_t k0, int64_t k1) {
  for (int64_t k = k0; k < k1; ++k) {
    for (int64_t b = 0; b < B; ++b) {
      double sum = 0.0;
      for (int64_t n = 0; n < N; ++n) sum += static_cast<double>(w[k * N + n]) * a[b * N + n];
      out[b * K + k] = static_cast<float>(sum);
    }
  }
}

void dx_epilogue(float* dx, int64_t ldx, const int32_t* acc, int64_t ld_acc, int64_t t0, int64_t t1,
                 int64_t k0, int64_t k1, const DxTerms& d) {
  for (int64_t t = t0; t < t1; ++t) {
    const float inv = 1.0f / d.sx[t];
    const float scale = d.D * inv;
    const float* wa_b = d.wa ? d.wa + (t / d.S) * d.K : nullptr;
    const int32_t* a = acc + (t - t0) * ld_acc;  // a[k - k0]: (t, k)
    float* row = dx + t * ldx;
    for (int64_t k = k0; k < k1; ++k) {
      float v = static_cast<float>(a[k - k0]) * scale;
      if (wa_b) v = v - (wa_b[k] + d.delta[t] * d.rowsum[k]) * inv;
      row[k] = d.accumulate ? row[k] + v : v;
    }
  }
}

}  // namespace s3r::kernels::ref
