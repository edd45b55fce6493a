// Memory-bandwidth reference, linked into every benchmark executable so that kernel rates can
// be compared with what plain loads and stores achieve in the same process:
//   bandwidth/read/SIZE   sum of a buffer of 64-bit words (reads SIZE bytes)
//   bandwidth/write/SIZE  fill a buffer (writes SIZE bytes)
//   bandwidth/copy/SIZE   memcpy SIZE bytes to a second buffer (counted as 2*SIZE bytes)
// Each thread handles one contiguous part of the buffer (OpenMP static schedule). Buffers are
// allocated and touched once per process, outside the timed loops. Sizes: 16 MiB and 64 MiB
// (the f32 gradients of the quantizer benchmarks, N = 2048 and 8192 at T = 2048; they may fit
// in a large L3) and 1 GiB (read only; larger than any L3, so it measures DRAM).
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "bench_common.hpp"

namespace s3r::bench {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// A zero-filled (hence touched) buffer of `bytes` bytes per (size, slot), kept for the process.
uint64_t* buffer(int64_t bytes, int slot) {
  static std::map<std::pair<int64_t, int>, std::unique_ptr<uint64_t[]>> buffers;
  auto& b = buffers[{bytes, slot}];
  if (!b) b = std::make_unique<uint64_t[]>(static_cast<size_t>(bytes / 8));  // value-init: touched
  return b.get();
}

// Words [begin, end) of part `i` of `parts` equal parts of `n` words (64-byte multiples).
inline void part_range(int64_t n, int parts, int i, int64_t* begin, int64_t* end) {
  const int64_t per = (n / parts + 7) / 8 * 8;
  *begin = std::min(n, per * i);
  *end = i + 1 == parts ? n : std::min(n, per * (i + 1));
}

uint64_t sum_words(const uint64_t* p, int64_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < n; ++i) s0 += p[i];
  return s0 + s1 + s2 + s3;
}

void bm_read(benchmark::State& state, int64_t bytes, int threads) {
  omp_set_num_threads(threads);
  const uint64_t* p = buffer(bytes, 0);
  const int64_t n = bytes / 8;
  for (auto _ : state) {
    uint64_t total = 0;
#pragma omp parallel reduction(+ : total)
    {
      int64_t b, e;
      part_range(n, omp_get_num_threads(), omp_get_thread_num(), &b, &e);
      total += sum_words(p + b, e - b);
    }
    benchmark::DoNotOptimize(total);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

void bm_write(benchmark::State& state, int64_t bytes, int threads) {
  omp_set_num_threads(threads);
  uint64_t* p = buffer(bytes, 0);
  const int64_t n = bytes / 8;
  uint64_t value = 1;
  for (auto _ : state) {
#pragma omp parallel
    {
      int64_t b, e;
      part_range(n, omp_get_num_threads(), omp_get_thread_num(), &b, &e);
      std::memset(p + b, static_cast<int>(value & 0xFF), static_cast<size_t>(e - b) * 8);
    }
    ++value;
    benchmark::DoNotOptimize(p);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

void bm_copy(benchmark::State& state, int64_t bytes, int threads) {
  omp_set_num_threads(threads);
  const uint64_t* src = buffer(bytes, 0);
  uint64_t* dst = buffer(bytes, 1);
  const int64_t n = bytes / 8;
  for (auto _ : state) {
#pragma omp parallel
    {
      int64_t b, e;
      part_range(n, omp_get_num_threads(), omp_get_thread_num(), &b, &e);
      std::memcpy(dst + b, src + b, static_cast<size_t>(e - b) * 8);
    }
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * bytes);
}

std::string size_label(int64_t bytes) {
  return bytes >= 1024 * kMiB ? std::to_string(bytes / (1024 * kMiB)) + "GiB"
                              : std::to_string(bytes / kMiB) + "MiB";
}

const bool registered = [] {
  for (int t : thread_counts()) {
    const std::string th = "/threads:" + std::to_string(t);
    for (int64_t bytes : {16 * kMiB, 64 * kMiB, 1024 * kMiB}) {
      benchmark::RegisterBenchmark(("bandwidth/read/" + size_label(bytes) + th).c_str(),
                                   [=](benchmark::State& s) { bm_read(s, bytes, t); })
          ->UseRealTime();
    }
    benchmark::RegisterBenchmark(("bandwidth/write/64MiB" + th).c_str(),
                                 [=](benchmark::State& s) { bm_write(s, 64 * kMiB, t); })
        ->UseRealTime();
    benchmark::RegisterBenchmark(("bandwidth/copy/64MiB" + th).c_str(),
                                 [=](benchmark::State& s) { bm_copy(s, 64 * kMiB, t); })
        ->UseRealTime();
  }
  return true;
}();

}  // namespace
}  // namespace s3r::bench
