#pragma once
// Helpers shared by the micro-benchmarks (bench/README.md).
//
// Threading: the library threads with OpenMP inside each call, so every benchmark sets the
// OpenMP thread count itself (omp_set_num_threads) and is registered with UseRealTime(): Google
// Benchmark's CPU time is the main thread's only and would overstate multi-threaded rates.
// The thread counts come from S3R_BENCH_THREADS (comma-separated, default "1,2").
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "s3r/core/isa.hpp"

namespace s3r::bench {

// OpenMP thread counts to register: S3R_BENCH_THREADS="1,2,4", default {1, 2}.
inline std::vector<int> thread_counts() {
  std::vector<int> out;
  const char* env = std::getenv("S3R_BENCH_THREADS");
  std::string_view s = env != nullptr ? env : "1,2";
  while (!s.empty()) {
    const size_t comma = s.find(',');
    const std::string item(s.substr(0, comma));
    const int t = std::atoi(item.c_str());
    if (t > 0) out.push_back(t);
    s = comma == std::string_view::npos ? std::string_view{} : s.substr(comma + 1);
  }
  if (out.empty()) out = {1, 2};
  return out;
}

inline const char* isa_label(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kReference: break;
  }
  return "ref";
}

// Every tier, widest first (benchmarks of a tier the CPU lacks report an error and are skipped).
inline constexpr Isa kIsas[] = {Isa::kAvx512, Isa::kAvx2, Isa::kReference};

// Start of every benchmark run: sets the OpenMP thread count and returns true when the CPU can
// run `isa` (the caller then selects it with a ScopedIsa); otherwise reports the benchmark as
// skipped (state.SkipWithError, with the reason) and returns false.
inline bool enter(benchmark::State& state, Isa isa, int threads) {
  std::string why;
  if (!isa_supported(isa, &why)) {
    state.SkipWithError(why.c_str());
    return false;
  }
  omp_set_num_threads(threads);
  return true;
}

}  // namespace s3r::bench
