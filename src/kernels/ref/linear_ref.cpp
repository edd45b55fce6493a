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

void dx_epilogue(float* dx, const int32_t* acc, int64_t t0, int64_t t1, int64_t K, float D,
                 const float* sx, const float* wa, const float* delta, const float* rowsum,
                 int64_t S, bool accumulate) {
  for (int64_t t = t0; t < t1; ++t) {
    const float inv = 1.0f / sx[t];
    const float scale = D * inv;
    const float* wa_b = wa ? wa + (t / S) * K : nullptr;
    for (int64_t k = 0; k < K; ++k) {
      float v = static_cast<float>(acc[t * K + k]) * scale;
      if (wa_b) v = v - (wa_b[k] + delta[t] * rowsum[k]) * inv;
      dx[t * K + k] = accumulate ? dx[t * K + k] + v : v;
    }
  }
}

}  // namespace s3r::kernels::ref
