// Scalar reference of the int8 GEMM: the packed-panel tile and plain loops (the oracle).
#include "kernels/gemm_s8.hpp"
#include "kernels/kernels.hpp"

#include <cstring>

namespace s3r::kernels::ref {

namespace {
int32_t dot2(uint32_t a, uint32_t b) {
  const auto lo = [](uint32_t w) { return static_cast<int32_t>(static_cast<int16_t>(w & 0xFFFFu)); };
  const auto hi = [](uint32_t w) { return static_cast<int32_t>(static_cast<int16_t>(w >> 16)); };
  return lo(a) * lo(b) + hi(a) * hi(b);
}

uint32_t pair_word(int8_t lo, int8_t hi) {
  return static_cast<uint32_t>(static_cast<uint16_t>(int16_t{lo})) |
         (static_cast<uint32_t>(static_cast<uint16_t>(int16_t{hi})) << 16);
}
}  // namespace

void pack_s8_pairs(uint32_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k, int64_t valid,
                   int64_t width, int64_t K, int64_t pairs) {
  std::memset(out, 0, static_cast<size_t>(pairs * width) * sizeof(uint32_t));
  for (int64_t i = 0; i < valid; ++i) {
    for (int64_t k = 0; k < K; k += 2) {
      const int8_t lo = x[i * stride_r + k * stride_k];
      const int8_t hi = k + 1 < K ? x[i * stride_r + (k + 1) * stride_k] : int8_t{0};
      out[(k / 2) * width + i] = pair_word(lo, hi);
    }
  }
}

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

void gemm_s8_amx_block(const int8_t* a, int64_t lda, const int8_t* b, int64_t kp, int32_t* c,
                       int64_t ldc) {
  for (int64_t i = 0; i < kAmxBlock; ++i) {
    const int8_t* arow = a + i * lda;
    for (int64_t j = 0; j < kAmxBlock; ++j) {
      const int8_t* bcol = b + (j / kAmxRows) * kAmxRows * kp + 4 * (j % kAmxRows);
      int32_t sum = 0;
      for (int64_t k = 0; k < kp; ++k) sum += int32_t{arow[k]} * bcol[(k / 4) * 64 + k % 4];
      c[i * ldc + j] = sum;
    }
  }
}

// One loop per case, without branches inside, so that the compiler vectorizes each.
void gemm_s8_epilogue(const S8Epilogue& out, const int32_t* acc, int64_t ld_acc, int64_t m0,
                      int64_t rows, int64_t n0, int64_t cols) {
  if (out.dx != nullptr) return dx_epilogue(out.f32, out.ldc, acc, ld_acc, m0, m0 + rows, n0, n0 + cols, *out.dx);
  const int64_t ldc = out.ldc;
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t* a = acc + i * ld_acc;
    const int64_t m = m0 + i;
    if (out.s32 != nullptr) {
      std::memcpy(out.s32 + m * ldc + n0, a, static_cast<size_t>(cols) * sizeof(int32_t));
      continue;
    }
    float* __restrict c = out.f32 + m * ldc + n0;
    const float* cs = out.col_scale ? out.col_scale + n0 : nullptr;
    const float rs = out.row_scale ? out.row_scale[m] : 1.0f;
    const bool row = out.row_scale != nullptr;
    if (cs && row) {
      if (out.accumulate) {
        for (int64_t j = 0; j < cols; ++j) c[j] = c[j] + (static_cast<float>(a[j]) * cs[j]) * rs;
      } else {
        for (int64_t j = 0; j < cols; ++j) c[j] = (static_cast<float>(a[j]) * cs[j]) * rs;
      }
    } else if (cs || row) {  // one scale: per column, or the row's
      if (cs) {
        if (out.accumulate) {
          for (int64_t j = 0; j < cols; ++j) c[j] = c[j] + static_cast<float>(a[j]) * cs[j];
        } else {
          for (int64_t j = 0; j < cols; ++j) c[j] = static_cast<float>(a[j]) * cs[j];
        }
      } else if (out.accumulate) {
        for (int64_t j = 0; j < cols; ++j) c[j] = c[j] + static_cast<float>(a[j]) * rs;
      } else {
        for (int64_t j = 0; j < cols; ++j) c[j] = static_cast<float>(a[j]) * rs;
      }
    } else if (out.accumulate) {
      for (int64_t j = 0; j < cols; ++j) c[j] = c[j] + static_cast<float>(a[j]);
    } else {
      for (int64_t j = 0; j < cols; ++j) c[j] = static_cast<float>(a[j]);
    }
  }
}

void pack_amx_a(int8_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k, int64_t valid,
                int64_t panels, int64_t K, int64_t kp) {
  std::memset(out, 0, static_cast<size_t>(panels * kAmxRows * kp));
  for (int64_t r = 0; r < valid; ++r) {
    int8_t* row = out + (r / kAmxRows) * kAmxRows * kp + (r % kAmxRows) * kp;
    for (int64_t k = 0; k < K; ++k) row[k] = x[r * stride_r + k * stride_k];
  }
}

void pack_amx_b(int8_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k, int64_t valid,
                int64_t panels, int64_t K, int64_t kp) {
  std::memset(out, 0, static_cast<size_t>(panels * kAmxRows * kp));
  for (int64_t r = 0; r < valid; ++r) {
    int8_t* panel = out + (r / kAmxRows) * kAmxRows * kp;
    for (int64_t k = 0; k < K; ++k) panel[(k / 4) * 64 + 4 * (r % kAmxRows) + k % 4] = x[r * stride_r + k * stride_k];
  }
}

void pack_vnni_b(int8_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k, int64_t valid,
                 int64_t panels, int64_t K, int64_t kp) {
  pack_amx_b(out, x, stride_r, stride_k, valid, panels, K, kp);
  for (int64_t i = 0; i < panels * kAmxRows * kp; ++i) {
    out[i] = static_cast<int8_t>(static_cast<uint8_t>(out[i]) ^ 0x80u);
  }
}

void row_sums_s8(int32_t* sums, const S8Rows& a, int64_t kp) {
  for (int64_t i = 0; i < kAmxBlock; ++i) {
    const int8_t* row = a.a + (i / kAmxRows) * a.panel + (i % kAmxRows) * a.row;
    int32_t s = 0;
    for (int64_t k = 0; k < kp; ++k) s += row[(k / 4) * a.quad + k % 4];
    sums[i] = s;
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
