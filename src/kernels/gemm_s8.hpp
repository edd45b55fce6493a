#pragma once
// Kernels of s3r's own exact int8 GEMM (the driver: gemm/s8_gemm.cpp).
//
// Packed operands: codes in [-127, 127] widened to int16, two consecutive k in one 32-bit word
// (low half k = 2p, high half k = 2p + 1; when K is odd the last word's high half is 0).
//   A micro-panel: kS8Mr rows of op(A), word [p * kS8Mr + i] = (A[i, 2p], A[i, 2p + 1])
//   B micro-panel: kS8Nr columns of op(B), word [p * kS8Nr + j] = (B[2p, j], B[2p + 1, j])
// A product of two words is a[lo] b[lo] + a[hi] b[hi]: |.| <= 2 * 127^2, exact in int32, and a
// sum over pairs stays exact while K * 127^2 < 2^31 (K < 133000; the driver checks).
#include <cstdint>

namespace s3r::kernels {

inline constexpr int64_t kS8Mr = 6;   // rows of A per micro-panel
inline constexpr int64_t kS8Nr = 16;  // columns of B per micro-panel

// The packed-panel microkernel of every tier that has one:
//   c[i * ldc + j] (+)= sum_{p < pairs} dot2(a[p * kS8Mr + i], b[p * kS8Nr + j])
// for i < kS8Mr, j < kS8Nr; `accumulate` adds to c instead of overwriting it.
#define S3R_DECLARE_S8_TILE                                                                  \
  void gemm_s8_tile(const uint32_t* a, const uint32_t* b, int64_t pairs, int32_t* c,          \
                    int64_t ldc, bool accumulate);

namespace ref {
S3R_DECLARE_S8_TILE
// Plain loops, the oracle: c[(m - m0) * ldc + n] = sum_k op(A)[m, k] op(B)[k, n] for rows m in
// [m0, m1), all n < N; op(A)[m, k] = A[ta ? k * lda + m : m * lda + k],
// op(B)[k, n] = B[tb ? n * ldb + k : k * ldb + n].
void gemm_s8_rows(int32_t* c, int64_t ldc, const int8_t* A, int64_t lda, bool ta, const int8_t* B,
                  int64_t ldb, bool tb, int64_t N, int64_t K, int64_t m0, int64_t m1);
}  // namespace ref
namespace avx2 {
S3R_DECLARE_S8_TILE
}  // namespace avx2
#undef S3R_DECLARE_S8_TILE

}  // namespace s3r::kernels
