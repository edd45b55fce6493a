// AVX-512 loops of kernels/peak_loops.hpp: F, VNNI, BF16 and AMX in assembly; the AMX tile set-up
// in intrinsics compiled for it by target attributes (the rest of the tier needs only F/BW/VL).
#include <immintrin.h>

#include "kernels/gemm_s8.hpp"
#include "kernels/peak_loops.hpp"

namespace s3r::kernels::peak::avx512 {

// The zmm loops, 12 independent chains from zeroed accumulators: f32 FMA (16 multiply-adds per
// instruction), VNNI int8 (vpdpbusd: 64 u8 x s8 multiply-adds into 16 int32) and BF16 (vdpbf16ps:
// 32 bf16 multiply-adds into 16 f32).
#define S3R_ZERO_ZMM                                                                          \
  __asm__ volatile(                                                                           \
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\tvpxord %%zmm1, %%zmm1, %%zmm1\n\t"                       \
      "vpxord %%zmm2, %%zmm2, %%zmm2\n\tvpxord %%zmm3, %%zmm3, %%zmm3\n\t"                       \
      "vpxord %%zmm4, %%zmm4, %%zmm4\n\tvpxord %%zmm5, %%zmm5, %%zmm5\n\t"                       \
      "vpxord %%zmm6, %%zmm6, %%zmm6\n\tvpxord %%zmm7, %%zmm7, %%zmm7\n\t"                       \
      "vpxord %%zmm8, %%zmm8, %%zmm8\n\tvpxord %%zmm9, %%zmm9, %%zmm9\n\t"                       \
      "vpxord %%zmm10, %%zmm10, %%zmm10\n\tvpxord %%zmm11, %%zmm11, %%zmm11\n\t"                 \
      "vpxord %%zmm12, %%zmm12, %%zmm12\n\tvpxord %%zmm13, %%zmm13, %%zmm13" ::                   \
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",    \
            "xmm10", "xmm11", "xmm12", "xmm13")
#define S3R_ZMM_LOOP(INSN)                                                                    \
  S3R_ZERO_ZMM;                                                                               \
  for (int64_t it = 0; it < iterations; ++it) {                                               \
    __asm__ volatile(                                                                         \
        INSN " %%zmm13, %%zmm12, %%zmm0\n\t" INSN " %%zmm13, %%zmm12, %%zmm1\n\t"               \
        INSN " %%zmm13, %%zmm12, %%zmm2\n\t" INSN " %%zmm13, %%zmm12, %%zmm3\n\t"               \
        INSN " %%zmm13, %%zmm12, %%zmm4\n\t" INSN " %%zmm13, %%zmm12, %%zmm5\n\t"               \
        INSN " %%zmm13, %%zmm12, %%zmm6\n\t" INSN " %%zmm13, %%zmm12, %%zmm7\n\t"               \
        INSN " %%zmm13, %%zmm12, %%zmm8\n\t" INSN " %%zmm13, %%zmm12, %%zmm9\n\t"               \
        INSN " %%zmm13, %%zmm12, %%zmm10\n\t" INSN " %%zmm13, %%zmm12, %%zmm11\n\t" ::          \
            : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",  \
              "xmm10", "xmm11", "xmm12", "xmm13");                                            \
  }
uint64_t fma_f32_zmm(int64_t iterations) {
  S3R_ZMM_LOOP("vfmadd231ps")
  return static_cast<uint64_t>(iterations) * 12 * 16;
}

uint64_t dpbusd_zmm(int64_t iterations) {
  S3R_ZMM_LOOP("vpdpbusd")
  return static_cast<uint64_t>(iterations) * 12 * 64;
}

uint64_t dpbf16_zmm(int64_t iterations) {
  S3R_ZMM_LOOP("vdpbf16ps")
  return static_cast<uint64_t>(iterations) * 12 * 32;
}

namespace {
// Palette 1 (kernels/gemm_s8.hpp's amx_tiles_configure: eight tiles of 16 rows x 64 bytes):
// tiles 0-3 accumulate, tiles 4-5 hold A and 6-7 B.
__attribute__((target("amx-tile"))) void load_tiles(const uint8_t* operand) {
  kernels::amx::amx_tiles_configure();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
}

// Its result stored where the compiler must assume it is read, and the tiles released.
__attribute__((target("amx-tile"))) void release_tiles() {
  alignas(64) int32_t out[16 * 16];
  _tile_stored(0, out, 64);
  kernels::amx::amx_tiles_release();
  volatile int32_t sink = out[0];
  (void)sink;
}
}  // namespace

// Four independent products per round: tmm0..3 += (tmm4 or tmm5) x (tmm6 or tmm7).
#define S3R_AMX_LOOP(INSN)                                                                   \
  for (int64_t it = 0; it < iterations; ++it) {                                              \
    __asm__ volatile(INSN " %%tmm6, %%tmm4, %%tmm0\n\t" INSN " %%tmm7, %%tmm4, %%tmm1\n\t"     \
                     INSN " %%tmm6, %%tmm5, %%tmm2\n\t" INSN " %%tmm7, %%tmm5, %%tmm3" ::       \
                         : "memory");                                                        \
  }

uint64_t amx_int8(int64_t iterations) {
  alignas(64) uint8_t operand[16 * 64];
  for (auto& x : operand) x = 1;
  load_tiles(operand);
  S3R_AMX_LOOP("tdpbssd")
  release_tiles();
  return static_cast<uint64_t>(iterations) * 4 * 16 * 16 * 64;
}

uint64_t amx_bf16(int64_t iterations) {
  alignas(64) uint8_t operand[16 * 64];
  for (int i = 0; i < 16 * 64; i += 2) {  // bf16 1.0
    operand[i] = 0x80;
    operand[i + 1] = 0x3f;
  }
  load_tiles(operand);
  S3R_AMX_LOOP("tdpbf16ps")
  release_tiles();
  return static_cast<uint64_t>(iterations) * 4 * 16 * 16 * 32;
}

uint64_t stream_read_zmm(const uint32_t* words, int64_t n, uint32_t* sink) {
  constexpr int64_t kLanes = sizeof(__m512i) / 4;
  __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  const int64_t quarter = n / 4;
  for (int64_t i = 0; i < quarter; i += kLanes) {
    for (int s = 0; s < 4; ++s) acc[s] = _mm512_add_epi32(acc[s], _mm512_load_si512(reinterpret_cast<const __m512i*>(words + s * quarter + i)));
  }
  alignas(64) uint32_t lanes[kLanes];
  _mm512_store_si512(reinterpret_cast<__m512i*>(lanes), _mm512_add_epi32(_mm512_add_epi32(acc[0], acc[1]), _mm512_add_epi32(acc[2], acc[3])));
  uint32_t total = 0;
  for (uint32_t x : lanes) total += x;
  *sink = total;
  return static_cast<uint64_t>(n) * 4;
}

}  // namespace s3r::kernels::peak::avx512
