// AVX2 correction kernels of the linear layer. dx_epilogue mirrors the reference operation for
// operation (bit-exact, no FMA); gemv_s8_f32 sums in 8 f32 lanes with FMA (close, not bit-exact).
#include <cstring>

#include "kernels/avx2/common_avx2.hpp"
#include "kernels/kernels.hpp"

namespace s3r::kernels::avx2 {

namespace {

// 8 (or the first n < 8, the others 0) int8 values as f32, exact.
inline __m256 load_s8_as_f32(const int8_t* p, int64_t n) {
  __m128i raw;
  if (n >= 8) {
    raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  } else {
    int8_t buf[16] = {};
    std::memcpy(buf, p, static_cast<size_t>(n));
    raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf));
  }
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
}

// 8 (or the first n < 8, the others 0) int32 values.
inline __m256i load8_i32(const int32_t* p, int64_t n) {
  return n >= 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                : _mm256_maskload_epi32(reinterpret_cast<const int*>(p), first_lanes(n));
}

constexpr int64_t kGemvGroup = 4;  // vectors a_b per pass over rows of w

// out[b, k] for rows k .. k + R - 1 and vectors b0 .. b0 + NB - 1: each a_b vector is loaded
// once for R rows, and the accumulators stay in registers (the loops unrolled where written).
// Each sum runs over n in the same order for any R and NB; inactive lanes of the last vector
// read w = a = 0 and add nothing.
template <int R, int NB>
void gemv_rows(float* out, const int8_t* w, const float* a, int64_t b0, int64_t K, int64_t N, int64_t k) {
  __m256 acc[R][NB];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  for (int64_t n = 0; n < N; n += 8) {
    const int64_t m = N - n;
    __m256 wv[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) wv[r] = load_s8_as_f32(w + (k + r) * N + n, m);
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      __m256 av = load8(a + (b0 + j) * N + n, m);
      __asm__("" : "+x"(av));  // one load for R products (GCC would fold it into each)
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(wv[r], av, acc[r][j]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) out[(b0 + j) * K + k + r] = reduce_add8(acc[r][j]);
  }
}
}  // namespace

void gemv_s8_f32(float* out, const int8_t* w, const float* a, int64_t B, int64_t K, int64_t N,
                 int64_t k0, int64_t k1) {
  const int64_t full = B / kGemvGroup * kGemvGroup;
  int64_t k = k0;
  for (; k + 2 <= k1; k += 2) {  // 8 accumulators, 2 rows, one vector of a: 11 registers
    for (int64_t b0 = 0; b0 < full; b0 += kGemvGroup) gemv_rows<2, kGemvGroup>(out, w, a, b0, K, N, k);
  }
  for (; k < k1; ++k) {
    for (int64_t b0 = 0; b0 < full; b0 += kGemvGroup) gemv_rows<1, kGemvGroup>(out, w, a, b0, K, N, k);
  }
  for (k = k0; k < k1 && full < B; ++k) {  // the last B % 4 vectors, one at a time
    for (int64_t b = full; b < B; ++b) gemv_rows<1, 1>(out, w, a, b, K, N, k);
  }
}

void dx_epilogue(float* dx, int64_t ldx, const int32_t* acc, int64_t ld_acc, int64_t t0, int64_t t1,
                 int64_t k0, int64_t k1, const DxTerms& d) {
  for (int64_t t = t0; t < t1; ++t) {
    const float inv_s = 1.0f / d.sx[t];
    const __m256 inv = _mm256_set1_ps(inv_s);
    const __m256 scale = _mm256_set1_ps(d.D * inv_s);
    const float* wa_b = d.wa ? d.wa + (t / d.S) * d.K : nullptr;
    const __m256 dt = _mm256_set1_ps(d.wa ? d.delta[t] : 0.0f);
    const int32_t* a = acc + (t - t0) * ld_acc;  // a[k - k0]: (t, k)
    float* row = dx + t * ldx;
    for (int64_t k = k0; k < k1; k += 8) {
      const int64_t m = k1 - k;
      // v = float(acc) * scale - (wa + delta * rowsum) * inv, each product and sum rounded.
      __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(load8_i32(a + (k - k0), m)), scale);
      if (wa_b) {
        const __m256 corr =
            _mm256_add_ps(load8(wa_b + k, m), _mm256_mul_ps(dt, load8(d.rowsum + k, m)));
        v = _mm256_sub_ps(v, _mm256_mul_ps(corr, inv));
      }
      if (d.accumulate) v = _mm256_add_ps(load8(row + k, m), v);
      store8(row + k, m, v);
    }
  }
}

}  // namespace s3r::kernels::avx2
