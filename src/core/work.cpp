#include "s3r/core/work.hpp"

#include <omp.h>
#include <unistd.h>

namespace s3r::work {

namespace detail {
Totals& totals() {
  static Totals t;
  return t;
}
void add_cached_bytes(uint64_t n) {
  const CacheSizes& c = cache_sizes();
  if (n <= c.l2) {
    totals().l2_bytes.fetch_add(n, std::memory_order_relaxed);
  } else if (n <= c.llc) {
    totals().llc_bytes.fetch_add(n, std::memory_order_relaxed);
  }
}
}  // namespace detail

const CacheSizes& cache_sizes() {
  static const CacheSizes sizes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE), l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    CacheSizes c;
    if (l2 > 0) {
      c.l2_core = static_cast<uint64_t>(l2);
      c.l2 = c.l2_core * static_cast<uint64_t>(omp_get_max_threads());
    }
    c.llc = l3 > 0 ? static_cast<uint64_t>(l3) : c.l2;
    return c;
  }();
  return sizes;
}

Counts snapshot() {
  const detail::Totals& t = detail::totals();
  const auto get = [](const std::atomic<uint64_t>& x) { return x.load(std::memory_order_relaxed); };
  return {get(t.mac_s8), get(t.mac_bf16), get(t.mac_f32), get(t.bytes), get(t.l2_bytes), get(t.llc_bytes)};
}

}  // namespace s3r::work
