// AVX-512 element-wise and row kernels (SwiGLU, GeGLU, softmax cross-entropy, RMSNorm, bf16
// rounding); operation for operation the same as kernels/ref
// (bit-exact), including the polynomial exp.
#include <cmath>

#include "kernels/avx512/common_avx512.hpp"
#include "kernels/kernels.hpp"
#include "kernels/ref/numerics.hpp"

namespace s3r::kernels::avx512 {

namespace {

inline __m512 sigmoid16(__m512 z) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp_poly16(_mm512_sub_ps(_mm512_setzero_ps(), z))));
}

// kernels/ref's gelu_clamp, gelu_gate and gelu_slope (NaN lanes stay NaN: see the AVX2 twin).
inline __m512 gelu_clamp16(__m512 z) {
  return _mm512_min_ps(_mm512_set1_ps(ref::kGeluClamp), _mm512_max_ps(_mm512_set1_ps(-ref::kGeluClamp), z));
}
inline __m512 gelu_gate16(__m512 c) {
  const __m512 c2 = _mm512_mul_ps(c, c);
  const __m512 poly = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(_mm512_set1_ps(ref::kGeluA), c2));
  return sigmoid16(_mm512_mul_ps(_mm512_mul_ps(c, _mm512_set1_ps(ref::kGeluK)), poly));
}
inline __m512 gelu_slope16(__m512 c, __m512 s) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 poly = _mm512_add_ps(one, _mm512_mul_ps(_mm512_set1_ps(ref::kGelu3A), _mm512_mul_ps(c, c)));
  const __m512 t = _mm512_mul_ps(c, _mm512_mul_ps(s, _mm512_sub_ps(one, s)));
  return _mm512_add_ps(s, _mm512_mul_ps(t, _mm512_mul_ps(_mm512_set1_ps(ref::kGeluK), poly)));
}

}  // namespace

void geglu_forward_ew(float* hidden, const float* h1, const float* h3, int64_t i0, int64_t i1) {
  for_each_vector16(i0, i1, [&](int64_t i, auto m) {
    const __m512 a = _mm512_maskz_loadu_ps(m, h1 + i);
    const __m512 v = _mm512_mul_ps(_mm512_mul_ps(a, gelu_gate16(gelu_clamp16(a))), _mm512_maskz_loadu_ps(m, h3 + i));
    _mm512_mask_storeu_ps(hidden + i, m, v);
  });
}

void geglu_backward_ew(float* dh1, float* dh3, const float* dh, const float* h1, const float* h3,
                       int64_t i0, int64_t i1) {
  for_each_vector16(i0, i1, [&](int64_t i, auto m) {
    const __m512 a = _mm512_maskz_loadu_ps(m, h1 + i);
    const __m512 g = _mm512_maskz_loadu_ps(m, dh + i);
    const __m512 c = gelu_clamp16(a);
    const __m512 s = gelu_gate16(c);
    _mm512_mask_storeu_ps(dh3 + i, m, _mm512_mul_ps(g, _mm512_mul_ps(a, s)));
    _mm512_mask_storeu_ps(dh1 + i, m, _mm512_mul_ps(_mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, h3 + i)), gelu_slope16(c, s)));
  });
}

void swiglu_forward_ew(float* hidden, const float* h1, const float* h3, int64_t i0, int64_t i1) {
  for_each_vector16(i0, i1, [&](int64_t i, auto m) {
    const __m512 a = _mm512_maskz_loadu_ps(m, h1 + i);
    const __m512 v = _mm512_mul_ps(_mm512_mul_ps(a, sigmoid16(a)), _mm512_maskz_loadu_ps(m, h3 + i));
    _mm512_mask_storeu_ps(hidden + i, m, v);
  });
}

void swiglu_backward_ew(float* dh1, float* dh3, const float* dh, const float* h1, const float* h3,
                        int64_t i0, int64_t i1) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for_each_vector16(i0, i1, [&](int64_t i, auto m) {
    const __m512 a = _mm512_maskz_loadu_ps(m, h1 + i);
    const __m512 g = _mm512_maskz_loadu_ps(m, dh + i);
    const __m512 s = sigmoid16(a);
    _mm512_mask_storeu_ps(dh3 + i, m, _mm512_mul_ps(g, _mm512_mul_ps(a, s)));
    const __m512 dsilu = _mm512_mul_ps(s, _mm512_add_ps(one, _mm512_mul_ps(a, _mm512_sub_ps(one, s))));
    _mm512_mask_storeu_ps(dh1 + i, m,
                          _mm512_mul_ps(_mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, h3 + i)), dsilu));
  });
}

bool softmax_xent_rows(float* z, double* loss, const int32_t* targets, int64_t r0, int64_t r1,
                       int64_t vocab, float grad_scale) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t r = r0; r < r1; ++r) {
    float* row = z + r * vocab;
    const int32_t y = targets[r];
    __m512 vmax = _mm512_set1_ps(row[0]);
    __mmask16 finite = 0xFFFF;
    for_each_vector16(0, vocab, [&](int64_t i, auto m) {
      const __m512 v = _mm512_mask_loadu_ps(vmax, m, row + i);  // tail lanes: a value already in
      finite &= _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), zero, _CMP_EQ_OQ);  // x - x == 0 iff finite
      vmax = _mm512_max_ps(vmax, v);
    });
    if (finite != 0xFFFF) return false;
    const float mx = _mm512_reduce_max_ps(vmax);  // max is exact in any order
    const float zy = row[y];
    const __m512 vm = _mm512_set1_ps(mx);
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();  // partials 0..7, 8..15
    // The next row's lines are fetched while its exps run (the sum pass is compute-bound, the
    // max pass reads from memory): on the Emerald Rapids VM the 4096 x 4096 logits of `small`
    // took 5.5-5.7 ms against 7.3-7.4 (two threads, rows of 8 per task).
    const float* next = r + 1 < r1 ? row + vocab : nullptr;
    for_each_vector16(0, vocab, [&](int64_t i, auto m) {
      if (next != nullptr && i % 32 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(next + i), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(next + i + 16), _MM_HINT_T0);
      }
      const __m512 e = _mm512_maskz_mov_ps(m, exp_poly16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + i), vm)));
      _mm512_mask_storeu_ps(row + i, m, e);
      lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
      hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    });
    alignas(64) double partial[16];
    _mm512_store_pd(partial, lo);
    _mm512_store_pd(partial + 8, hi);
    double sum = 0.0;
    for (double p : partial) sum += p;
    loss[r] = (std::log(sum) + static_cast<double>(mx)) - static_cast<double>(zy);
    const float inv = static_cast<float>(1.0 / sum);
    const float ey = row[y];
    const __m512 vinv = _mm512_set1_ps(inv), vscale = _mm512_set1_ps(grad_scale);
    for_each_vector16(0, vocab, [&](int64_t i, auto m) {
      const __m512 e = _mm512_maskz_loadu_ps(m, row + i);
      _mm512_mask_storeu_ps(row + i, m, _mm512_mul_ps(_mm512_mul_ps(e, vinv), vscale));
    });
    row[y] = (ey * inv - 1.0f) * grad_scale;  // the one-hot term (e * inv - 0 = e * inv elsewhere)
  }
  return true;
}

namespace {

// The 16 floats of v as doubles: lanes 0..7 and 8..15.
inline __m512d low_pd(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
inline __m512d high_pd(__m512 v) {
  return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

// partials 0..7 (lo) then 8..15 (hi), added in order.
inline double sum_partials(__m512d lo, __m512d hi) {
  alignas(64) double partial[16];
  _mm512_store_pd(partial, lo);
  _mm512_store_pd(partial + 8, hi);
  double sum = 0.0;
  for (double p : partial) sum += p;
  return sum;
}

}  // namespace

void rmsnorm_rows(float* out, float* rstd, const float* x, const float* weight, int64_t r0,
                  int64_t r1, int64_t width, float eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * width;
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    for_each_vector16(0, width, [&](int64_t c, auto m) {
      const __m512 v = _mm512_maskz_loadu_ps(m, xr + c);  // tail lanes add 0
      const __m512d a = low_pd(v), b = high_pd(v);
      lo = _mm512_add_pd(lo, _mm512_mul_pd(a, a));
      hi = _mm512_add_pd(hi, _mm512_mul_pd(b, b));
    });
    const double ss = sum_partials(lo, hi);
    const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(width) + static_cast<double>(eps)));
    rstd[r] = rs;
    const __m512 vr = _mm512_set1_ps(rs);
    for_each_vector16(0, width, [&](int64_t c, auto m) {
      const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + c), vr), _mm512_maskz_loadu_ps(m, weight + c));
      _mm512_mask_storeu_ps(out + r * width + c, m, v);
    });
  }
}

void rmsnorm_backward_rows(float* dx, const float* dy, const float* x, const float* weight,
                           const float* rstd, int64_t r0, int64_t r1, int64_t width) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * width;
    const float* g = dy + r * width;
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    for_each_vector16(0, width, [&](int64_t c, auto m) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, xr + c), wv = _mm512_maskz_loadu_ps(m, weight + c);
      const __m512 gv = _mm512_maskz_loadu_ps(m, g + c);
      lo = _mm512_add_pd(lo, _mm512_mul_pd(_mm512_mul_pd(low_pd(xv), low_pd(wv)), low_pd(gv)));
      hi = _mm512_add_pd(hi, _mm512_mul_pd(_mm512_mul_pd(high_pd(xv), high_pd(wv)), high_pd(gv)));
    });
    const double dot = sum_partials(lo, hi);
    const double rr = rstd[r];
    const double k = rr * rr * rr * dot / static_cast<double>(width);
    const __m512d vr = _mm512_set1_pd(rr), vk = _mm512_set1_pd(k);
    for_each_vector8(0, width, [&](int64_t c, auto m) {
      const __m512d w = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, weight + c));
      const __m512d gv = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, g + c));
      const __m512d xv = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, xr + c));
      const __m512d v = _mm512_sub_pd(_mm512_mul_pd(_mm512_mul_pd(vr, w), gv), _mm512_mul_pd(vk, xv));
      float* d = dx + r * width + c;
      _mm256_mask_storeu_ps(d, m, _mm256_add_ps(_mm256_maskz_loadu_ps(m, d), _mm512_cvtpd_ps(v)));
    });
  }
}

void round_bf16(bf16* out, float* widened, const float* x, int64_t i0, int64_t i1) {
  // The bits as the reference computes them (vcvtneps2bf16 would flush denormals).
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    const __m512i u = _mm512_loadu_si512(x + i);
    const __m512i top = _mm512_srli_epi32(u, 16);
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                     _mm512_set1_epi32(0x7F800000));
    const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(top, _mm512_set1_epi32(1)));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    const __m512i bits = _mm512_mask_blend_epi32(is_nan, rounded, _mm512_or_si512(top, _mm512_set1_epi32(0x40)));
    if (out != nullptr) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(bits));
    if (widened != nullptr) _mm512_storeu_si512(widened + i, _mm512_slli_epi32(bits, 16));
  }
  ref::round_bf16(out, widened, x, i, i1);
}

}  // namespace s3r::kernels::avx512
