// AVX-512 BF16 panels and block of s3r's bf16 GEMM (kernels/gemm_bf16.hpp), bit for bit the
// reference's: the block's rows in groups of eight, each with two 16-column accumulators; per
// pair of k, two B vectors, eight broadcasts of an A row's pair and sixteen vdpbf16ps.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/gemm_bf16.hpp"
#include "kernels/transpose_f32_block.hpp"

namespace s3r::kernels::avx512 {

namespace {
// acc += the two bf16 x bf16 products of each 32-bit lane of u and s (vdpbf16ps). In assembly,
// as the VNNI block's vpdpbusd: GCC 12 copies the accumulator around its builtin.
inline void dpbf16(__m512& acc, __m512i u, __m512i s) {
  __asm__("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
}

__mmask16 first_lanes16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1);
}

// Panels of a k-major op(X) (rows contiguous: stride_r = 1), a pair of k at a time for all of
// them (each row of X read once, in order): the pair's two k are two runs of 16 rows, interleaved
// by one word permutation.
void pack_k_major(bf16* out, const bf16* x, int64_t stride_k, int64_t valid, int64_t panels, int64_t K,
                  int64_t kp) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                          8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (int64_t k = 0; k < kp; k += 2) {
    for (int64_t q = 0; q < panels; ++q) {
      const __mmask16 rows = first_lanes16(valid - q * kBf16Rows);
      const bf16* xq = x + q * kBf16Rows;
      const __m256i lo = k < K ? _mm256_maskz_loadu_epi16(rows, xq + k * stride_k) : _mm256_setzero_si256();
      const __m256i hi = k + 1 < K ? _mm256_maskz_loadu_epi16(rows, xq + (k + 1) * stride_k) : _mm256_setzero_si256();
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      _mm512_storeu_si512(out + q * kBf16Rows * kp + k * kBf16Rows, _mm512_permutexvar_epi16(idx, both));
    }
  }
}

// One panel of an op(X) whose k are contiguous (stride_k = 1): a pair of k is a 32-bit word of
// its row, so the panel is the transpose of the rows' words, in 8 x 8 tiles where the rows and
// words are whole (and the row stride even), element by element elsewhere.
void pack_k_contiguous(bf16* out, const bf16* x, int64_t stride_r, int64_t valid, int64_t K, int64_t kp) {
  const int64_t pairs = kp / 2;
  const int64_t tiled_rows = stride_r % 2 == 0 ? std::min<int64_t>(valid, kBf16Rows) / 8 * 8 : 0;
  const int64_t tiled_pairs = tiled_rows > 0 ? K / 16 * 8 : 0;  // whole words, in eights
  auto* dst = reinterpret_cast<float*>(out);
  for (int64_t i = 0; i < tiled_rows; i += 8) {
    const auto* src = reinterpret_cast<const float*>(x + i * stride_r);
    for (int64_t p = 0; p < tiled_pairs; p += 8) transpose8x8(dst + p * kBf16Rows + i, kBf16Rows, src + p, stride_r / 2);
  }
  for (int64_t i = 0; i < kBf16Rows; ++i) {
    for (int64_t p = i < tiled_rows ? tiled_pairs : 0; p < pairs; ++p) {
      bf16* o = out + p * 2 * kBf16Rows + 2 * i;
      const bool row = i < valid;
      o[0] = row && 2 * p < K ? x[i * stride_r + 2 * p] : bf16{0};
      o[1] = row && 2 * p + 1 < K ? x[i * stride_r + 2 * p + 1] : bf16{0};
    }
  }
}
}  // namespace

void pack_bf16_panels(bf16* out, const bf16* x, int64_t stride_r, int64_t stride_k, int64_t valid,
                      int64_t panels, int64_t K, int64_t kp) {
  if (stride_r == 1) return pack_k_major(out, x, stride_k, valid, panels, K, kp);
  for (int64_t q = 0; q < panels; ++q) {
    const int64_t rows = std::clamp<int64_t>(valid - q * kBf16Rows, 0, kBf16Rows);
    const bf16* first = x + (rows > 0 ? q * kBf16Rows * stride_r : 0);
    pack_k_contiguous(out + q * kBf16Rows * kp, first, stride_r, rows, K, kp);
  }
}

// A k-major op(X) goes through panels of 256 k at a time (in L1), whose 32-bit words (pairs of k)
// are transposed back into rows (rows a multiple of 16, kp of 16); rows with contiguous k are
// copied.
void pack_bf16_rows(bf16* out, const bf16* x, int64_t stride_r, int64_t stride_k, int64_t valid,
                    int64_t rows, int64_t K, int64_t kp) {
  if (stride_r != 1) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r < valid ? K : 0;
      if (n > 0) std::memcpy(out + r * kp, x + r * stride_r, static_cast<size_t>(n) * sizeof(bf16));
      std::memset(out + r * kp + n, 0, static_cast<size_t>(kp - n) * sizeof(bf16));
    }
    return;
  }
  constexpr int64_t kSlice = 256;
  alignas(64) bf16 panel[kBf16Rows * kSlice];
  auto* words = reinterpret_cast<float*>(out);
  // Slices of k outside, panels inside: each of a slice's rows of x is read along its length.
  for (int64_t k0 = 0; k0 < kp; k0 += kSlice) {
    const int64_t slice = std::min(kSlice, kp - k0), k = std::clamp<int64_t>(K - k0, 0, slice);
    for (int64_t r0 = 0; r0 < rows; r0 += kBf16Rows) {
      const int64_t live = std::clamp<int64_t>(valid - r0, 0, kBf16Rows);
      const int64_t kk = live > 0 ? k + k % 2 : 0;  // the pairs with a k < K; zero after them
      if (kk > 0) pack_k_major(panel, x + r0 + k0 * stride_k, stride_k, live, 1, k, kk);
      std::memset(panel + kk * kBf16Rows, 0, static_cast<size_t>((slice - kk) * kBf16Rows) * sizeof(bf16));
      const auto* src = reinterpret_cast<const float*>(panel);
      for (int64_t p = 0; p < slice / 2; p += 8) {
        for (int64_t i = 0; i < kBf16Rows; i += 8) {
          transpose8x8(words + (r0 + i) * (kp / 2) + k0 / 2 + p, kp / 2, src + p * kBf16Rows + i, kBf16Rows);
        }
      }
    }
  }
}

namespace {
template <bool kStream>
void block(const Bf16Rows& a, const bf16* b, int64_t kp, float* c, int64_t ldc) {
  constexpr int kRows = 8;
  const bf16* b1 = b + kBf16Rows * kp;
  for (int64_t r0 = 0; r0 < kBf16Block; r0 += kRows) {
    __m512 acc[kRows][2];
    for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    const bf16* ar = a.a + (r0 / kBf16Rows) * a.panel + (r0 % kBf16Rows) * a.row;
    for (int64_t p = 0; p < kp / 2; ++p) {
      const __m512i v0 = _mm512_loadu_si512(b + p * 2 * kBf16Rows), v1 = _mm512_loadu_si512(b1 + p * 2 * kBf16Rows);
      const bf16* ap = ar + p * a.pair;
#pragma GCC unroll 8
      for (int i = 0; i < kRows; ++i) {
        int32_t pair;
        std::memcpy(&pair, ap + i * a.row, sizeof(pair));
        const __m512i w = _mm512_set1_epi32(pair);
        dpbf16(acc[i][0], v0, w);
        dpbf16(acc[i][1], v1, w);
      }
    }
    // Plain, unconditional stores: with masked or conditional ones GCC 12 keeps the accumulators
    // on the stack (a load and a store around every vdpbf16ps, half the speed).
    for (int i = 0; i < kRows; ++i) {
      float* ci = c + (r0 + i) * ldc;
      if constexpr (kStream) {
        _mm512_stream_ps(ci, acc[i][0]);
        _mm512_stream_ps(ci + kBf16Rows, acc[i][1]);
      } else {
        _mm512_storeu_ps(ci, acc[i][0]);
        _mm512_storeu_ps(ci + kBf16Rows, acc[i][1]);
      }
    }
  }
}
}  // namespace

void gemm_bf16_block(const Bf16Rows& a, const bf16* b, int64_t kp, float* c, int64_t ldc, bool stream) {
  if (stream) return block<true>(a, b, kp, c, ldc);
  block<false>(a, b, kp, c, ldc);
}

}  // namespace s3r::kernels::avx512
