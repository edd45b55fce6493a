// Batch random words: fixed chunks of the index range, threaded with parallel_blocks. Every word
// is a pure function of (key, index), so the result is the same for any thread count and ISA.
#include "core/parallel_blocks.hpp"
#include "kernels/dispatch.hpp"
#include "s3r/rng/philox.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r {

namespace {
constexpr int64_t kChunk = 1 << 14;  // words per task: 64 KiB of output

// One chunk runs on the calling thread, without starting a parallel region.
template <typename Fn>
void for_each_chunk(int64_t n, Fn&& fn) {
  if (n <= kChunk) {
    fn(int64_t{0}, n);
    return;
  }
  parallel_blocks(n, kChunk, fn);
}
}  // namespace

void random_bits32(Key key, uint64_t first_index, std::span<uint32_t> out) {
  const auto kernel = kernels::active_kernels().threefry_bits;
  for_each_chunk(static_cast<int64_t>(out.size()), [&](int64_t j0, int64_t j1) {
    kernel(key, first_index + static_cast<uint64_t>(j0), out.data() + j0, j1 - j0);
  });
}

void philox_bits32(PhiloxKey key, uint64_t first_index, std::span<uint32_t> out) {
  const auto kernel = kernels::active_kernels().philox_bits;
  for_each_chunk(static_cast<int64_t>(out.size()), [&](int64_t j0, int64_t j1) {
    kernel(key, first_index + static_cast<uint64_t>(j0), out.data() + j0, j1 - j0);
  });
}

}  // namespace s3r
