// AVX-512-tier int8 transpose (kernels/kernels.hpp): tiles of 16 rows x 64 columns through the
// unpack network of kernels/transpose_lanes.hpp (four 16 x 16 tiles per 512-bit vector). A copy,
// so byte for byte the reference's result.
//
// GCC 12's unpack and extract intrinsics pass _mm512_undefined_*() as their (unused) merge
// operand, and once inlined into this file's arrays of vectors -Wuninitialized reports it at the
// line of its own header; the operand is never read (the mask is all-ones).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include "kernels/kernels.hpp"
#include "kernels/transpose_lanes.hpp"

namespace s3r::kernels::avx512 {

namespace {

struct UnpackOps512 {
  static __m512i lo8(__m512i a, __m512i b) { return _mm512_unpacklo_epi8(a, b); }
  static __m512i hi8(__m512i a, __m512i b) { return _mm512_unpackhi_epi8(a, b); }
  static __m512i lo16(__m512i a, __m512i b) { return _mm512_unpacklo_epi16(a, b); }
  static __m512i hi16(__m512i a, __m512i b) { return _mm512_unpackhi_epi16(a, b); }
  static __m512i lo32(__m512i a, __m512i b) { return _mm512_unpacklo_epi32(a, b); }
  static __m512i hi32(__m512i a, __m512i b) { return _mm512_unpackhi_epi32(a, b); }
  static __m512i lo64(__m512i a, __m512i b) { return _mm512_unpacklo_epi64(a, b); }
  static __m512i hi64(__m512i a, __m512i b) { return _mm512_unpackhi_epi64(a, b); }
};

// Rows [r, r + 16), columns [c, c + 64): lane L of columns[j] is column c + 16L + j.
void tile_16x64(int8_t* dst, int64_t ldd, const int8_t* src, int64_t lds, int64_t r, int64_t c) {
  __m512i rows[kTransposeRows], columns[kTransposeRows];
  for (int i = 0; i < kTransposeRows; ++i) rows[i] = _mm512_loadu_si512(src + (r + i) * lds + c);
  transpose_lanes<__m512i, UnpackOps512>(rows, columns);
  for (int j = 0; j < kTransposeRows; ++j) {
    int8_t* column = dst + (c + j) * ldd + r;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(column), _mm512_castsi512_si128(columns[j]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(column + 16 * ldd),
                     _mm512_extracti32x4_epi32(columns[j], 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(column + 32 * ldd),
                     _mm512_extracti32x4_epi32(columns[j], 2));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(column + 48 * ldd),
                     _mm512_extracti32x4_epi32(columns[j], 3));
  }
}

}  // namespace

void transpose_s8(int8_t* dst, int64_t ldd, const int8_t* src, int64_t lds, int64_t r0, int64_t r1,
                  int64_t cols) {
  transpose_bands<64>(dst, ldd, src, lds, r0, r1, cols, tile_16x64);
}

}  // namespace s3r::kernels::avx512
