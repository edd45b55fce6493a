// AVX-512-tier AdamW update (kernels/kernels.hpp adamw_update): 16 elements per vector, the
// reference's operations in its order (all correctly rounded, no fused multiply-adds), so the
// same bits; the last i1 - i0 mod 16 elements go through the reference itself.
#include <immintrin.h>

#include "kernels/kernels.hpp"

namespace s3r::kernels::avx512 {

bool adamw_update(const AdamWElements& e, int64_t i0, int64_t i1, bool write) {
  const __m512 clip = _mm512_set1_ps(e.clip), beta1 = _mm512_set1_ps(e.beta1);
  const __m512 one_minus_beta1 = _mm512_set1_ps(e.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(e.beta2), one_minus_beta2 = _mm512_set1_ps(e.one_minus_beta2);
  const __m512 lr = _mm512_set1_ps(e.lr), bias1 = _mm512_set1_ps(e.bias1);
  const __m512 bias2 = _mm512_set1_ps(e.bias2), eps = _mm512_set1_ps(e.eps);
  const __m512 decay = _mm512_set1_ps(e.decay), zero = _mm512_setzero_ps();
  __m512 poison = zero;  // as the reference's: 0 in every lane exactly when all are finite
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(e.g + i), clip);
    const __m512 m = _mm512_add_ps(_mm512_mul_ps(beta1, _mm512_loadu_ps(e.m + i)),
                                   _mm512_mul_ps(one_minus_beta1, g));
    const __m512 v = _mm512_add_ps(_mm512_mul_ps(beta2, _mm512_loadu_ps(e.v + i)),
                                   _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, g), g));
    const __m512 w0 = _mm512_loadu_ps(e.w + i);
    const __m512 step = _mm512_div_ps(_mm512_mul_ps(lr, _mm512_div_ps(m, bias1)),
                                      _mm512_add_ps(_mm512_sqrt_ps(_mm512_div_ps(v, bias2)), eps));
    const __m512 w = _mm512_sub_ps(_mm512_sub_ps(w0, step), _mm512_mul_ps(decay, w0));
    poison = _mm512_add_ps(poison, _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(w, zero),
                                                               _mm512_mul_ps(m, zero)),
                                                 _mm512_mul_ps(v, zero)));
    if (write) {
      _mm512_storeu_ps(e.m + i, m);
      _mm512_storeu_ps(e.v + i, v);
      _mm512_storeu_ps(e.w + i, w);
    }
  }
  const bool finite = _mm512_cmp_ps_mask(poison, zero, _CMP_EQ_OQ) == 0xFFFF;
  return ref::adamw_update(e, i, i1, write) && finite;
}

}  // namespace s3r::kernels::avx512
