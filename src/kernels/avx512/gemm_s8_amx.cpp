// AMX block of the exact int8 GEMM (kernels/gemm_s8.hpp): four 16 x 16 int32 accumulator tiles
// (tmm0..3) for a 32 x 32 block, two A tiles (tmm4, 5) and two B tiles (tmm6, 7) per 64 k; each
// A tile meets both B tiles, so a step is four loads and four tdpbssd. The tile loads bound it:
// on one thread of the Emerald Rapids class VM the block alone ran at about 70% of tdpbssd's rate
// with its operands in L1 (K 256), 55% with 512 KB of B panels in L2 and 30% with 2 MB of them
// (the tile registers are not renamed: a step's loads wait for the last step's products). The
// sums stay in the tiles between gemm_s8_amx_sum and gemm_s8_amx_store, so that a caller can run
// other work (the previous block's epilogue) while the tile unit computes. Integer sums are
// exact, so the result is the reference's (kernels/ref/gemm_s8_ref.cpp) bit for bit. The packing
// and the epilogue are the AVX-512 tier's (gemm_s8_avx512.cpp).
#include <immintrin.h>

#include "kernels/gemm_s8.hpp"

namespace s3r::kernels::amx {

namespace {
// Palette 1's 64-byte configuration: eight tiles of 16 rows x 64 bytes (int8 A and B rows,
// 16 int32 sums per accumulator row).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
}  // namespace

void amx_tiles_configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // GCC's _tile_loadconfig tells the compiler it reads one byte: without this barrier the
  // stores above are dead to it and dropped (the tiles then have no shape: #UD).
  __asm__ volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

void amx_tiles_release() { _tile_release(); }

void gemm_s8_amx_sum(const int8_t* a, int64_t lda, const int8_t* b, int64_t kp) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  gemm_s8_amx_add(a, lda, b, kp);
}

void gemm_s8_amx_load(const int32_t* c, int64_t ldc) {
  const int64_t stride = ldc * static_cast<int64_t>(sizeof(int32_t));
  _tile_loadd(0, c, stride);
  _tile_loadd(1, c + kAmxRows, stride);
  _tile_loadd(2, c + kAmxRows * ldc, stride);
  _tile_loadd(3, c + kAmxRows * ldc + kAmxRows, stride);
}

void gemm_s8_amx_add(const int8_t* a, int64_t lda, const int8_t* b, int64_t kp) {
  const int8_t* a1 = a + kAmxRows * lda;
  const int8_t* b1 = b + kAmxRows * kp;
  for (int64_t k = 0; k < kp; k += kAmxDepth) {
    // Each product right after the last load it needs: the loads of A1 and B1 then overlap the
    // first products (all four loads first: 1.1-1.35x slower on Emerald Rapids).
    _tile_loadd(4, a + k, lda);
    _tile_loadd(6, b + k * kAmxRows, 64);  // rows k / 4 .. k / 4 + 15 of the panel
    _tile_dpbssd(0, 4, 6);
    _tile_loadd(7, b1 + k * kAmxRows, 64);
    _tile_dpbssd(1, 4, 7);
    _tile_loadd(5, a1 + k, lda);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
}

void gemm_s8_amx_store(int32_t* c, int64_t ldc) {
  const int64_t stride = ldc * static_cast<int64_t>(sizeof(int32_t));
  _tile_stored(0, c, stride);
  _tile_stored(1, c + kAmxRows, stride);
  _tile_stored(2, c + kAmxRows * ldc, stride);
  _tile_stored(3, c + kAmxRows * ldc + kAmxRows, stride);
}

void gemm_s8_amx_block(const int8_t* a, int64_t lda, const int8_t* b, int64_t kp, int32_t* c,
                       int64_t ldc) {
  gemm_s8_amx_sum(a, lda, b, kp);
  gemm_s8_amx_store(c, ldc);
}

}  // namespace s3r::kernels::amx
