#pragma once
// The f32 block transpose of the fused attention's vector tiers (kernels/attention_kernels.hpp):
// a block of up to 32 rows of HD floats into HD rows of 32 lanes, in 8 x 8 tiles of 256-bit
// unpacks and shuffles (AVX, so both the AVX2 and the AVX-512 tier use it).
//
// Include only from tier translation units: internal linkage on purpose, each tier compiling its
// own copy with its own -m flags (as kernels/transpose_lanes.hpp).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/attention_kernels.hpp"

namespace s3r::kernels {
namespace {  // NOLINT(build/namespaces): internal linkage per tier, see above

// dst[c * ldd + r] = src[r * lds + c] for an 8 x 8 tile (and rows[r * ldr + c] = src[r * lds + c]
// when rows is set). Unrolled so that the rows stay in registers: as plain loops GCC kept them
// in a stack array, about 3x slower on a 32 x 64 block.
inline void transpose8x8(float* dst, int64_t ldd, const float* src, int64_t lds,
                         float* rows = nullptr, int64_t ldr = 0) {
  __m256 r[8], t[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  if (rows != nullptr) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(rows + i * ldr, r[i]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// dst[d * ldd + r] = src[r * lds + d] for r < n, 0 for n <= r < 32 (d < hd): 8 x 8 tiles, the
// edges element by element. With `rows` set, the n rows are also copied there contiguously
// (rows[r * hd + d] = src[r * lds + d]) as they are read.
[[maybe_unused]] void transpose_block(float* dst, int64_t ldd, const float* src, int64_t lds,
                                      int64_t n, int64_t hd, float* rows = nullptr) {
  const int64_t n8 = n / 8 * 8, hd8 = hd / 8 * 8;
  for (int64_t r = 0; r < n8; r += 8) {
    for (int64_t d = 0; d < hd8; d += 8) {
      transpose8x8(dst + d * ldd + r, ldd, src + r * lds + d, lds,
                   rows != nullptr ? rows + r * hd + d : nullptr, hd);
    }
    for (int64_t d = hd8; d < hd; ++d) {
      for (int64_t i = r; i < r + 8; ++i) dst[d * ldd + i] = src[i * lds + d];
    }
  }
  for (int64_t d = 0; d < hd; ++d) {
    float* row = dst + d * ldd;
    for (int64_t i = n8; i < n; ++i) row[i] = src[i * lds + d];
    for (int64_t i = n; i < kAttnBlock; ++i) row[i] = 0.0f;
  }
  if (rows == nullptr) return;
  for (int64_t i = 0; i < n; ++i) {  // what the tiles did not copy: columns past hd8, rows past n8
    const int64_t d0 = i < n8 ? hd8 : 0;
    std::copy(src + i * lds + d0, src + i * lds + hd, rows + i * hd + d0);
  }
}

}  // namespace
}  // namespace s3r::kernels
