// AVX-512 VNNI block of s3r's int8-panel GEMM (kernels/gemm_s8.hpp): rows in groups of eight,
// each with two 16-column accumulators; per quad of k, two B vectors (codes + 128, u8), eight
// broadcasts of an A row's four codes (s8) and sixteen vpdpbusd, then 128 times the row's code
// sum subtracted. Integer sums are exact, so the result is the reference's bit for bit.
#include <immintrin.h>

#include <cstring>

#include "kernels/gemm_s8.hpp"

namespace s3r::kernels::avx512 {

namespace {
// acc += the four u8 x s8 products of each 32-bit lane of u and s (vpdpbusd). In assembly:
// GCC 12 copies the accumulator around its builtin (a register move per product, measured as
// most of the block's time).
inline void dpbusd(__m512i& acc, __m512i u, __m512i s) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
}
}  // namespace

void gemm_s8_vnni_block(const S8Rows& a, const int32_t* a_sums, const int8_t* b, int64_t kp,
                        int32_t* c, int64_t ldc) {
  constexpr int kRows = 8;
  const int8_t* b1 = b + kAmxRows * kp;
  for (int64_t r0 = 0; r0 < kAmxBlock; r0 += kRows) {
    __m512i acc[kRows][2];
    for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_si512();
    const int8_t* ar = a.a + (r0 / kAmxRows) * a.panel + (r0 % kAmxRows) * a.row;
    for (int64_t q = 0; q < kp / 4; ++q) {
      const __m512i v0 = _mm512_loadu_si512(b + q * 64), v1 = _mm512_loadu_si512(b1 + q * 64);
      const int8_t* aq = ar + q * a.quad;
#pragma GCC unroll 8
      for (int i = 0; i < kRows; ++i) {
        int32_t quad;
        std::memcpy(&quad, aq + i * a.row, sizeof(quad));
        const __m512i w = _mm512_set1_epi32(quad);
        dpbusd(acc[i][0], v0, w);
        dpbusd(acc[i][1], v1, w);
      }
    }
    for (int i = 0; i < kRows; ++i) {
      const __m512i shift = _mm512_set1_epi32(128 * a_sums[r0 + i]);
      _mm512_storeu_si512(c + (r0 + i) * ldc, _mm512_sub_epi32(acc[i][0], shift));
      _mm512_storeu_si512(c + (r0 + i) * ldc + kAmxRows, _mm512_sub_epi32(acc[i][1], shift));
    }
  }
}

void row_sums_s8(int32_t* sums, const S8Rows& a, int64_t kp) {
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t p = 0; p < kAmxBlock / kAmxRows; ++p) {
    const int8_t* panel = a.a + p * a.panel;
    if (a.row == 4 && a.quad == 64) {  // quads: lane i of each 64-byte row is row i's quad
      __m512i acc = _mm512_setzero_si512();
      for (int64_t q = 0; q < kp / 4; ++q) acc = _mm512_dpbusd_epi32(acc, ones, _mm512_loadu_si512(panel + q * 64));
      _mm512_storeu_si512(sums + p * kAmxRows, acc);
      continue;
    }
    for (int64_t i = 0; i < kAmxRows; ++i) {  // rows of codes (quad = 4)
      __m512i acc = _mm512_setzero_si512();
      for (int64_t k = 0; k < kp; k += 64) {
        acc = _mm512_dpbusd_epi32(acc, ones, _mm512_loadu_si512(panel + i * a.row + k));
      }
      sums[p * kAmxRows + i] = _mm512_reduce_add_epi32(acc);
    }
  }
}

}  // namespace s3r::kernels::avx512
