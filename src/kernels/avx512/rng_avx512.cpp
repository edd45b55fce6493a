// AVX-512 random-word kernels: 16 counters per vector, four vectors in flight per iteration so
// that the add-rotate-xor chains of independent counters overlap.
#include "kernels/avx512/common_avx512.hpp"
#include "kernels/kernels.hpp"

namespace s3r::kernels::avx512 {

void threefry_bits(Key key, uint64_t first, uint32_t* out, int64_t n) {
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) {
    const uint64_t base = first + static_cast<uint64_t>(j);
    const __m512i w0 = random_bits16(key, base);
    const __m512i w1 = random_bits16(key, base + 16);
    const __m512i w2 = random_bits16(key, base + 32);
    const __m512i w3 = random_bits16(key, base + 48);
    _mm512_storeu_si512(out + j, w0);
    _mm512_storeu_si512(out + j + 16, w1);
    _mm512_storeu_si512(out + j + 32, w2);
    _mm512_storeu_si512(out + j + 48, w3);
  }
  for_each_vector16(j, n, [&](int64_t i, auto m) {  // the last 0..63 words
    const __m512i w = random_bits16(key, first + static_cast<uint64_t>(i));
    _mm512_mask_storeu_epi32(out + i, m, w);
  });
}

namespace {

// (hi, lo) 32-bit halves of the 16 products a[i] * m.
inline void mulhilo16(__m512i a, uint32_t m, __m512i* hi, __m512i* lo) {
  const __m512i mv = _mm512_set1_epi32(static_cast<int32_t>(m));
  const __m512i even = _mm512_mul_epu32(a, mv);                         // lanes 0,2,.. as u64
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), mv);  // lanes 1,3,.. as u64
  *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

// Philox-4x32-10 of the 16 blocks base .. base+15, written as 64 consecutive words.
inline void philox_64_words(PhiloxKey key, uint64_t base_block, uint32_t* out) {
  using namespace philox_detail;
  __m512i c1, c0;
  flat_index_halves(base_block, &c1, &c0);  // counter = (lo32(block), hi32(block), 0, 0)
  __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    __m512i hi0, lo0, hi1, lo1;
    mulhilo16(c0, kMul0, &hi0, &lo0);
    mulhilo16(c2, kMul1, &hi1, &lo1);
    const __m512i n0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1),
                                        _mm512_set1_epi32(static_cast<int32_t>(k0)));
    const __m512i n2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3),
                                        _mm512_set1_epi32(static_cast<int32_t>(k1)));
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  // Transpose (4 words x 16 blocks) into block-major word order: a 4x4 transpose inside each
  // 128-bit lane, then a 4x4 transpose of the 128-bit lanes.
  const __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpackhi_epi32(c0, c1);
  const __m512i t2 = _mm512_unpacklo_epi32(c2, c3), t3 = _mm512_unpackhi_epi32(c2, c3);
  const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
  const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
  const __m512i v0 = _mm512_shuffle_i32x4(u0, u1, 0x44), v1 = _mm512_shuffle_i32x4(u2, u3, 0x44);
  const __m512i v2 = _mm512_shuffle_i32x4(u0, u1, 0xEE), v3 = _mm512_shuffle_i32x4(u2, u3, 0xEE);
  _mm512_storeu_si512(out, _mm512_shuffle_i32x4(v0, v1, 0x88));
  _mm512_storeu_si512(out + 16, _mm512_shuffle_i32x4(v0, v1, 0xDD));
  _mm512_storeu_si512(out + 32, _mm512_shuffle_i32x4(v2, v3, 0x88));
  _mm512_storeu_si512(out + 48, _mm512_shuffle_i32x4(v2, v3, 0xDD));
}

}  // namespace

void philox_bits(PhiloxKey key, uint64_t first, uint32_t* out, int64_t n) {
  int64_t j = 0;
  // Scalar head up to a block boundary, vector body of 16 blocks, scalar tail.
  for (; j < n && ((first + static_cast<uint64_t>(j)) & 3) != 0; ++j) {
    out[j] = philox_bits32(key, first + static_cast<uint64_t>(j));
  }
  for (; j + 64 <= n; j += 64) philox_64_words(key, (first + static_cast<uint64_t>(j)) >> 2, out + j);
  for (; j < n; ++j) out[j] = philox_bits32(key, first + static_cast<uint64_t>(j));
}

}  // namespace s3r::kernels::avx512
