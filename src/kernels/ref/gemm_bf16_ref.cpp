// Scalar reference of the bf16 GEMM's panels and block (kernels/gemm_bf16.hpp): vdpbf16ps's
// arithmetic written out, one fma per product.
#include <cmath>
#include <cstring>

#include "kernels/gemm_bf16.hpp"

namespace s3r::kernels::ref {

namespace {
// A subnormal read or written as zero of its sign (vdpbf16ps: DAZ in, FTZ out).
float flush(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

float widen(const bf16* p) { return flush(to_float(*p)); }
}  // namespace

void pack_bf16_panels(bf16* out, const bf16* x, int64_t stride_r, int64_t stride_k, int64_t valid,
                      int64_t panels, int64_t K, int64_t kp) {
  std::memset(out, 0, static_cast<size_t>(panels * kBf16Rows * kp) * sizeof(bf16));
  for (int64_t r = 0; r < valid; ++r) {
    bf16* panel = out + (r / kBf16Rows) * kBf16Rows * kp;
    const int64_t i = r % kBf16Rows;
    for (int64_t k = 0; k < K; ++k) panel[(k / 2) * 2 * kBf16Rows + 2 * i + k % 2] = x[r * stride_r + k * stride_k];
  }
}

void pack_bf16_rows(bf16* out, const bf16* x, int64_t stride_r, int64_t stride_k, int64_t valid,
                    int64_t rows, int64_t K, int64_t kp) {
  std::memset(out, 0, static_cast<size_t>(rows * kp) * sizeof(bf16));
  for (int64_t r = 0; r < valid; ++r) {
    for (int64_t k = 0; k < K; ++k) out[r * kp + k] = x[r * stride_r + k * stride_k];
  }
}

void gemm_bf16_block(const Bf16Rows& a, const bf16* b, int64_t kp, float* c, int64_t ldc, bool /*stream*/) {
  for (int64_t i = 0; i < kBf16Block; ++i) {
    const bf16* ai = a.a + (i / kBf16Rows) * a.panel + (i % kBf16Rows) * a.row;
    for (int64_t j = 0; j < kBf16Block; ++j) {
      const bf16* bj = b + (j / kBf16Rows) * kBf16Rows * kp + 2 * (j % kBf16Rows);
      float acc = 0.0f;
      for (int64_t p = 0; p < kp / 2; ++p) {
        const bf16* ap = ai + p * a.pair;
        const bf16* bp = bj + p * 2 * kBf16Rows;
        acc = flush(std::fma(widen(ap + 1), widen(bp + 1), acc));
        acc = flush(std::fma(widen(ap), widen(bp), acc));
      }
      c[i * ldc + j] = acc;
    }
  }
}

}  // namespace s3r::kernels::ref
