#pragma once
// AVX2 building blocks shared by the kernels in this folder (compiled only with -mavx2 -mfma;
// never include this from other translation units). The AVX2 twins mirror kernels/ref operation
// for operation, like the AVX-512 ones; AVX2 has no lane masks, so partial vectors (the last
// n < 8 lanes of a row) are read with vmaskmov (inactive lanes read as 0) and written through
// the same masks or a small stack buffer.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "s3r/core/bf16.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r::kernels::avx2 {

// Lanes 0..7.
inline __m256i lane_iota() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }

// All-ones in the first `n` 32-bit lanes (n in [0, 8]), zero in the others.
inline __m256i first_lanes(int64_t n) {
  const int active = n >= 8 ? 8 : static_cast<int>(n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(active), lane_iota());
}

// a < b as unsigned 32-bit integers, per lane (all-ones where true).
inline __m256i cmplt_epu32(__m256i a, __m256i b) {
  const __m256i sign = _mm256_set1_epi32(static_cast<int32_t>(0x80000000u));
  return _mm256_cmpgt_epi32(_mm256_xor_si256(b, sign), _mm256_xor_si256(a, sign));
}

// The 64-bit flat indices base + lane as (hi32, lo32) counter halves, carry included.
inline void flat_index_halves(uint64_t base, __m256i* hi, __m256i* lo) {
  const __m256i base_lo = _mm256_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(base)));
  *lo = _mm256_add_epi32(base_lo, lane_iota());
  const __m256i carry = cmplt_epu32(*lo, base_lo);  // all-ones = -1 where the low half wrapped
  const __m256i base_hi = _mm256_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(base >> 32)));
  *hi = _mm256_sub_epi32(base_hi, carry);
}

// Rotation left by R of every 32-bit lane. Multiples of 8 are one byte shuffle; the others two
// shifts and an or (AVX2 has no vprold).
template <int R>
inline __m256i rotl(__m256i x) {
  if constexpr (R == 8) {
    return _mm256_shuffle_epi8(x, _mm256_setr_epi8(3, 0, 1, 2, 7, 4, 5, 6, 11, 8, 9, 10, 15, 12, 13, 14,
                                                   3, 0, 1, 2, 7, 4, 5, 6, 11, 8, 9, 10, 15, 12, 13, 14));
  } else if constexpr (R == 16) {
    return _mm256_shuffle_epi8(x, _mm256_setr_epi8(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13,
                                                   2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  } else if constexpr (R == 24) {
    return _mm256_shuffle_epi8(x, _mm256_setr_epi8(1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12,
                                                   1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12));
  } else {
    return _mm256_or_si256(_mm256_slli_epi32(x, R), _mm256_srli_epi32(x, 32 - R));
  }
}

#define S3R_ALWAYS_INLINE inline __attribute__((always_inline))

// Threefry-2x32-20 on kN x 8 counters, the kN chains interleaved round by round (one chain alone
// is latency-bound). Mirrors s3r::threefry2x32 exactly: rounds add, rotate, xor; key injection
// after every 4 rounds.
template <int R, int kN>
S3R_ALWAYS_INLINE void tf_round(__m256i* x0, __m256i* x1) {
  for (int i = 0; i < kN; ++i) x0[i] = _mm256_add_epi32(x0[i], x1[i]);
  for (int i = 0; i < kN; ++i) x1[i] = rotl<R>(x1[i]);
  for (int i = 0; i < kN; ++i) x1[i] = _mm256_xor_si256(x1[i], x0[i]);
}

// Rounds 4g .. 4g + 3 for even and odd g.
template <int kN>
S3R_ALWAYS_INLINE void tf_rounds_even(__m256i* x0, __m256i* x1) {
  tf_round<13, kN>(x0, x1);
  tf_round<15, kN>(x0, x1);
  tf_round<26, kN>(x0, x1);
  tf_round<6, kN>(x0, x1);
}
template <int kN>
S3R_ALWAYS_INLINE void tf_rounds_odd(__m256i* x0, __m256i* x1) {
  tf_round<17, kN>(x0, x1);
  tf_round<29, kN>(x0, x1);
  tf_round<16, kN>(x0, x1);
  tf_round<24, kN>(x0, x1);
}

// Key injection s: x0 += a, x1 += b + s.
template <int kN>
S3R_ALWAYS_INLINE void tf_inject(__m256i* x0, __m256i* x1, __m256i a, __m256i b, int s) {
  const __m256i bs = _mm256_add_epi32(b, _mm256_set1_epi32(s));
  for (int i = 0; i < kN; ++i) x0[i] = _mm256_add_epi32(x0[i], a);
  for (int i = 0; i < kN; ++i) x1[i] = _mm256_add_epi32(x1[i], bs);
}

// y[i] = random_bits32(key, base + 8 i + lane) for i < kN: y0 ^ y1 of Threefry on the counters
// (hi32, lo32) of the flat indices, JAX's partitionable layout.
template <int kN>
S3R_ALWAYS_INLINE void random_bits8xN(Key key, uint64_t base, __m256i* y) {
  const __m256i ks0 = _mm256_set1_epi32(static_cast<int32_t>(key.k0));
  const __m256i ks1 = _mm256_set1_epi32(static_cast<int32_t>(key.k1));
  const __m256i ks2 =
      _mm256_set1_epi32(static_cast<int32_t>(key.k0 ^ key.k1 ^ threefry_detail::kParity));
  __m256i x0[kN], x1[kN];
  for (int i = 0; i < kN; ++i) {
    flat_index_halves(base + static_cast<uint64_t>(8 * i), &x0[i], &x1[i]);
    x0[i] = _mm256_add_epi32(x0[i], ks0);
    x1[i] = _mm256_add_epi32(x1[i], ks1);
  }
  tf_rounds_even<kN>(x0, x1);
  tf_inject<kN>(x0, x1, ks1, ks2, 1);
  tf_rounds_odd<kN>(x0, x1);
  tf_inject<kN>(x0, x1, ks2, ks0, 2);
  tf_rounds_even<kN>(x0, x1);
  tf_inject<kN>(x0, x1, ks0, ks1, 3);
  tf_rounds_odd<kN>(x0, x1);
  tf_inject<kN>(x0, x1, ks1, ks2, 4);
  tf_rounds_even<kN>(x0, x1);
  tf_inject<kN>(x0, x1, ks2, ks0, 5);
  for (int i = 0; i < kN; ++i) y[i] = _mm256_xor_si256(x0[i], x1[i]);
}

// uniform23 on 8 words: (bits >> 9) * 2^-23, exact.
inline __m256 uniform23_8(__m256i bits) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(bits, 9)),
                       _mm256_set1_ps(1.0f / 8388608.0f));
}

// Every lane of an 8-lane vector, as a type: a loop body that takes its mask as `auto` and is
// called with this one uses plain loads and stores (maskload8 / maskstore8), and the mask itself
// where it needs one (all ones).
struct AllLanes8 {
  operator __m256i() const { return _mm256_set1_epi32(-1); }
};
inline __m256 maskload8(const float* p, AllLanes8) { return _mm256_loadu_ps(p); }
inline __m256 maskload8(const float* p, __m256i mask) { return _mm256_maskload_ps(p, mask); }
inline void maskstore8(float* p, AllLanes8, __m256 v) { _mm256_storeu_ps(p, v); }
inline void maskstore8(float* p, __m256i mask, __m256 v) { _mm256_maskstore_ps(p, mask, v); }

// body(i, mask) for the 8-lane vectors of [begin, end): every whole vector with AllLanes8, then
// the partial last one (if any) with its first lanes; for_each_vector8_pair: body(i, mask0,
// mask1) for the 16-lane pairs (lanes i .. i + 7 and i + 8 .. i + 15). The same operations on the
// same lanes as one loop masked by first_lanes throughout, hence the same results to the bit; but
// vmaskmovps costs more than a plain move (capped to AVX2 on AMD Zen 5: RMSNorm's rows 1.5x and
// softmax cross-entropy's 1.5x slower with it), so the row loops of this folder use these.
template <class Body>
inline void for_each_vector8(int64_t begin, int64_t end, Body&& body) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) body(i, AllLanes8{});
  if (i < end) body(i, first_lanes(end - i));
}
template <class Body>
inline void for_each_vector8_pair(int64_t begin, int64_t end, Body&& body) {
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) body(i, AllLanes8{}, AllLanes8{});
  if (i < end) body(i, first_lanes(end - i), first_lanes(end - i - 8));
}

// Loads of 8 f32 values, or of the first n < 8 of them (the others read as 0).
inline __m256 load8(const float* p, int64_t n) {
  return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, first_lanes(n));
}
// bf16 -> f32 is exact (the bits shifted up); the first n < 8 values through a stack buffer.
inline __m256 load8(const bf16* p, int64_t n) {
  __m128i raw;
  if (n >= 8) {
    raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  } else {
    uint16_t buf[8] = {};
    std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(bf16));
    raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf));
  }
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// Stores the first min(n, 8) lanes.
inline void store8(float* p, int64_t n, __m256 v) {
  if (n >= 8) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, first_lanes(n), v);
  }
}

// All-ones in the lanes whose value is NaN or +-Inf (exponent all ones).
inline __m256i nonfinite_lanes(__m256 v) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7F800000);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), exp_mask), exp_mask);
}

inline __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// clamp(q, -127, 127) to the symmetric int8 code range (ref::clamp_code).
inline __m256 clamp_code8(__m256 q) {
  return _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
}

// The int8 codes of the first min(n, 8) lanes of an integer-valued q in [-127, 127].
inline void store_codes8(int8_t* dst, int64_t n, __m256 q) {
  const __m256i i32 = _mm256_cvtps_epi32(q);
  const __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
  const __m128i i8 = _mm_packs_epi16(i16, i16);  // exact: every value is in [-127, 127]
  if (n >= 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), i8);
  } else {
    alignas(16) int8_t buf[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(buf), i8);
    std::memcpy(dst, buf, static_cast<size_t>(n));
  }
}

inline __m256 round_nearest_even(__m256 v) {
  return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline __m256 round_floor(__m256 v) {
  return _mm256_round_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}

// ref::exp_poly on N vectors of 8 lanes at once, in place: each step of the polynomial for all
// N before the next, so that the out-of-order core sees N independent chains within its
// scheduler's window (one exp is a chain of about 30 dependent operations; on an AMD Zen 4 the
// attention's softmax took 1600 TSC cycles per 32 x 32 block pair one exp at a time, 1215 eight at
// a time). The same operations on every lane as one at a time: the same bits.
template <int N>
inline void exp_poly8_n(__m256* v) {
  __m256 n[N], r[N], p[N];
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) {
    // max/min return their second operand when one is NaN: a NaN x passes through, as in the
    // reference's comparisons.
    v[i] = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), v[i]));
    n[i] = round_floor(_mm256_add_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(1.44269504088896341f)),
                                     _mm256_set1_ps(0.5f)));
  }
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) r[i] = _mm256_sub_ps(v[i], _mm256_mul_ps(n[i], _mm256_set1_ps(0.693359375f)));
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) r[i] = _mm256_sub_ps(r[i], _mm256_mul_ps(n[i], _mm256_set1_ps(-2.12194440e-4f)));
  constexpr float kCoef[] = {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                             5.0000001201e-1f};
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) p[i] = _mm256_set1_ps(1.9875691500e-4f);
#pragma GCC unroll 5
  for (const float c : kCoef) {
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) p[i] = _mm256_add_ps(_mm256_mul_ps(p[i], r[i]), _mm256_set1_ps(c));
  }
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) {
    p[i] = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p[i], _mm256_mul_ps(r[i], r[i])), r[i]),
                         _mm256_set1_ps(1.0f));
  }
  // p * 2^n without scalef: after the clamp n = floor(x log2(e) + 0.5) is an integer in
  // [-126, 127], so 2^n is a normal float whose bits are (n + 127) << 23 (biased exponent in
  // [1, 254], mantissa 0). p lies in about [0.7, 1.42] (|r| <= ln2/2) and p > 1 where n = -126
  // (r >= 0.33 there), so p * 2^n is a normal number: the multiply only changes the exponent,
  // is exact, and equals std::ldexp(p, n) bit for bit.
#pragma GCC unroll 8
  for (int i = 0; i < N; ++i) {
    const __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n[i]), _mm256_set1_epi32(127)), 23);
    v[i] = _mm256_mul_ps(p[i], _mm256_castsi256_ps(bits));
  }
}
// ref::exp_poly on 8 lanes.
inline __m256 exp_poly8(__m256 x) {
  exp_poly8_n<1>(&x);
  return x;
}

// Horizontal max of 8 lanes (exact in any order).
inline float reduce_max8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// Horizontal sum of 8 lanes: (l0+l4) + (l2+l6) + ((l1+l5) + (l3+l7)), a fixed order.
inline float reduce_add8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// True when any lane of the mask is set.
inline bool any_lane(__m256i mask) { return _mm256_movemask_epi8(mask) != 0; }

}  // namespace s3r::kernels::avx2
