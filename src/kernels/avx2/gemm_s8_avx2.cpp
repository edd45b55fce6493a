// AVX2 microkernel of the exact int8 GEMM (kernels/gemm_s8.hpp): a 6 x 16 tile of int32
// accumulators in 12 ymm registers. Per pair of k: two B vectors (16 columns x 2 k as int16),
// six broadcasts of an A word, twelve vpmaddwd (each lane: a_lo b_lo + a_hi b_hi, exact in int32)
// and twelve vpaddd. (ggml's sign trick, vpmaddubsw(|a|, sign(b, a)) with a widening vpmaddwd,
// needs four operations per 32 products instead of two per 16, and more of them on the two
// multiply ports; bench/gemm_bench.cpp measures both loops.)
#include <immintrin.h>

#include <cstring>

#include "kernels/gemm_s8.hpp"
#include "kernels/kernels.hpp"

namespace s3r::kernels::avx2 {

void gemm_s8_tile(const uint32_t* a, const uint32_t* b, int64_t pairs, int32_t* c, int64_t ldc,
                  bool accumulate) {
  static_assert(kS8Mr == 6 && kS8Nr == 16, "the register tiling below is 6 x 16");
  __m256i c00 = _mm256_setzero_si256(), c01 = _mm256_setzero_si256();
  __m256i c10 = _mm256_setzero_si256(), c11 = _mm256_setzero_si256();
  __m256i c20 = _mm256_setzero_si256(), c21 = _mm256_setzero_si256();
  __m256i c30 = _mm256_setzero_si256(), c31 = _mm256_setzero_si256();
  __m256i c40 = _mm256_setzero_si256(), c41 = _mm256_setzero_si256();
  __m256i c50 = _mm256_setzero_si256(), c51 = _mm256_setzero_si256();
  const int* ap = reinterpret_cast<const int*>(a);
  for (int64_t p = 0; p < pairs; ++p) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + p * kS8Nr));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + p * kS8Nr + 8));
    const int* arow = ap + p * kS8Mr;
    __m256i av = _mm256_set1_epi32(arow[0]);
    c00 = _mm256_add_epi32(c00, _mm256_madd_epi16(av, b0));
    c01 = _mm256_add_epi32(c01, _mm256_madd_epi16(av, b1));
    av = _mm256_set1_epi32(arow[1]);
    c10 = _mm256_add_epi32(c10, _mm256_madd_epi16(av, b0));
    c11 = _mm256_add_epi32(c11, _mm256_madd_epi16(av, b1));
    av = _mm256_set1_epi32(arow[2]);
    c20 = _mm256_add_epi32(c20, _mm256_madd_epi16(av, b0));
    c21 = _mm256_add_epi32(c21, _mm256_madd_epi16(av, b1));
    av = _mm256_set1_epi32(arow[3]);
    c30 = _mm256_add_epi32(c30, _mm256_madd_epi16(av, b0));
    c31 = _mm256_add_epi32(c31, _mm256_madd_epi16(av, b1));
    av = _mm256_set1_epi32(arow[4]);
    c40 = _mm256_add_epi32(c40, _mm256_madd_epi16(av, b0));
    c41 = _mm256_add_epi32(c41, _mm256_madd_epi16(av, b1));
    av = _mm256_set1_epi32(arow[5]);
    c50 = _mm256_add_epi32(c50, _mm256_madd_epi16(av, b0));
    c51 = _mm256_add_epi32(c51, _mm256_madd_epi16(av, b1));
  }
  const __m256i rows[kS8Mr][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                                  {c30, c31}, {c40, c41}, {c50, c51}};
  for (int64_t i = 0; i < kS8Mr; ++i) {
    __m256i* out = reinterpret_cast<__m256i*>(c + i * ldc);
    __m256i v0 = rows[i][0], v1 = rows[i][1];
    if (accumulate) {
      v0 = _mm256_add_epi32(v0, _mm256_loadu_si256(out));
      v1 = _mm256_add_epi32(v1, _mm256_loadu_si256(out + 1));
    }
    _mm256_storeu_si256(out, v0);
    _mm256_storeu_si256(out + 1, v1);
  }
}

// ref::gemm_s8_epilogue in 8 lanes, the same operations in the same order (no fma: the build's
// -ffp-contract=off), so the same bits; the last cols % 8 columns as the reference does them.
void gemm_s8_epilogue(const S8Epilogue& e, const int32_t* acc, int64_t ld_acc, int64_t m0,
                      int64_t rows, int64_t n0, int64_t cols) {
  if (e.dx != nullptr) return dx_epilogue(e.f32, e.ldc, acc, ld_acc, m0, m0 + rows, n0, n0 + cols, *e.dx);
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t* a = acc + i * ld_acc;
    const int64_t m = m0 + i;
    if (e.s32 != nullptr) {
      std::memcpy(e.s32 + m * e.ldc + n0, a, static_cast<size_t>(cols) * sizeof(int32_t));
      continue;
    }
    float* c = e.f32 + m * e.ldc + n0;
    const float* cs = e.col_scale != nullptr ? e.col_scale + n0 : nullptr;
    const bool row = e.row_scale != nullptr;
    const float r = row ? e.row_scale[m] : 1.0f;
    const __m256 rs = _mm256_set1_ps(r);
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8) {
      __m256 v = _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + j)));
      if (cs != nullptr) v = _mm256_mul_ps(v, _mm256_loadu_ps(cs + j));
      if (row) v = _mm256_mul_ps(v, rs);
      if (e.accumulate) v = _mm256_add_ps(_mm256_loadu_ps(c + j), v);
      _mm256_storeu_ps(c + j, v);
    }
    for (; j < cols; ++j) {
      float v = static_cast<float>(a[j]);
      if (cs != nullptr) v = v * cs[j];
      if (row) v = v * r;
      c[j] = e.accumulate ? c[j] + v : v;
    }
  }
}

}  // namespace s3r::kernels::avx2
