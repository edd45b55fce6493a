// Scalar reference of the int8 GEMM: the packed-panel tile and plain loops (the oracle).
#include "kernels/gemm_s8.hpp"

namespace s3r::kernels::ref {

namespace {
int32_t dot2(uint32_t a, uint32_t b) {
  const auto lo = [](uint32_t w) { return static_cast<int32_t>(static_cast<int16_t>(w & 0xFFFFu)); };
  const auto hi = [](uint32_t w) { return static_cast<int32_t>(static_cast<int16_t>(w >> 16)); };
  return lo(a) * lo(b) + hi(a) * hi(b);
}
}  // namespace

void gemm_s8_tile(const uint32_t* a, const uint32_t* b, int64_t pairs, int32_t* c, int64_t ldc,
                  bool accumulate) {
  for (int64_t i = 0; i < kS8Mr; ++i) {
    for (int64_t j = 0; j < kS8Nr; ++j) {
      int32_t sum = accumulate ? c[i * ldc + j] : 0;
      for (int64_t p = 0; p < pairs; ++p) sum += dot2(a[p * kS8Mr + i], b[p * kS8Nr + j]);
      c[i * ldc + j] = sum;
    }
  }
}

void gemm_s8_rows(int32_t* c, int64_t ldc, const int8_t* A, int64_t lda, bool ta, const int8_t* B,
                  int64_t ldb, bool tb, int64_t N, int64_t K, int64_t m0, int64_t m1) {
  // op(A)[m, k] = A[m * a_m + k * a_k], op(B)[k, n] = B[k * b_k + n * b_n].
  const int64_t a_m = ta ? 1 : lda, a_k = ta ? lda : 1;
  const int64_t b_k = tb ? 1 : ldb, b_n = tb ? ldb : 1;
  for (int64_t m = m0; m < m1; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      int32_t sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += int32_t{A[m * a_m + k * a_k]} * B[k * b_k + n * b_n];
      c[(m - m0) * ldc + n] = sum;
    }
  }
}

}  // namespace s3r::kernels::ref
