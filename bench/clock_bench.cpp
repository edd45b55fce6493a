// Clock reference: the core's effective frequency while it runs scalar code and AVX-512 code,
// measured in the same process as the kernels so that rates convert to cycles
// (cycles per word = clock / words per second).
//   clock/scalar_add_chain   a dependent chain of 64-bit register adds (1 cycle each)
//   clock/avx512_add_chain   a dependent chain of 512-bit vpaddd (1 cycle each)
// items/s = adds/s = cycles/s.
// Instruction limits of the AVX2 kernels (register-only loops, independent instructions):
//   peak/avx2_int_alu        vpaddd ymm, 12 independent chains: integer vector operations per
//                            second (Threefry is ~110 such operations per 8 words)
//   peak/avx2_divps          vdivps ymm, 8 independent divisions: the quantizers divide every
//                            element once (items/s = elements/s at the division limit) x86-64 only (elsewhere the benchmarks report an error). Only the
// AVX-512 chain's function is compiled for AVX-512 (a target attribute), and it runs only where
// s3r::isa_supported(Isa::kAvx512) is true.
#include <cstdint>
#include <string>

#include "bench_common.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace s3r::bench {
namespace {

constexpr int64_t kAddsPerIteration = 1 << 20;

void bm_scalar_chain(benchmark::State& state) {
#if defined(__x86_64__)
  uint64_t x = 0;
  const uint64_t y = 1;
  for (auto _ : state) {
    for (int64_t i = 0; i < kAddsPerIteration; i += 8) {
      // Register operands: Golden Cove and later fold chains of add-immediate at rename.
      asm volatile(
          "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
          "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0"
          : "+r"(x)
          : "r"(y));
    }
  }
  benchmark::DoNotOptimize(x);
  state.SetItemsProcessed(state.iterations() * kAddsPerIteration);
#else
  state.SkipWithError("x86-64 only");
#endif
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t avx512_chain(int64_t iterations) {
  __m512i acc = _mm512_setzero_si512();
  const __m512i one = _mm512_set1_epi32(1);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int64_t i = 0; i < kAddsPerIteration; i += 8) {
      asm volatile(
          "vpaddd %1, %0, %0\n\tvpaddd %1, %0, %0\n\tvpaddd %1, %0, %0\n\tvpaddd %1, %0, %0\n\t"
          "vpaddd %1, %0, %0\n\tvpaddd %1, %0, %0\n\tvpaddd %1, %0, %0\n\tvpaddd %1, %0, %0"
          : "+v"(acc)
          : "v"(one));
    }
  }
  uint32_t lanes[16];
  _mm512_storeu_si512(lanes, acc);
  return lanes[0];
}
#endif

void bm_avx512_chain(benchmark::State& state) {
#if defined(__x86_64__)
  std::string why;
  if (!isa_supported(Isa::kAvx512, &why)) {
    state.SkipWithError(why.c_str());
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(avx512_chain(1));
  state.SetItemsProcessed(state.iterations() * kAddsPerIteration);
#else
  state.SkipWithError("x86-64 only");
#endif
}

#if defined(__x86_64__)
constexpr int64_t kPeakIterations = 1 << 16;

// 12 independent vpaddd per iteration (accumulators ymm0..11 start at zero).
__attribute__((target("avx2"))) void int_alu_loop(int64_t iterations) {
  __asm__ volatile("vpxor %%xmm12, %%xmm12, %%xmm12" ::: "xmm12");
  for (int64_t it = 0; it < iterations; ++it) {
    __asm__ volatile(
        "vpaddd %%ymm12, %%ymm0, %%ymm0\n\tvpaddd %%ymm12, %%ymm1, %%ymm1\n\t"
        "vpaddd %%ymm12, %%ymm2, %%ymm2\n\tvpaddd %%ymm12, %%ymm3, %%ymm3\n\t"
        "vpaddd %%ymm12, %%ymm4, %%ymm4\n\tvpaddd %%ymm12, %%ymm5, %%ymm5\n\t"
        "vpaddd %%ymm12, %%ymm6, %%ymm6\n\tvpaddd %%ymm12, %%ymm7, %%ymm7\n\t"
        "vpaddd %%ymm12, %%ymm8, %%ymm8\n\tvpaddd %%ymm12, %%ymm9, %%ymm9\n\t"
        "vpaddd %%ymm12, %%ymm10, %%ymm10\n\tvpaddd %%ymm12, %%ymm11, %%ymm11" ::
            : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
              "xmm10", "xmm11");
  }
}

// 8 independent vdivps per iteration of normal values (1.5 / 1.25: no denormal assists).
__attribute__((target("avx2"))) void divps_loop(int64_t iterations) {
  const __m256 num = _mm256_set1_ps(1.5f), den = _mm256_set1_ps(1.25f);
  for (int64_t it = 0; it < iterations; ++it) {
    __asm__ volatile(
        "vdivps %1, %0, %%ymm0\n\tvdivps %1, %0, %%ymm1\n\tvdivps %1, %0, %%ymm2\n\t"
        "vdivps %1, %0, %%ymm3\n\tvdivps %1, %0, %%ymm4\n\tvdivps %1, %0, %%ymm5\n\t"
        "vdivps %1, %0, %%ymm6\n\tvdivps %1, %0, %%ymm7" ::"x"(num), "x"(den)
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7");
  }
}
#endif

// which: 0 = vpaddd (items = operations), 1 = vdivps (items = f32 lanes divided).
void bm_avx2_peak(benchmark::State& state, int which) {
#if defined(__x86_64__)
  std::string why;
  if (!isa_supported(Isa::kAvx2, &why)) {
    state.SkipWithError(why.c_str());
    return;
  }
  for (auto _ : state) {
    if (which == 0) {
      int_alu_loop(kPeakIterations);
    } else {
      divps_loop(kPeakIterations);
    }
  }
  state.SetItemsProcessed(state.iterations() * kPeakIterations * (which == 0 ? 12 : 8 * 8));
#else
  (void)which;
  state.SkipWithError("x86-64 only");
#endif
}

const bool registered = [] {
  benchmark::RegisterBenchmark("clock/scalar_add_chain", bm_scalar_chain)->UseRealTime();
  benchmark::RegisterBenchmark("clock/avx512_add_chain", bm_avx512_chain)->UseRealTime();
  benchmark::RegisterBenchmark("peak/avx2_int_alu", bm_avx2_peak, 0)->UseRealTime();
  benchmark::RegisterBenchmark("peak/avx2_divps", bm_avx2_peak, 1)->UseRealTime();
  return true;
}();

}  // namespace
}  // namespace s3r::bench
