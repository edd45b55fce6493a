// Limits measured by register-only loops and the bound of a phase's work (s3r/gemm/roofline.hpp).
#include "s3r/gemm/roofline.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <thread>

#include "kernels/peak_loops.hpp"
#include "s3r/core/cpu_features.hpp"
#include "s3r/gemm/backend.hpp"

namespace s3r::gemm {

namespace {

using Loop = uint64_t (*)(int64_t);

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Timed runs of each measurement; the best counts (the others lost time to something else).
constexpr int kRuns = 5;

// Operations per second of `loop` on every thread at once: the iterations are calibrated to about
// 10 ms, then the best of kRuns runs (measure() runs it twice).
double rate_on_all_threads(Loop loop) {
  int64_t iterations = 1000;
  for (;;) {  // calibrate on one thread
    const auto start = std::chrono::steady_clock::now();
    loop(iterations);
    const double s = seconds_since(start);
    if (s > 2e-3 || iterations > (int64_t{1} << 40)) {
      iterations = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(iterations) * 0.01 / s));
      break;
    }
    iterations *= 8;
  }
  {  // untimed, on every thread: AMX units and wide vector units power up on first use
    uint64_t ops = 0;
#pragma omp parallel reduction(+ : ops)
    ops += loop(iterations);
  }
  double best = 0.0;
  for (int run = 0; run < kRuns; ++run) {
    uint64_t ops = 0;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : ops)
    ops += loop(iterations);
    best = std::max(best, static_cast<double>(ops) / seconds_since(start));
  }
  return best;
}

using StreamLoop = uint64_t (*)(const uint32_t*, int64_t, uint32_t*);

// The widest loads this CPU has (s3r's kernels of the tier use them).
StreamLoop widest_stream(const CpuFeatures& f) {
#ifdef S3R_HAVE_AVX512
  if (f.has_avx512_tier()) return kernels::peak::avx512::stream_read_zmm;
#endif
#ifdef S3R_HAVE_AVX2
  if (f.has_avx2_tier()) return kernels::peak::avx2::stream_read_ymm;
#endif
  return kernels::peak::stream_read_xmm;
}

// Bytes per second of streaming reads on every thread at once, each thread over its own part of
// one buffer of `bytes`, over and over for at least 128 MB in all.
double read_bandwidth(StreamLoop loop, int64_t bytes) {
  const int threads = omp_get_max_threads();
  const int64_t per_thread =
      std::max<int64_t>(1, bytes / 4 / threads / kernels::peak::kStreamWords) * kernels::peak::kStreamWords;
  const int passes = static_cast<int>(std::max<int64_t>(1, (int64_t{128} << 20) / (4 * per_thread * threads)));
  std::unique_ptr<uint32_t, decltype(&std::free)> buf(
      static_cast<uint32_t*>(std::aligned_alloc(64, static_cast<size_t>(per_thread * threads) * 4)), &std::free);
  if (!buf) return 0.0;
  uint32_t* data = buf.get();
#pragma omp parallel  // first touch by the thread that reads the part
  {
    const int64_t t = omp_get_thread_num();
    std::fill(data + t * per_thread, data + (t + 1) * per_thread, static_cast<uint32_t>(t));
  }
  double best = 0.0;
  uint32_t sinks[256] = {};
  for (int run = 0; run < kRuns; ++run) {
    uint64_t total = 0;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : total)
    {
      const int t = omp_get_thread_num();
      for (int pass = 0; pass < passes; ++pass) total += loop(data + t * per_thread, per_thread, &sinks[t % 256]);
    }
    best = std::max(best, static_cast<double>(total) / seconds_since(start));
  }
  return best;
}

// The loop of the instruction each type runs on, or none.
struct LoopChoice {
  Loop loop = nullptr;
  std::string instruction;
};

LoopChoice f32_loop(const CpuFeatures& f) {
#ifdef S3R_HAVE_AVX512
  if (f.has_avx512_tier()) return {kernels::peak::avx512::fma_f32_zmm, "vfmadd231ps zmm"};
#endif
#ifdef S3R_HAVE_AVX2
  if (f.has_avx2_tier()) return {kernels::peak::avx2::fma_f32_ymm, "vfmadd231ps ymm"};
#endif
  return {kernels::peak::mul_add_f32_xmm, "mulps + addps xmm"};
}

LoopChoice int8_loop(const CpuFeatures& f) {
  switch (int8_backend()) {
    case Int8Backend::kAmx:
#ifdef S3R_HAVE_AVX512
      return {kernels::peak::avx512::amx_int8, "AMX tdpbssd"};
#endif
    case Int8Backend::kVnni:
#ifdef S3R_HAVE_AVX512
      return {kernels::peak::avx512::dpbusd_zmm, "vpdpbusd zmm"};
#endif
    case Int8Backend::kOnednn:
#ifdef S3R_HAVE_AVX512
      if (f.amx_int8) return {kernels::peak::avx512::amx_int8, "AMX tdpbssd"};
      if (f.avx512_vnni) return {kernels::peak::avx512::dpbusd_zmm, "vpdpbusd zmm"};
#endif
      return {nullptr, "not measured (oneDNN's int8 kernel here has no loop in s3r)"};
    case Int8Backend::kAvx2:
#ifdef S3R_HAVE_AVX2
      return {kernels::peak::avx2::madd_s16_ymm, "vpmaddwd + vpaddd ymm"};
#endif
    case Int8Backend::kReference: break;
  }
  return {nullptr, "none (the reference GEMM is scalar)"};
}

// No loop: bf16 runs as f32 (the caller uses the f32 limit).
LoopChoice bf16_loop(const CpuFeatures& f) {
  if (bf16_backend() != Bf16Backend::kF32) {
#ifdef S3R_HAVE_AVX512
    if (f.amx_bf16) return {kernels::peak::avx512::amx_bf16, "AMX tdpbf16ps"};
    if (f.avx512_bf16) return {kernels::peak::avx512::dpbf16_zmm, "vdpbf16ps zmm"};
#endif
    return {nullptr, " (bf16 emulated by oneDNN)"};
  }
  return {nullptr, " (bf16 emulated in f32)"};
}

RooflineLimits measure() {
  const CpuFeatures& f = cpu_features();
  RooflineLimits l;
  l.threads = omp_get_max_threads();
  const LoopChoice f32 = f32_loop(f), int8 = int8_loop(f), bf16 = bf16_loop(f);
  l.f32.instruction = f32.instruction;
  l.int8.instruction = int8.instruction;
  l.bf16.instruction = bf16.loop ? bf16.instruction : f32.instruction + bf16.instruction;
  // Two rounds over the loops, each limit the best of both: one disturbed stretch (another
  // process, the vector units' first use) does not set a limit.
  for (int round = 0; round < 2; ++round) {
    l.f32.per_s = std::max(l.f32.per_s, rate_on_all_threads(f32.loop));
    if (int8.loop) l.int8.per_s = std::max(l.int8.per_s, rate_on_all_threads(int8.loop));
    if (bf16.loop) l.bf16.per_s = std::max(l.bf16.per_s, rate_on_all_threads(bf16.loop));
  }
  if (!bf16.loop) l.bf16.per_s = l.f32.per_s;
#ifdef S3R_HAVE_AVX2
  if (f.has_avx2_tier()) l.core_reference_per_s = rate_on_all_threads(kernels::peak::avx2::fma_f32_ymm);
#endif
  const StreamLoop stream = widest_stream(f);
  const work::CacheSizes& cache = work::cache_sizes();
  l.memory = {read_bandwidth(stream, std::clamp<int64_t>(4 * static_cast<int64_t>(cache.llc), int64_t{256} << 20,
                                                         int64_t{1} << 30)),
              "reads of 4x the last-level cache"};
  l.llc = cache.llc > 0 ? Limit{read_bandwidth(stream, static_cast<int64_t>(cache.llc / 2)), "reads of half of it"}
                        : l.memory;
  l.l2 = cache.l2 > 0 ? Limit{read_bandwidth(stream, static_cast<int64_t>(cache.l2 / 2)), "reads of half the L2s"}
                      : l.llc;
  return l;
}

std::string rate(const Limit& l, const char* unit) {
  if (l.per_s <= 0) return "- (" + l.instruction + ")";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.0f %s (%s)", l.per_s / 1e9, unit, l.instruction.c_str());
  return buf;
}

RooflineLimits& cached_limits() {
  static RooflineLimits limits = measure();
  return limits;
}

}  // namespace

const RooflineLimits& roofline_limits() { return cached_limits(); }

RooflineLimits higher_limits(const RooflineLimits& a, const RooflineLimits& b) {
  RooflineLimits l = a;
  for (auto member : {&RooflineLimits::int8, &RooflineLimits::bf16, &RooflineLimits::f32, &RooflineLimits::l2,
                      &RooflineLimits::llc, &RooflineLimits::memory}) {
    (l.*member).per_s = std::max((a.*member).per_s, (b.*member).per_s);
  }
  l.measurements = a.measurements + b.measurements;
  l.core_reference_per_s = std::max(a.core_reference_per_s, b.core_reference_per_s);
  return l;
}

const RooflineLimits& remeasure_roofline_limits() {
  RooflineLimits& l = cached_limits();
  l = higher_limits(l, measure());
  return l;
}

RooflineLimits measure_roofline_limits() { return measure(); }

double core_check(const RooflineLimits& l) {
  if (l.core_reference_per_s <= 0) return -1.0;
#ifdef S3R_HAVE_AVX2
  // About 2 ms per thread at the reference rate: 96 multiply-adds per iteration.
  const double per_thread = l.core_reference_per_s / l.threads;
  const int64_t iterations = std::max<int64_t>(1000, static_cast<int64_t>(per_thread * 2e-3 / 96));
  double slowest = std::numeric_limits<double>::infinity();
#pragma omp parallel num_threads(l.threads) reduction(min : slowest)
  {
    const auto start = std::chrono::steady_clock::now();
    slowest = static_cast<double>(kernels::peak::avx2::fma_f32_busy_ymm(iterations)) / seconds_since(start);
  }
  return slowest / per_thread;
#else
  return -1.0;
#endif
}

std::vector<double> core_check_now(int samples, double gap_s) {
  std::vector<double> out;
#ifdef S3R_HAVE_AVX2
  if (!cpu_features().has_avx2_tier()) return out;
  RooflineLimits l;
  l.threads = omp_get_max_threads();
  l.core_reference_per_s = rate_on_all_threads(kernels::peak::avx2::fma_f32_ymm);
  for (int i = 0; i < samples; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::duration<double>(gap_s));
    out.push_back(core_check(l));
  }
#else
  (void)samples;
  (void)gap_s;
#endif
  return out;
}

namespace {
// A run's samples without the negative ones (a CPU without AVX2), sorted.
std::vector<double> valid_sorted(const std::vector<double>& samples) {
  std::vector<double> s;
  for (double x : samples) {
    if (x >= 0) s.push_back(x);
  }
  std::sort(s.begin(), s.end());
  return s;
}
double median_of_sorted(const std::vector<double>& s) {
  const size_t n = s.size();
  return n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}
}  // namespace

double core_check_median(const std::vector<double>& samples) {
  const std::vector<double> s = valid_sorted(samples);
  return s.empty() ? -1.0 : median_of_sorted(s);
}

std::string core_check_line(const std::vector<double>& samples, const char* where) {
  const std::vector<double> s = valid_sorted(samples);
  if (s.empty()) return "";
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "cores: the core check at %.2f (%.2f-%.2f) over %zu sample%s %s "
                "(about 1 on cores of their own; lower while another thread, such as a VM's co-tenant, "
                "shares them, and every share below with it: s3r/gemm/roofline.hpp)",
                median_of_sorted(s), s.front(), s.back(), s.size(), s.size() == 1 ? "" : "s", where);
  return buf;
}

std::string limits_line(const RooflineLimits& l) {
  const std::string best =
      l.measurements > 1 ? "; each the higher of " + std::to_string(l.measurements) + " measurements" : "";
  return "limits on " + std::to_string(l.threads) + " threads: int8 " + rate(l.int8, "G MAC/s") + ", bf16 " +
         rate(l.bf16, "G MAC/s") + ", f32 " + rate(l.f32, "G MAC/s") + ", bandwidth L2 " + rate(l.l2, "GB/s") +
         ", last-level cache " + rate(l.llc, "GB/s") + ", memory " + rate(l.memory, "GB/s") + best;
}

Bound lower_bound(const work::Counts& w, const RooflineLimits& l) {
  Bound b;
  const auto add = [&](uint64_t macs, const Limit& limit) {
    if (macs == 0) return;
    if (limit.per_s <= 0) {
      b.complete = false;
      return;
    }
    b.compute_ms += 1e3 * static_cast<double>(macs) / limit.per_s;
  };
  add(w.mac_s8, l.int8);
  add(w.mac_bf16, l.bf16);
  add(w.mac_f32, l.f32);
  const auto time_ms = [](uint64_t bytes, const Limit& limit) {
    return limit.per_s > 0 ? 1e3 * static_cast<double>(bytes) / limit.per_s : 0.0;
  };
  b.memory_ms = time_ms(w.l2_bytes, l.l2) + time_ms(w.llc_bytes, l.llc) +
                time_ms(w.bytes - w.l2_bytes - w.llc_bytes, l.memory);
  return b;
}

}  // namespace s3r::gemm
