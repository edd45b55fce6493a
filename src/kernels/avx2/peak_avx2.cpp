// AVX2 + FMA loops of kernels/peak_loops.hpp.
#include <immintrin.h>

#include <cstdint>

#include "kernels/peak_loops.hpp"

namespace s3r::kernels::peak::avx2 {

// The loops are written in assembly so that the compiler can neither hoist the loop-invariant
// products nor merge the independent chains: per iteration, exactly the instructions listed.
// Accumulators ymm0..ymm11 (ymm0..ymm7 for the sign trick). Every register starts at zero: left
// over from other code, a denormal float would send the FMA loop through microcode assists
// (100x slower); integer overflow in the other loops is harmless.
#define S3R_ZERO_YMM                                                                          \
  __asm__ volatile(                                                                           \
      "vpxor %%xmm0, %%xmm0, %%xmm0\n\tvpxor %%xmm1, %%xmm1, %%xmm1\n\t"                        \
      "vpxor %%xmm2, %%xmm2, %%xmm2\n\tvpxor %%xmm3, %%xmm3, %%xmm3\n\t"                        \
      "vpxor %%xmm4, %%xmm4, %%xmm4\n\tvpxor %%xmm5, %%xmm5, %%xmm5\n\t"                        \
      "vpxor %%xmm6, %%xmm6, %%xmm6\n\tvpxor %%xmm7, %%xmm7, %%xmm7\n\t"                        \
      "vpxor %%xmm8, %%xmm8, %%xmm8\n\tvpxor %%xmm9, %%xmm9, %%xmm9\n\t"                        \
      "vpxor %%xmm10, %%xmm10, %%xmm10\n\tvpxor %%xmm11, %%xmm11, %%xmm11\n\t"                  \
      "vpxor %%xmm12, %%xmm12, %%xmm12\n\tvpxor %%xmm13, %%xmm13, %%xmm13\n\t"                  \
      "vpxor %%xmm14, %%xmm14, %%xmm14\n\tvpxor %%xmm15, %%xmm15, %%xmm15" ::                     \
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",    \
            "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15")
uint64_t fma_f32_ymm(int64_t iterations) {
  S3R_ZERO_YMM;
  for (int64_t it = 0; it < iterations; ++it) {
    __asm__ volatile(
"vfmadd231ps %%ymm13, %%ymm12, %%ymm0\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm1\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm2\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm3\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm4\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm5\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm6\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm7\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm8\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm9\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm10\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm11\n\t"
        ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
        "xmm10", "xmm11", "xmm12", "xmm13");
  }
  return static_cast<uint64_t>(iterations) * 12 * 8;
}

// fma_f32_ymm's twelve FMAs with an integer add after each (4.2 instructions per cycle at the
// FMA limit of a core with two FMA pipes, where the FMA loop alone issues 2.2): the core check of
// s3r/gemm/roofline.hpp. On a core of its own it runs as fast as the FMA loop; where another
// thread shares the core's front end (a virtual machine's co-tenant on the sibling hyperthread)
// it slows, while the FMA loop alone does not.
uint64_t fma_f32_busy_ymm(int64_t iterations) {
  S3R_ZERO_YMM;
  uint64_t a = 0, b = 0, c = 0, d = 0, e = 0, f = 0;
  for (int64_t it = 0; it < iterations; ++it) {
    __asm__ volatile(
"vfmadd231ps %%ymm13, %%ymm12, %%ymm0\n\tadd $1, %[a]\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm1\n\tadd $1, %[b]\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm2\n\tadd $1, %[c]\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm3\n\tadd $1, %[d]\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm4\n\tadd $1, %[e]\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm5\n\tadd $1, %[f]\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm6\n\tadd $1, %[a]\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm7\n\tadd $1, %[b]\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm8\n\tadd $1, %[c]\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm9\n\tadd $1, %[d]\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm10\n\tadd $1, %[e]\n\t"
"vfmadd231ps %%ymm13, %%ymm12, %%ymm11\n\tadd $1, %[f]\n\t"
        : [a] "+r"(a), [b] "+r"(b), [c] "+r"(c), [d] "+r"(d), [e] "+r"(e), [f] "+r"(f)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
          "xmm10", "xmm11", "xmm12", "xmm13");
  }
  return static_cast<uint64_t>(iterations) * 12 * 8;
}

uint64_t madd_s16_ymm(int64_t iterations) {
  S3R_ZERO_YMM;
  for (int64_t it = 0; it < iterations; ++it) {
    __asm__ volatile(
"vpmaddwd %%ymm13, %%ymm12, %%ymm14\n\tvpaddd %%ymm14, %%ymm0, %%ymm0\n\t"
"vpmaddwd %%ymm13, %%ymm12, %%ymm15\n\tvpaddd %%ymm15, %%ymm1, %%ymm1\n\t"
"vpmaddwd %%ymm13, %%ymm12, %%ymm14\n\tvpaddd %%ymm14, %%ymm2, %%ymm2\n\t"
"vpmaddwd %%ymm13, %%ymm12, %%ymm15\n\tvpaddd %%ymm15, %%ymm3, %%ymm3\n\t"
"vpmaddwd %%ymm13, %%ymm12, %%ymm14\n\tvpaddd %%ymm14, %%ymm4, %%ymm4\n\t"
"vpmaddwd %%ymm13, %%ymm12, %%ymm15\n\tvpaddd %%ymm15, %%ymm5, %%ymm5\n\t"
"vpmaddwd %%ymm13, %%ymm12, %%ymm14\n\tvpaddd %%ymm14, %%ymm6, %%ymm6\n\t"
"vpmaddwd %%ymm13, %%ymm12, %%ymm15\n\tvpaddd %%ymm15, %%ymm7, %%ymm7\n\t"
"vpmaddwd %%ymm13, %%ymm12, %%ymm14\n\tvpaddd %%ymm14, %%ymm8, %%ymm8\n\t"
"vpmaddwd %%ymm13, %%ymm12, %%ymm15\n\tvpaddd %%ymm15, %%ymm9, %%ymm9\n\t"
"vpmaddwd %%ymm13, %%ymm12, %%ymm14\n\tvpaddd %%ymm14, %%ymm10, %%ymm10\n\t"
"vpmaddwd %%ymm13, %%ymm12, %%ymm15\n\tvpaddd %%ymm15, %%ymm11, %%ymm11\n\t"
        ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
        "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
  }
  return static_cast<uint64_t>(iterations) * 12 * 16;
}

// ymm8 = a (signed), ymm9 = |a| (held in a packed panel by a real kernel), ymm10 = b,
// ymm11 = int16 ones: sign(b, a), maddubs(|a|, .) -> int16 pair sums (exact for codes in
// [-127, 127]), madd with ones -> int32 sums of 4 products, add.
uint64_t maddubs_sign_ymm(int64_t iterations) {
  S3R_ZERO_YMM;
  for (int64_t it = 0; it < iterations; ++it) {
    __asm__ volatile(
"vpsignb %%ymm8, %%ymm10, %%ymm12\n\tvpmaddubsw %%ymm12, %%ymm9, %%ymm12\n\tvpmaddwd %%ymm11, %%ymm12, %%ymm13\n\tvpaddd %%ymm13, %%ymm0, %%ymm0\n\t"
"vpsignb %%ymm8, %%ymm10, %%ymm14\n\tvpmaddubsw %%ymm14, %%ymm9, %%ymm14\n\tvpmaddwd %%ymm11, %%ymm14, %%ymm15\n\tvpaddd %%ymm15, %%ymm1, %%ymm1\n\t"
"vpsignb %%ymm8, %%ymm10, %%ymm12\n\tvpmaddubsw %%ymm12, %%ymm9, %%ymm12\n\tvpmaddwd %%ymm11, %%ymm12, %%ymm13\n\tvpaddd %%ymm13, %%ymm2, %%ymm2\n\t"
"vpsignb %%ymm8, %%ymm10, %%ymm14\n\tvpmaddubsw %%ymm14, %%ymm9, %%ymm14\n\tvpmaddwd %%ymm11, %%ymm14, %%ymm15\n\tvpaddd %%ymm15, %%ymm3, %%ymm3\n\t"
"vpsignb %%ymm8, %%ymm10, %%ymm12\n\tvpmaddubsw %%ymm12, %%ymm9, %%ymm12\n\tvpmaddwd %%ymm11, %%ymm12, %%ymm13\n\tvpaddd %%ymm13, %%ymm4, %%ymm4\n\t"
"vpsignb %%ymm8, %%ymm10, %%ymm14\n\tvpmaddubsw %%ymm14, %%ymm9, %%ymm14\n\tvpmaddwd %%ymm11, %%ymm14, %%ymm15\n\tvpaddd %%ymm15, %%ymm5, %%ymm5\n\t"
"vpsignb %%ymm8, %%ymm10, %%ymm12\n\tvpmaddubsw %%ymm12, %%ymm9, %%ymm12\n\tvpmaddwd %%ymm11, %%ymm12, %%ymm13\n\tvpaddd %%ymm13, %%ymm6, %%ymm6\n\t"
"vpsignb %%ymm8, %%ymm10, %%ymm14\n\tvpmaddubsw %%ymm14, %%ymm9, %%ymm14\n\tvpmaddwd %%ymm11, %%ymm14, %%ymm15\n\tvpaddd %%ymm15, %%ymm7, %%ymm7\n\t"
        ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
        "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
  }
  return static_cast<uint64_t>(iterations) * 8 * 32;
}

uint64_t stream_read_ymm(const uint32_t* words, int64_t n, uint32_t* sink) {
  constexpr int64_t kLanes = sizeof(__m256i) / 4;
  __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  const int64_t quarter = n / 4;
  for (int64_t i = 0; i < quarter; i += kLanes) {
    for (int s = 0; s < 4; ++s) acc[s] = _mm256_add_epi32(acc[s], _mm256_load_si256(reinterpret_cast<const __m256i*>(words + s * quarter + i)));
  }
  alignas(64) uint32_t lanes[kLanes];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi32(_mm256_add_epi32(acc[0], acc[1]), _mm256_add_epi32(acc[2], acc[3])));
  uint32_t total = 0;
  for (uint32_t x : lanes) total += x;
  *sink = total;
  return static_cast<uint64_t>(n) * 4;
}

}  // namespace s3r::kernels::peak::avx2
