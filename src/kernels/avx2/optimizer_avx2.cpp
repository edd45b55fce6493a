// AVX2-tier AdamW update (kernels/kernels.hpp adamw_update): 8 elements per vector, the
// reference's operations in its order (all correctly rounded, no fused multiply-adds), so the
// same bits; the last i1 - i0 mod 8 elements go through the reference itself.
#include <immintrin.h>

#include "kernels/kernels.hpp"

namespace s3r::kernels::avx2 {

bool adamw_update(const AdamWElements& e, int64_t i0, int64_t i1, bool write) {
  const __m256 clip = _mm256_set1_ps(e.clip), beta1 = _mm256_set1_ps(e.beta1);
  const __m256 one_minus_beta1 = _mm256_set1_ps(e.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(e.beta2), one_minus_beta2 = _mm256_set1_ps(e.one_minus_beta2);
  const __m256 lr = _mm256_set1_ps(e.lr), bias1 = _mm256_set1_ps(e.bias1);
  const __m256 bias2 = _mm256_set1_ps(e.bias2), eps = _mm256_set1_ps(e.eps);
  const __m256 decay = _mm256_set1_ps(e.decay), zero = _mm256_setzero_ps();
  __m256 poison = zero;  // as the reference's: 0 in every lane exactly when all are finite
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(e.g + i), clip);
    const __m256 m = _mm256_add_ps(_mm256_mul_ps(beta1, _mm256_loadu_ps(e.m + i)),
                                   _mm256_mul_ps(one_minus_beta1, g));
    const __m256 v = _mm256_add_ps(_mm256_mul_ps(beta2, _mm256_loadu_ps(e.v + i)),
                                   _mm256_mul_ps(_mm256_mul_ps(one_minus_beta2, g), g));
    const __m256 w0 = _mm256_loadu_ps(e.w + i);
    const __m256 step = _mm256_div_ps(_mm256_mul_ps(lr, _mm256_div_ps(m, bias1)),
                                      _mm256_add_ps(_mm256_sqrt_ps(_mm256_div_ps(v, bias2)), eps));
    const __m256 w = _mm256_sub_ps(_mm256_sub_ps(w0, step), _mm256_mul_ps(decay, w0));
    poison = _mm256_add_ps(poison, _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(w, zero),
                                                               _mm256_mul_ps(m, zero)),
                                                 _mm256_mul_ps(v, zero)));
    if (write) {
      _mm256_storeu_ps(e.m + i, m);
      _mm256_storeu_ps(e.v + i, v);
      _mm256_storeu_ps(e.w + i, w);
    }
  }
  const bool finite = _mm256_movemask_ps(_mm256_cmp_ps(poison, zero, _CMP_EQ_OQ)) == 0xFF;
  return ref::adamw_update(e, i, i1, write) && finite;
}

}  // namespace s3r::kernels::avx2
