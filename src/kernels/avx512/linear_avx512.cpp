// AVX-512 correction kernels of the linear layer. dx_epilogue mirrors the reference operation for
// operation (bit-exact); gemv_s8_f32 sums in 16 f32 lanes with FMA (close, not bit-exact).
#include <algorithm>

#include "kernels/avx512/common_avx512.hpp"
#include "kernels/kernels.hpp"

namespace s3r::kernels::avx512 {

namespace {
inline __m512 load_s8_as_f32(const int8_t* p, __mmask16 m) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

constexpr int64_t kGemvGroup = 8;  // vectors a_b kept in flight per pass over rows of w

// out[b, k] for rows k .. k + R - 1 and vectors b0 .. b0 + NB - 1: each a_b vector is loaded
// once for R rows (the vectors, 128 KB at N = 4096, come from L2; one row at a time spent half
// its time on those loads). Each sum runs over n in the same order for any R.
template <int R, int NB>
void gemv_rows(float* out, const int8_t* w, const float* a, int64_t b0, int64_t K, int64_t N, int64_t k) {
  // Unrolled where written, so that GCC keeps the accumulators in registers (without the
  // pragmas it kept them on the stack: a store per multiply-add).
  __m512 acc[R][NB];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for_each_vector16(0, N, [&](int64_t n, auto m) {
    __m512 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = load_s8_as_f32(w + (k + r) * N + n, m);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      __m512 av = _mm512_maskz_loadu_ps(m, a + (b0 + j) * N + n);
      __asm__("" : "+v"(av));  // one load for R products (GCC would fold it into each)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_fmadd_ps(wv[r], av, acc[r][j]);
    }
  });
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) out[(b0 + j) * K + k + r] = sum_lanes(acc[r][j]);
  }
}
}  // namespace

void gemv_s8_f32(float* out, const int8_t* w, const float* a, int64_t B, int64_t K, int64_t N,
                 int64_t k0, int64_t k1) {
  const int64_t full = B / kGemvGroup * kGemvGroup;
  int64_t k = k0;
  for (; k + 3 <= k1; k += 3) {  // 24 accumulators, 3 rows, one vector of a: 28 registers
    for (int64_t b0 = 0; b0 < full; b0 += kGemvGroup) gemv_rows<3, kGemvGroup>(out, w, a, b0, K, N, k);
  }
  for (; k < k1; ++k) {
    for (int64_t b0 = 0; b0 < full; b0 += kGemvGroup) gemv_rows<1, kGemvGroup>(out, w, a, b0, K, N, k);
  }
  for (k = k0; k < k1 && full < B; ++k) {  // the last B % 8 vectors, one at a time
    for (int64_t b = full; b < B; ++b) gemv_rows<1, 1>(out, w, a, b, K, N, k);
  }
}

namespace {
// One row t of dx_epilogue_rows: inv = 1 / sx[t], scale = D inv, dt = delta[t], wa_b = example's
// Wq a_b (or null); kWa, kAcc, kStream: the terms known per call, so the loop has no tests.
template <bool kWa, bool kAcc, bool kStream>
inline void dx_row(float* row, const int32_t* a, int64_t k0, int64_t k1, __m512 inv, __m512 scale,
                   __m512 dt, const float* wa_b, const float* rowsum) {
  for_each_vector16(k0, k1, [&](int64_t k, auto m) {
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(m, a + (k - k0))), scale);
    if constexpr (kWa) {
      const __m512 corr = _mm512_add_ps(_mm512_maskz_loadu_ps(m, wa_b + k),
                                        _mm512_mul_ps(dt, _mm512_maskz_loadu_ps(m, rowsum + k)));
      v = _mm512_sub_ps(v, _mm512_mul_ps(corr, inv));
    }
    if constexpr (kAcc) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, row + k), v);
    store_ps(row + k, m, v, kStream);
  });
}

template <bool kWa, bool kAcc, bool kStream>
void dx_rows(float* dx, int64_t ldx, const int32_t* acc, int64_t ld_acc, int64_t t0, int64_t t1,
             int64_t k0, int64_t k1, const DxTerms& d) {
  // Sixteen rows' 1 / sx and D / sx at once (the same IEEE quotients and products as one row at
  // a time), and each row's example divided for only where a new example starts: per row, a
  // scalar division and an integer one cost as much as a block's 32 columns (AMX's 32 x 32
  // blocks).
  alignas(64) float inv[16], scale[16];
  int64_t b = -1, next = t0;  // row t's example and its end, found as t crosses into it
  for (int64_t g = t0; g < t1; g += 16) {
    const __mmask16 m = first_lanes(std::min<int64_t>(16, t1 - g));
    const __m512 iv = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), m, d.sx + g));
    _mm512_store_ps(inv, iv);
    _mm512_store_ps(scale, _mm512_mul_ps(_mm512_set1_ps(d.D), iv));
    for (int64_t t = g; t < std::min(t1, g + 16); ++t) {
      const float* wa_b = nullptr;
      __m512 dt = _mm512_setzero_ps();
      if constexpr (kWa) {
        if (t >= next) {
          b = t / d.S;
          next = (b + 1) * d.S;
        }
        wa_b = d.wa + b * d.K;
        dt = _mm512_set1_ps(d.delta[t]);
      }
      dx_row<kWa, kAcc, kStream>(dx + t * ldx, acc + (t - t0) * ld_acc, k0, k1,
                                 _mm512_set1_ps(inv[t - g]), _mm512_set1_ps(scale[t - g]), dt,
                                 wa_b, d.rowsum);
    }
  }
}
}  // namespace

void dx_epilogue_rows(float* dx, int64_t ldx, const int32_t* acc, int64_t ld_acc, int64_t t0, int64_t t1,
                      int64_t k0, int64_t k1, const DxTerms& d, bool stream) {
  using Rows = decltype(&dx_rows<false, false, false>);
  // [wa][accumulate][stream]: a stream only without accumulating.
  static constexpr Rows kRows[2][2][2] = {
      {{dx_rows<false, false, false>, dx_rows<false, false, true>},
       {dx_rows<false, true, false>, dx_rows<false, true, false>}},
      {{dx_rows<true, false, false>, dx_rows<true, false, true>},
       {dx_rows<true, true, false>, dx_rows<true, true, false>}}};
  kRows[d.wa != nullptr][d.accumulate][stream](dx, ldx, acc, ld_acc, t0, t1, k0, k1, d);
}

void dx_epilogue(float* dx, int64_t ldx, const int32_t* acc, int64_t ld_acc, int64_t t0, int64_t t1,
                 int64_t k0, int64_t k1, const DxTerms& d) {
  dx_epilogue_rows(dx, ldx, acc, ld_acc, t0, t1, k0, k1, d, false);
}

}  // namespace s3r::kernels::avx512
