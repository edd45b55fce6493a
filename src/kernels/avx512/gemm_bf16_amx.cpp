// AMX block of s3r's bf16 GEMM (kernels/gemm_bf16.hpp): four 16 x 16 f32 accumulator tiles
// (tmm0..3) for a 32 x 32 block, two A tiles (tmm4, 5: 16 rows of 32 k each) and two B tiles
// (tmm6, 7: 16 pairs of k of a panel) per 32 k, in the order of the int8 AMX block
// (gemm_s8_amx.cpp), whose tile configuration it shares: 16 rows of 64 bytes hold 32 bf16 of an
// A row, one pair of k for 16 columns of B, or 16 f32 sums.
#include <immintrin.h>

#include "kernels/gemm_bf16.hpp"

namespace s3r::kernels::amx {

void gemm_bf16_amx_block(const Bf16Rows& a, const bf16* b, int64_t kp, float* c, int64_t ldc, bool stream) {
  const bf16* a0 = a.a;
  const bf16* a1 = a.a + a.panel;
  const bf16* b1 = b + kBf16Rows * kp;
  const int64_t lda = a.row * static_cast<int64_t>(sizeof(bf16));
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k = 0; k < kp; k += kBf16AmxDepth) {
    _tile_loadd(4, a0 + k, lda);
    _tile_loadd(6, b + k * kBf16Rows, 64);  // pairs k / 2 .. k / 2 + 15 of the panel
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b1 + k * kBf16Rows, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a1 + k, lda);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  // Streamed: the tiles go to a buffer in L1, whose rows then go out by non-temporal stores
  // (tilestored has no such form).
  alignas(64) float sums[kBf16Block * kBf16Block];
  float* out = stream ? sums : c;
  const int64_t ld = stream ? kBf16Block : ldc;
  const int64_t stride = ld * static_cast<int64_t>(sizeof(float));
  _tile_stored(0, out, stride);
  _tile_stored(1, out + kBf16Rows, stride);
  _tile_stored(2, out + kBf16Rows * ld, stride);
  _tile_stored(3, out + kBf16Rows * ld + kBf16Rows, stride);
  if (!stream) return;
  for (int64_t i = 0; i < kBf16Block; ++i) {
    _mm512_stream_ps(c + i * ldc, _mm512_load_ps(sums + i * kBf16Block));
    _mm512_stream_ps(c + i * ldc + kBf16Rows, _mm512_load_ps(sums + i * kBf16Block + kBf16Rows));
  }
}

}  // namespace s3r::kernels::amx
