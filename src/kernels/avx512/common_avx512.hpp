#pragma once
// AVX-512 building blocks shared by the kernels in this folder (compiled only with
// -mavx512f -mavx512bw -mavx512vl ...; never include this from other translation units).
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "s3r/core/bf16.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r::kernels {
struct DxTerms;
}  // namespace s3r::kernels

namespace s3r::kernels::avx512 {

// Lanes 0..15.
inline __m512i lane_iota() {
  return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

// Mask of the first `n` lanes (n in [0, 16]).
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// The sum of v's lanes in the order of GCC's _mm512_reduce_add_ps (halves, then quarters, then
// lanes 0 + 2 and 1 + 3, then those two): the same bits. Through memory because GCC 12 warns
// (-Wuninitialized) about the undefined vectors its intrinsics pass where they inline into some
// loops; for sums taken once per long row.
inline float sum_lanes(__m512 v) {
  alignas(64) float l[16];
  _mm512_store_ps(l, v);
  float h[8];
  for (int i = 0; i < 8; ++i) h[i] = l[i + 8] + l[i];
  float q[4];
  for (int i = 0; i < 4; ++i) q[i] = h[i + 4] + h[i];
  return (q[0] + q[2]) + (q[1] + q[3]);
}

// Every lane, as a type: a loop body that takes its mask as `auto` and is called with one of these
// is compiled with that mask known, so its masked loads and stores become plain ones.
using AllLanes16 = std::integral_constant<__mmask16, 0xFFFF>;
using AllLanes8 = std::integral_constant<__mmask8, 0xFF>;

// body(i, mask) for the vectors of [begin, end), 16 lanes each (for_each_vector8: 8): every whole
// vector with an AllLanes mask, then the partial last one (if any) with its first lanes. The same
// operations on the same lanes as one loop masked by first_lanes throughout, hence the same
// results to the bit; but masked loads and stores cost about twice as much as plain ones in a
// streaming loop on AMD Zen 5 (grad_absmax over a 12 MB gradient, two threads: 13 GB/s with
// masked loads, 29 GB/s with plain ones), so the row and range loops of this folder use these.
// Stores v to p's lanes in k: a non-temporal store where `stream` is set and v fills a whole
// 64-byte line (the line goes to memory without being read first, and leaves the caches), else a
// masked store.
inline void store_ps(float* p, __mmask16 k, __m512 v, bool stream) {
  if (stream && k == 0xFFFF && reinterpret_cast<uintptr_t>(p) % 64 == 0) {
    _mm512_stream_ps(p, v);
  } else {
    _mm512_mask_storeu_ps(p, k, v);
  }
}

// kernels.hpp's dx_epilogue (linear_avx512.cpp), its rows stored by store_ps with `stream`.
void dx_epilogue_rows(float* dx, int64_t ldx, const int32_t* acc, int64_t ld_acc, int64_t t0, int64_t t1,
                      int64_t k0, int64_t k1, const DxTerms& d, bool stream);

template <class Body>
inline void for_each_vector16(int64_t begin, int64_t end, Body&& body) {
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) body(i, AllLanes16{});
  if (i < end) body(i, first_lanes(end - i));
}
template <class Body>
inline void for_each_vector8(int64_t begin, int64_t end, Body&& body) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) body(i, AllLanes8{});
  if (i < end) body(i, static_cast<__mmask8>(first_lanes(end - i)));
}

// The 64-bit flat indices base + lane as (hi32, lo32) counter halves, carry included.
inline void flat_index_halves(uint64_t base, __m512i* hi, __m512i* lo) {
  const __m512i base_lo = _mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(base)));
  *lo = _mm512_add_epi32(base_lo, lane_iota());
  const __mmask16 carry = _mm512_cmplt_epu32_mask(*lo, base_lo);
  const __m512i base_hi = _mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(base >> 32)));
  *hi = _mm512_mask_add_epi32(base_hi, carry, base_hi, _mm512_set1_epi32(1));
}

// Threefry-2x32-20 on 16 counters (c0 = high halves, c1 = low halves); returns y0 ^ y1, the
// word of JAX's partitionable layout. Mirrors s3r::threefry2x32 exactly.
inline __m512i threefry_xor16(Key key, __m512i c0, __m512i c1) {
  const __m512i ks0 = _mm512_set1_epi32(static_cast<int32_t>(key.k0));
  const __m512i ks1 = _mm512_set1_epi32(static_cast<int32_t>(key.k1));
  const __m512i ks2 =
      _mm512_set1_epi32(static_cast<int32_t>(key.k0 ^ key.k1 ^ threefry_detail::kParity));
  __m512i x0 = _mm512_add_epi32(c0, ks0);
  __m512i x1 = _mm512_add_epi32(c1, ks1);
#define S3R_TF_ROUND(R)              \
  x0 = _mm512_add_epi32(x0, x1);     \
  x1 = _mm512_rol_epi32(x1, R);      \
  x1 = _mm512_xor_si512(x1, x0);
#define S3R_TF_INJECT(A, B, S)                                                  \
  x0 = _mm512_add_epi32(x0, A);                                                 \
  x1 = _mm512_add_epi32(x1, _mm512_add_epi32(B, _mm512_set1_epi32(S)));
  S3R_TF_ROUND(13) S3R_TF_ROUND(15) S3R_TF_ROUND(26) S3R_TF_ROUND(6)
  S3R_TF_INJECT(ks1, ks2, 1)
  S3R_TF_ROUND(17) S3R_TF_ROUND(29) S3R_TF_ROUND(16) S3R_TF_ROUND(24)
  S3R_TF_INJECT(ks2, ks0, 2)
  S3R_TF_ROUND(13) S3R_TF_ROUND(15) S3R_TF_ROUND(26) S3R_TF_ROUND(6)
  S3R_TF_INJECT(ks0, ks1, 3)
  S3R_TF_ROUND(17) S3R_TF_ROUND(29) S3R_TF_ROUND(16) S3R_TF_ROUND(24)
  S3R_TF_INJECT(ks1, ks2, 4)
  S3R_TF_ROUND(13) S3R_TF_ROUND(15) S3R_TF_ROUND(26) S3R_TF_ROUND(6)
  S3R_TF_INJECT(ks2, ks0, 5)
#undef S3R_TF_ROUND
#undef S3R_TF_INJECT
  return _mm512_xor_si512(x0, x1);
}

// random_bits32(key, base + lane) for 16 lanes.
inline __m512i random_bits16(Key key, uint64_t base) {
  __m512i hi, lo;
  flat_index_halves(base, &hi, &lo);
  return threefry_xor16(key, hi, lo);
}

// uniform23 on 16 words: (bits >> 9) * 2^-23, exact.
inline __m512 uniform23_16(__m512i bits) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(bits, 9)),
                       _mm512_set1_ps(1.0f / 8388608.0f));
}

// Loads of 16 (or the first `mask` lanes of) f32 values; inactive lanes read as 0.
inline __m512 load16(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }
inline __m512 load16(const bf16* p, __mmask16 mask) {
  const __m256i raw = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// Lanes whose value is NaN or +-Inf (exponent all ones); AVX-512F only.
inline __mmask16 nonfinite_lanes(__m512 v) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7F800000);
  return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), exp_mask), exp_mask);
}

// clamp(q, -127, 127) to the symmetric int8 code range (ref::clamp_code).
inline __m512 clamp_code16(__m512 q) {
  return _mm512_min_ps(_mm512_max_ps(q, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
}

// The int8 codes of the active lanes of an integer-valued q in [-127, 127].
inline void store_codes16(int8_t* dst, __mmask16 mask, __m512 q) {
  _mm512_mask_cvtepi32_storeu_epi8(dst, mask, _mm512_cvtps_epi32(q));
}

inline __m512 round_nearest_even(__m512 v) {
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline __m512 round_floor(__m512 v) {
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}

// ref::exp_poly on N vectors of 16 lanes at once, in place, each step for all N before the next
// (the AVX2 tier's exp_poly8_n says why); the same operations on every lane (max/min return their
// second operand when one is NaN, so a NaN passes through as in the reference's comparisons).
template <int N>
inline void exp_poly16_n(__m512* v) {
  __m512 n[N], r[N], p[N];
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) {
    v[i] = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-87.0f), v[i]));
    n[i] = round_floor(_mm512_add_ps(_mm512_mul_ps(v[i], _mm512_set1_ps(1.44269504088896341f)),
                                     _mm512_set1_ps(0.5f)));
  }
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) r[i] = _mm512_sub_ps(v[i], _mm512_mul_ps(n[i], _mm512_set1_ps(0.693359375f)));
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) r[i] = _mm512_sub_ps(r[i], _mm512_mul_ps(n[i], _mm512_set1_ps(-2.12194440e-4f)));
  constexpr float kCoef[] = {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                             5.0000001201e-1f};
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) p[i] = _mm512_set1_ps(1.9875691500e-4f);
#pragma GCC unroll 5
  for (const float c : kCoef) {
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) p[i] = _mm512_add_ps(_mm512_mul_ps(p[i], r[i]), _mm512_set1_ps(c));
  }
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) {
    p[i] = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p[i], _mm512_mul_ps(r[i], r[i])), r[i]),
                         _mm512_set1_ps(1.0f));
    v[i] = _mm512_scalef_ps(p[i], n[i]);  // p * 2^n, exact like ldexp
  }
}
// ref::exp_poly on 16 lanes.
inline __m512 exp_poly16(__m512 x) {
  exp_poly16_n<1>(&x);
  return x;
}

}  // namespace s3r::kernels::avx512
