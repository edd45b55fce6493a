// AVX2-tier int8 transpose (kernels/kernels.hpp): tiles of 16 rows x 32 columns through the
// unpack network of kernels/transpose_lanes.hpp (two 16 x 16 tiles per 256-bit vector). A copy,
// so byte for byte the reference's result.
#include <immintrin.h>

#include "kernels/kernels.hpp"
#include "kernels/transpose_lanes.hpp"

namespace s3r::kernels::avx2 {

namespace {

struct UnpackOps256 {
  static __m256i lo8(__m256i a, __m256i b) { return _mm256_unpacklo_epi8(a, b); }
  static __m256i hi8(__m256i a, __m256i b) { return _mm256_unpackhi_epi8(a, b); }
  static __m256i lo16(__m256i a, __m256i b) { return _mm256_unpacklo_epi16(a, b); }
  static __m256i hi16(__m256i a, __m256i b) { return _mm256_unpackhi_epi16(a, b); }
  static __m256i lo32(__m256i a, __m256i b) { return _mm256_unpacklo_epi32(a, b); }
  static __m256i hi32(__m256i a, __m256i b) { return _mm256_unpackhi_epi32(a, b); }
  static __m256i lo64(__m256i a, __m256i b) { return _mm256_unpacklo_epi64(a, b); }
  static __m256i hi64(__m256i a, __m256i b) { return _mm256_unpackhi_epi64(a, b); }
};

// Rows [r, r + 16), columns [c, c + 32): lane L of columns[j] is column c + 16L + j.
void tile_16x32(int8_t* dst, int64_t ldd, const int8_t* src, int64_t lds, int64_t r, int64_t c) {
  __m256i rows[kTransposeRows], columns[kTransposeRows];
  for (int i = 0; i < kTransposeRows; ++i) {
    rows[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (r + i) * lds + c));
  }
  transpose_lanes<__m256i, UnpackOps256>(rows, columns);
  for (int j = 0; j < kTransposeRows; ++j) {
    int8_t* column = dst + (c + j) * ldd + r;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(column), _mm256_castsi256_si128(columns[j]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(column + 16 * ldd),
                     _mm256_extracti128_si256(columns[j], 1));
  }
}

}  // namespace

void transpose_s8(int8_t* dst, int64_t ldd, const int8_t* src, int64_t lds, int64_t r0, int64_t r1,
                  int64_t cols) {
  transpose_bands<32>(dst, ldd, src, lds, r0, r1, cols, tile_16x32);
}

}  // namespace s3r::kernels::avx2
