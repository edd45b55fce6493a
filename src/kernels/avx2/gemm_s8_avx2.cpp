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
  // Four pairs per trip: the loop's pointer updates and branch are scalar operations that an Intel
  // core may issue on the three vector ports this loop saturates (two pairs per trip against one:
  // 1-3% faster on Emerald Rapids), and instructions that a core's front end must issue: each
  // pair's 32 already take 5.3 of the 6 a Zen 3 core dispatches per cycle at two vpmaddwd per
  // cycle (four against two: 0.967-0.981x the time over `wide`'s nine products on a busy Zen 3,
  // where the same code against itself gave 0.995-0.999x).
#pragma GCC unroll 4
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

namespace {

// The first n (<= 16) codes at p, the other bytes 0; reads only those n bytes.
__m128i first_codes(const int8_t* p, int64_t n) {
  if (n == 16) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  alignas(16) int8_t buf[16] = {};
  std::memcpy(buf, p, static_cast<size_t>(n));
  return _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
}

// Words j < 16 of (lo[j], hi[j]) to out: the bytes side by side, then each widened to int16.
void store_pair_words16(uint32_t* out, __m128i lo, __m128i hi) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(lo, hi)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8), _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(lo, hi)));
}

// r[i] = words (i, 0..7) -> r[q] = words (0..7, q).
void transpose8_epi32(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int q = 0; q < 4; ++q) {
    r[q] = _mm256_permute2x128_si256(u[q], u[q + 4], 0x20);
    r[q + 4] = _mm256_permute2x128_si256(u[q], u[q + 4], 0x31);
  }
}

// The first n (<= 8) codes at p widened to int16, the other lanes 0; reads 8 bytes when `whole`.
__m128i widen8(const int8_t* p, int64_t n, bool whole) {
  if (whole) return _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  int64_t v = 0;
  std::memcpy(&v, p, static_cast<size_t>(n));
  return _mm_cvtepi8_epi16(_mm_cvtsi64_si128(v));
}

// Rows contiguous (stride_r == 1): each pair is two runs of `valid` codes, stride_k apart. A
// 6-row panel reads its runs as 8 bytes where that stays inside the operand (a later run starts
// at least 8 bytes on); only the operand's last run and partial panels go through a copy.
void pack_pairs_of_runs(uint32_t* out, const int8_t* x, int64_t stride_k, int64_t valid, int64_t width,
                        int64_t K) {
  if (width == kS8Nr) {
    for (int64_t k = 0; k < K; k += 2) {
      const __m128i lo = first_codes(x + k * stride_k, valid);
      const __m128i hi = k + 1 < K ? first_codes(x + (k + 1) * stride_k, valid) : _mm_setzero_si128();
      store_pair_words16(out + (k / 2) * kS8Nr, lo, hi);
    }
    return;
  }
  const bool full = valid == kS8Mr && stride_k >= 8;
  for (int64_t k = 0; k < K; k += 2) {
    const __m128i lo = widen8(x + k * stride_k, valid, full && k + 1 < K);
    const __m128i hi = k + 1 < K ? widen8(x + (k + 1) * stride_k, valid, full && k + 2 < K) : _mm_setzero_si128();
    uint32_t* o = out + (k / 2) * kS8Mr;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm_unpacklo_epi16(lo, hi));     // words 0-3
    _mm_storel_epi64(reinterpret_cast<__m128i*>(o + 4), _mm_unpackhi_epi16(lo, hi));  // words 4-5
  }
}

// A row's codes contiguous (stride_k == 1): eight pairs of eight rows at a time, widened and
// transposed; returns the pairs done (the rest are the caller's).
int64_t pack_pairs_of_rows(uint32_t* out, const int8_t* x, int64_t stride_r, int64_t valid, int64_t width,
                           int64_t K) {
  const __m256i mask6 = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
  int64_t p0 = 0;
  for (; 2 * (p0 + 8) <= K; p0 += 8) {
    for (int64_t g = 0; g < width; g += 8) {
      __m256i r[8];
      for (int64_t j = 0; j < 8; ++j) {
        r[j] = g + j < valid ? _mm256_cvtepi8_epi16(_mm_loadu_si128(
                                   reinterpret_cast<const __m128i*>(x + (g + j) * stride_r + 2 * p0)))
                             : _mm256_setzero_si256();
      }
      transpose8_epi32(r);
      for (int64_t q = 0; q < 8; ++q) {
        uint32_t* o = out + (p0 + q) * width + g;
        if (width == kS8Nr) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), r[q]);
        } else {
          _mm256_maskstore_epi32(reinterpret_cast<int*>(o), mask6, r[q]);
        }
      }
    }
  }
  return p0;
}

}  // namespace

void pack_s8_pairs(uint32_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k, int64_t valid,
                   int64_t width, int64_t K, int64_t pairs) {
  const int64_t used = (K + 1) / 2;
  std::memset(out + used * width, 0, static_cast<size_t>((pairs - used) * width) * sizeof(uint32_t));
  if (stride_r == 1) return pack_pairs_of_runs(out, x, stride_k, valid, width, K);
  // stride_k == 1; the pairs after the last whole eight by the reference
  const int64_t done = pack_pairs_of_rows(out, x, stride_r, valid, width, K);
  ref::pack_s8_pairs(out + done * width, x + 2 * done, stride_r, 1, valid, width, K - 2 * done, used - done);
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
