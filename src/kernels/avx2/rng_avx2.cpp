// AVX2 random-word kernels: 8 counters per vector, four (Threefry) or two (Philox) vectors in
// flight per iteration, their chains interleaved round by round so that the add-rotate-xor (or
// multiply-xor) chains of independent counters overlap: one chain alone is latency-bound.
#include "kernels/avx2/common_avx2.hpp"
#include "kernels/kernels.hpp"


namespace s3r::kernels::avx2 {

namespace {

S3R_ALWAYS_INLINE void store8_words(uint32_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}

}  // namespace

void threefry_bits(Key key, uint64_t first, uint32_t* out, int64_t n) {
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    __m256i w[4];
    random_bits8xN<4>(key, first + static_cast<uint64_t>(j), w);
    for (int i = 0; i < 4; ++i) store8_words(out + j + 8 * i, w[i]);
  }
  for (; j < n; j += 8) {  // the last 0..31 words, the last vector partial
    __m256i w;
    random_bits8xN<1>(key, first + static_cast<uint64_t>(j), &w);
    if (n - j >= 8) {
      store8_words(out + j, w);
    } else {
      _mm256_maskstore_epi32(reinterpret_cast<int*>(out + j), first_lanes(n - j), w);
    }
  }
}

namespace {

// (hi, lo) 32-bit halves of the 8 products a[i] * m.
S3R_ALWAYS_INLINE void mulhilo8(__m256i a, __m256i m, __m256i* hi, __m256i* lo) {
  const __m256i even = _mm256_mul_epu32(a, m);                         // lanes 0,2,.. as u64
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);  // lanes 1,3,.. as u64
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// The round keys (k0, k1) of the 10 rounds, broadcast once per call of philox_bits.
struct PhiloxRoundKeys {
  __m256i k0[10], k1[10];
};

inline PhiloxRoundKeys round_keys(PhiloxKey key) {
  using namespace philox_detail;
  PhiloxRoundKeys rk;
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    rk.k0[r] = _mm256_set1_epi32(static_cast<int32_t>(k0));
    rk.k1[r] = _mm256_set1_epi32(static_cast<int32_t>(k1));
  }
  return rk;
}

// Philox-4x32-10 of the 8 kN blocks base .. base + 8 kN - 1, written as 32 kN consecutive words;
// the kN groups of 8 blocks interleaved round by round.
template <int kN>
S3R_ALWAYS_INLINE void philox_words(const PhiloxRoundKeys& rk, uint64_t base_block,
                                    uint32_t* out) {
  using namespace philox_detail;
  const __m256i mul0 = _mm256_set1_epi32(static_cast<int32_t>(kMul0));
  const __m256i mul1 = _mm256_set1_epi32(static_cast<int32_t>(kMul1));
  __m256i c0[kN], c1[kN], c2[kN], c3[kN];
  for (int i = 0; i < kN; ++i) {
    // counter = (lo32(block), hi32(block), 0, 0)
    flat_index_halves(base_block + static_cast<uint64_t>(8 * i), &c1[i], &c0[i]);
    c2[i] = _mm256_setzero_si256();
    c3[i] = _mm256_setzero_si256();
  }
  for (int r = 0; r < 10; ++r) {
    for (int i = 0; i < kN; ++i) {
      __m256i hi0, lo0, hi1, lo1;
      mulhilo8(c0[i], mul0, &hi0, &lo0);
      mulhilo8(c2[i], mul1, &hi1, &lo1);
      c0[i] = _mm256_xor_si256(_mm256_xor_si256(hi1, c1[i]), rk.k0[r]);
      c2[i] = _mm256_xor_si256(_mm256_xor_si256(hi0, c3[i]), rk.k1[r]);
      c1[i] = lo1;
      c3[i] = lo0;
    }
  }
  for (int i = 0; i < kN; ++i) {
    // Transpose (4 words x 8 blocks) into block-major word order: a 4x4 transpose inside each
    // 128-bit lane (blocks 0-3 low, 4-7 high), then the 128-bit halves regrouped by block pairs.
    const __m256i t0 = _mm256_unpacklo_epi32(c0[i], c1[i]);
    const __m256i t1 = _mm256_unpackhi_epi32(c0[i], c1[i]);
    const __m256i t2 = _mm256_unpacklo_epi32(c2[i], c3[i]);
    const __m256i t3 = _mm256_unpackhi_epi32(c2[i], c3[i]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2);  // blocks 0 | 4
    const __m256i u1 = _mm256_unpackhi_epi64(t0, t2);  // blocks 1 | 5
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3);  // blocks 2 | 6
    const __m256i u3 = _mm256_unpackhi_epi64(t1, t3);  // blocks 3 | 7
    uint32_t* o = out + 32 * i;
    store8_words(o, _mm256_permute2x128_si256(u0, u1, 0x20));
    store8_words(o + 8, _mm256_permute2x128_si256(u2, u3, 0x20));
    store8_words(o + 16, _mm256_permute2x128_si256(u0, u1, 0x31));
    store8_words(o + 24, _mm256_permute2x128_si256(u2, u3, 0x31));
  }
}

}  // namespace

void philox_bits(PhiloxKey key, uint64_t first, uint32_t* out, int64_t n) {
  int64_t j = 0;
  // Scalar head up to a block boundary, vector body of 16 (then 8) blocks, scalar tail.
  for (; j < n && ((first + static_cast<uint64_t>(j)) & 3) != 0; ++j) {
    out[j] = philox_bits32(key, first + static_cast<uint64_t>(j));
  }
  if (j + 32 <= n) {
    const PhiloxRoundKeys rk = round_keys(key);
    for (; j + 64 <= n; j += 64) {
      philox_words<2>(rk, (first + static_cast<uint64_t>(j)) >> 2, out + j);
    }
    if (j + 32 <= n) {
      philox_words<1>(rk, (first + static_cast<uint64_t>(j)) >> 2, out + j);
      j += 32;
    }
  }
  for (; j < n; ++j) out[j] = philox_bits32(key, first + static_cast<uint64_t>(j));
}

}  // namespace s3r::kernels::avx2

#undef S3R_ALWAYS_INLINE
