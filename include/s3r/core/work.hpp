#pragma once
// The work a step does, counted where it is done, for the roofline of `s3r bench step
// --breakdown` (s3r/gemm/roofline.hpp): multiply-adds by operand type and the bytes of the
// operands each kernel call reads and writes (each counted once per call: the traffic a call
// cannot avoid, a lower bound on what it moves).
//
// The drivers add to process-wide counters (atomic, exact integers: the totals do not depend on
// the thread count or the order of the additions); a phase's work is the difference of two
// snapshots (nn::PhaseZone). Counting is always on: one atomic addition per driver call.
//
// Conventions (docs/TRAINING.md "The roofline of a step"):
//   - a product C (M, N) = A (M, K) B (K, N) is M N K multiply-adds of its operand type (int8,
//     bf16, f32) and the bytes of A, B and C (C twice when accumulated into);
//   - causal attention counts its unmasked (query, key) pairs P: forward 2 P HD multiply-adds
//     (scores, then probabilities times values), backward 5 P HD (the scores recomputed, dP, dV,
//     dK, dQ), the FlashAttention convention; its exponentials are not counted;
//   - element-wise phases count bytes only;
//   - the bytes of a call whose operands fit in the cores' L2 caches together (the L2 size times
//     the OpenMP threads) are also counted as `l2_bytes`, and those of a call that fits in the
//     last-level cache but not there as `llc_bytes`: the roofline bounds them by that cache's
//     bandwidth instead of the memory's (what a call that small could reach at best).
#include <atomic>
#include <cstdint>

namespace s3r::work {

struct Counts {
  uint64_t mac_s8 = 0;    // int8 x int8 multiply-adds (exact int32 sums)
  uint64_t mac_bf16 = 0;  // bf16 x bf16 multiply-adds (f32 sums), however the backend runs them
  uint64_t mac_f32 = 0;   // f32 multiply-adds
  uint64_t bytes = 0;     // bytes read and written
  uint64_t l2_bytes = 0;   // the part of `bytes` moved by calls that fit in the L2 caches
  uint64_t llc_bytes = 0;  // the part moved by calls that fit in the last-level cache, not the L2s
  Counts& operator+=(const Counts& o) {
    mac_s8 += o.mac_s8;
    mac_bf16 += o.mac_bf16;
    mac_f32 += o.mac_f32;
    bytes += o.bytes;
    l2_bytes += o.l2_bytes;
    llc_bytes += o.llc_bytes;
    return *this;
  }
  Counts operator-(const Counts& o) const {
    return {mac_s8 - o.mac_s8, mac_bf16 - o.mac_bf16, mac_f32 - o.mac_f32, bytes - o.bytes,
            l2_bytes - o.l2_bytes, llc_bytes - o.llc_bytes};
  }
};

namespace detail {
struct Totals {
  std::atomic<uint64_t> mac_s8{0}, mac_bf16{0}, mac_f32{0}, bytes{0}, l2_bytes{0}, llc_bytes{0};
};
Totals& totals();
void add_cached_bytes(uint64_t n);
}  // namespace detail

// One phase of a step: its wall-clock milliseconds and its work, summed over its calls.
struct Phase {
  double ms = 0;
  Counts work;
  Phase& operator+=(const Phase& o) {
    ms += o.ms;
    work += o.work;
    return *this;
  }
  // The mean of one of n calls (or steps), the counts rounded to integers.
  Phase mean_of(double n) const {
    const auto per = [n](uint64_t x) { return static_cast<uint64_t>(static_cast<double>(x) / n + 0.5); };
    return {ms / n,
            {per(work.mac_s8), per(work.mac_bf16), per(work.mac_f32), per(work.bytes), per(work.l2_bytes),
             per(work.llc_bytes)}};
  }
};

// The sizes in bytes of the L2 caches of the OpenMP threads together, of one core's L2 and of
// the last-level cache, as this process first read them (sysconf and omp_get_max_threads(); 0
// when unknown: nothing counts as fitting there).
struct CacheSizes {
  uint64_t l2 = 0, llc = 0;
  uint64_t l2_core = 0;
};
const CacheSizes& cache_sizes();

// Everything counted in this process so far.
Counts snapshot();

inline void add_mac_s8(uint64_t n) { detail::totals().mac_s8.fetch_add(n, std::memory_order_relaxed); }
inline void add_mac_bf16(uint64_t n) { detail::totals().mac_bf16.fetch_add(n, std::memory_order_relaxed); }
inline void add_mac_f32(uint64_t n) { detail::totals().mac_f32.fetch_add(n, std::memory_order_relaxed); }
// The bytes one call reads and writes (its operands: what it needs in the cache at once).
inline void add_bytes(uint64_t n) {
  detail::totals().bytes.fetch_add(n, std::memory_order_relaxed);
  detail::add_cached_bytes(n);
}
// n floats (or int32s) read or written once.
inline void add_floats(uint64_t n) { add_bytes(4 * n); }

}  // namespace s3r::work
