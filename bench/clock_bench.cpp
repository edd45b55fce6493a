// Clock reference: the core's effective frequency while it runs scalar code and AVX-512 code,
// measured in the same process as the kernels so that rates convert to cycles
// (cycles per word = clock / words per second).
//   clock/scalar_add_chain   a dependent chain of 64-bit register adds (1 cycle each)
//   clock/avx512_add_chain   a dependent chain of 512-bit vpaddd (1 cycle each)
// items/s = adds/s = cycles/s. x86-64 only (elsewhere the benchmarks report an error). Only the
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

const bool registered = [] {
  benchmark::RegisterBenchmark("clock/scalar_add_chain", bm_scalar_chain)->UseRealTime();
  benchmark::RegisterBenchmark("clock/avx512_add_chain", bm_avx512_chain)->UseRealTime();
  return true;
}();

}  // namespace
}  // namespace s3r::bench
