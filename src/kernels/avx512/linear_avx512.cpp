// AVX-512 correction kernels of the linear layer. dx_epilogue mirrors the reference operation for
// operation (bit-exact); gemv_s8_f32 sums in 16 f32 lanes with FMA (close, not bit-exact).
#include "kernels/avx512/common_avx512.hpp"
#include "kernels/kernels.hpp"

namespace s3r::kernels::avx512 {

namespace {
inline __m512 load_s8_as_f32(const int8_t* p, __mmask16 m) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}
}  // namespace

void gemv_s8_f32(float* out, const int8_t* w, const float* a, int64_t B, int64_t K, int64_t N,
                 int64_t k0, int64_t k1) {
  constexpr int64_t kGroup = 8;  // vectors a_b kept in flight per pass over a row of w
  for (int64_t k = k0; k < k1; ++k) {
    const int8_t* row = w + k * N;
    for (int64_t b0 = 0; b0 < B; b0 += kGroup) {
      const int64_t nb = B - b0 < kGroup ? B - b0 : kGroup;
      __m512 acc[kGroup];
      for (int64_t j = 0; j < kGroup; ++j) acc[j] = _mm512_setzero_ps();
      for_each_vector16(0, N, [&](int64_t n, auto m) {
        const __m512 wv = load_s8_as_f32(row + n, m);
        for (int64_t j = 0; j < nb; ++j) {
          acc[j] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, a + (b0 + j) * N + n), acc[j]);
        }
      });
      for (int64_t j = 0; j < nb; ++j) out[(b0 + j) * K + k] = _mm512_reduce_add_ps(acc[j]);
    }
  }
}

void dx_epilogue_rows(float* dx, int64_t ldx, const int32_t* acc, int64_t ld_acc, int64_t t0, int64_t t1,
                      int64_t k0, int64_t k1, const DxTerms& d, bool stream) {
  stream = stream && !d.accumulate;
  for (int64_t t = t0; t < t1; ++t) {
    const float inv_s = 1.0f / d.sx[t];
    const __m512 inv = _mm512_set1_ps(inv_s);
    const __m512 scale = _mm512_set1_ps(d.D * inv_s);
    const float* wa_b = d.wa ? d.wa + (t / d.S) * d.K : nullptr;
    const __m512 dt = _mm512_set1_ps(d.wa ? d.delta[t] : 0.0f);
    const int32_t* a = acc + (t - t0) * ld_acc;  // a[k - k0]: (t, k)
    float* row = dx + t * ldx;
    for_each_vector16(k0, k1, [&](int64_t k, auto m) {
      __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(m, a + (k - k0))), scale);
      if (wa_b) {
        const __m512 corr = _mm512_add_ps(_mm512_maskz_loadu_ps(m, wa_b + k),
                                          _mm512_mul_ps(dt, _mm512_maskz_loadu_ps(m, d.rowsum + k)));
        v = _mm512_sub_ps(v, _mm512_mul_ps(corr, inv));
      }
      if (d.accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, row + k), v);
      store_ps(row + k, m, v, stream);
    });
  }
}

void dx_epilogue(float* dx, int64_t ldx, const int32_t* acc, int64_t ld_acc, int64_t t0, int64_t t1,
                 int64_t k0, int64_t k1, const DxTerms& d) {
  dx_epilogue_rows(dx, ldx, acc, ld_acc, t0, t1, k0, k1, d, false);
}

}  // namespace s3r::kernels::avx512
