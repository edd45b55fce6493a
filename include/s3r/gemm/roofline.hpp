#pragma once
// The roofline of a step's phases (`s3r bench step --breakdown`, `s3r bench ffn --breakdown`):
// what this CPU can do per second with the instructions s3r runs on it, measured in this process,
// and the shortest time a phase's work (s3r/core/work.hpp) can take at those rates.
//
// Each limit is measured at the first use (about a second in all) by register-only loops of
// the instruction the backend chosen for that type runs (kernels/peak_loops.hpp), on every
// OpenMP thread at once; bandwidths by reads of the widest loads on every thread, four streams
// each, of a buffer four times the last-level cache (memory), of half of it (last-level cache)
// and of half the threads' L2 caches together (L2). Limits are the best of ten timed runs,
// in two rounds over the loops; the benchmarks measure them again after their timed runs and
// keep the higher of the two (remeasure_roofline_limits).
//   int8  oneDNN: AMX tdpbssd, else vpdpbusd zmm (AVX-512 VNNI); s3r's AVX2 GEMM: vpmaddwd +
//         vpaddd ymm; the reference GEMM: none (no share is printed)
//   bf16  native oneDNN: AMX tdpbf16ps, else vdpbf16ps zmm; emulated: the f32 limit
//   f32   vfmadd231ps zmm (AVX-512 CPUs), ymm (AVX2), mulps + addps xmm (neither); it bounds
//         oneDNN's f32 products and s3r's attention kernels alike
// A phase's bound is the longer of its compute time (each type's multiply-adds over its limit,
// summed: the types share the cores) and its memory time (its bytes over the bandwidth of the
// level their calls fit in, s3r/core/work.hpp); its share of the limit is that bound over its
// measured time.
#include <string>
#include <vector>

#include "s3r/core/work.hpp"

namespace s3r::gemm {

struct Limit {
  double per_s = 0;         // multiply-adds (bytes for memory) per second on all threads; 0: none
  std::string instruction;  // what was measured, e.g. "AMX tdpbssd"
};

struct RooflineLimits {
  Limit int8, bf16, f32;
  Limit l2, llc, memory;  // bytes per second
  int threads = 1;
  int measurements = 1;  // each limit the highest of this many measurements
  // The core check's reference: vfmadd231ps ymm's rate on every thread (multiply-adds per
  // second, the highest measured); 0 where the CPU has no AVX2 (no check).
  double core_reference_per_s = 0;
};

// Measured at the first call with omp_get_max_threads() threads, for the backends then active.
const RooflineLimits& roofline_limits();
// Measures again and raises each of roofline_limits()'s limits to the higher of its two values
// (the same reference, updated). A virtual machine's host can slow every core for longer than
// one measurement: on an AMD Zen 3 VM one process measured bf16 at 51 G MAC/s against 102 in
// every other, and printed the LM head at 139% of its limit. A second measurement after the timed
// runs makes a low one unlikely, and a limit only ever rises: shares are never overstated by it.
// Call it from one thread, outside parallel regions, with the thread count of the first call.
const RooflineLimits& remeasure_roofline_limits();
// a's limits each raised to b's where b's is higher; measurements: the two counts added.
RooflineLimits higher_limits(const RooflineLimits& a, const RooflineLimits& b);
// A fresh measurement, the same way (about 1 s): for checks that compare rates taken at
// different moments on a machine whose speed drifts.
RooflineLimits measure_roofline_limits();

// One line: "limits on 2 threads: int8 1903 G MAC/s (AMX tdpbssd), ..., memory 14 GB/s (...)", and
// "; each the higher of 2 measurements" after a remeasurement.
std::string limits_line(const RooflineLimits& limits);

// The core check: how much of its cores this process has now. A virtual machine's vCPU is often
// one hyperthread of a core whose other thread runs another tenant's work, unseen from inside.
// The limit loops above issue about 2 instructions per cycle and run at full rate beside it;
// kernels that also load, broadcast and count issue 3.5-4 per cycle, and the shared front end
// and load ports slow them by up to a third (an AMD Zen 3 VM: an AVX2 accumulation tile in L1
// at 95% of the FMA limit in one second and 69-81% in the next, the FMA loop at 2.64-2.65 per
// TSC cycle throughout). The check runs vfmadd231ps ymm with an integer add after each (4.2
// instructions per cycle at the FMA limit) for about 2 ms on every thread and returns the
// slowest thread's rate over the reference's per thread: about 1 on cores of their own (AMD
// Zen 3: 1.00 in calm spells), lower while another thread shares one; and then every share of a
// phase that loads reads low with it. Negative where there is no reference (no AVX2). Call it
// outside parallel regions.
double core_check(const RooflineLimits& limits);
// The core check on its own, for checks between other programs' runs (`s3r bench cores`, which
// scripts/bench_peer.sh runs before and after each job): the reference measured now (the FMA loop
// on every thread, about 60 ms: a process started for the check has no limits measured), then
// `samples` checks `gap_s` seconds apart (a co-tenant comes and goes within seconds). Empty where
// the CPU has no AVX2. A co-tenant that also takes the FMA pipes while the reference runs (rare on
// the AMD Zen 3 VM: its FMA loop held 2.48-2.65 per TSC cycle while the check fell) lowers both,
// and the check then reads higher than the cores' state.
std::vector<double> core_check_now(int samples, double gap_s);
// The median of a run's samples (negative ones, from a CPU without AVX2, left out); -1 if none.
double core_check_median(const std::vector<double>& samples);
// "cores: the core check at MEDIAN (MIN-MAX) over N samples WHERE (about 1 on ...)" for a run's
// samples (WHERE: "around the timed repeats"), or "" if none.
std::string core_check_line(const std::vector<double>& samples, const char* where);

struct Bound {
  double compute_ms = 0, memory_ms = 0;
  bool complete = true;  // false: some multiply-adds have no limit (the reference int8 GEMM)
  double ms() const { return compute_ms > memory_ms ? compute_ms : memory_ms; }
  bool memory_bound() const { return memory_ms > compute_ms; }
};

// The shortest time `work` can take at `limits`.
Bound lower_bound(const work::Counts& work, const RooflineLimits& limits);

}  // namespace s3r::gemm
