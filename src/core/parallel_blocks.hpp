#pragma once
// Fixed-block OpenMP loops, the one way s3r threads a range: [0, n) is cut into blocks of
// `block` elements from 0 (the last one shorter), and the blocks are shared among the threads in
// a static schedule (parallel_blocks_dynamic: a dynamic one). A block's work must not depend on
// which thread runs it; then results are the same bits for any thread count. Where a kernel's
// results depend on the block boundaries, the block size is part of its numerics, and the
// caller says so.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace s3r {

// The threads a parallel_blocks call made here would use: 1 inside a parallel region (the loops
// do not nest), else OpenMP's current count. For sizing blocks to the threads; a block's results
// must still not depend on it.
inline int64_t parallel_threads() { return omp_in_parallel() ? 1 : omp_get_max_threads(); }

// f(begin, end) for every block [begin, end) of [0, n); block >= 1.
template <class F>
void parallel_blocks(int64_t n, int64_t block, F&& f) {
  const int64_t blocks = (n + block - 1) / block;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) f(b * block, std::min(n, (b + 1) * block));
}

// The same for an f that returns bool: whether every block returned true. Every block runs,
// whatever the others returned.
template <class F>
bool parallel_blocks_all(int64_t n, int64_t block, F&& f) {
  const int64_t blocks = (n + block - 1) / block;
  bool all = true;
#pragma omp parallel for schedule(static) reduction(&& : all)
  for (int64_t b = 0; b < blocks; ++b) all = f(b * block, std::min(n, (b + 1) * block)) && all;
  return all;
}

// The same as parallel_blocks, but the blocks are handed out one at a time, in order, to
// whichever thread is free (a dynamic schedule): for blocks of uneven cost, where a static split
// would leave a thread idle. A block's work still must not depend on its thread; then results
// are the same bits for any thread count and any hand-out order.
template <class F>
void parallel_blocks_dynamic(int64_t n, int64_t block, F&& f) {
  const int64_t blocks = (n + block - 1) / block;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < blocks; ++b) f(b * block, std::min(n, (b + 1) * block));
}

// f(i, next) for every item i of [0, n): each thread starts on its share of a static split
// (contiguous, as parallel_blocks gives it) and, when that is done, takes items from the end of
// the share with the most left; and each thread claims its next item as it starts one: `next` is
// the item the same thread runs after i (n: none), for f to prefetch its data while it works on
// i. Where a static split waits for the slower thread (one slowed by the host, or by its share
// of memory), this keeps both busy to the end, and a thread's items stay neighbours (data that
// the same thread wrote in an earlier phase, lines its prefetchers brought in). i's work must not
// depend on its thread or its next; then results are the same bits for any thread count and
// hand-out order.
template <class F>
void parallel_items_claimed_ahead(int64_t n, F&& f) {
  if (n <= 0) return;
  if (n > int64_t{0xffffffff}) throw std::length_error("parallel_items_claimed_ahead: n >= 2^32");
  const int64_t shares = std::min(parallel_threads(), n);
  // Share t's unclaimed items [front, back) as front << 32 | back.
  std::vector<std::atomic<uint64_t>> left(static_cast<size_t>(shares));
  for (int64_t t = 0; t < shares; ++t) {
    left[static_cast<size_t>(t)] = static_cast<uint64_t>(n * t / shares) << 32 |
                                   static_cast<uint64_t>(n * (t + 1) / shares);
  }
  // The front (own share) or back (another's) item of a share; -1 if it has none left.
  const auto take = [&](int64_t t, bool front) -> int64_t {
    std::atomic<uint64_t>& word = left[static_cast<size_t>(t)];
    uint64_t w = word.load();
    for (;;) {
      const uint64_t f = w >> 32, b = w & 0xffffffffu;
      if (f >= b) return -1;
      const uint64_t after = front ? (f + 1) << 32 | b : f << 32 | (b - 1);
      if (word.compare_exchange_weak(w, after)) return static_cast<int64_t>(front ? f : b - 1);
    }
  };
  const auto claim = [&](int64_t own) -> int64_t {
    if (own < shares) {
      if (const int64_t i = take(own, true); i >= 0) return i;
    }
    for (;;) {
      int64_t most = -1;
      uint64_t most_left = 0;
      for (int64_t t = 0; t < shares; ++t) {
        const uint64_t w = left[static_cast<size_t>(t)].load();
        const uint64_t f = w >> 32, b = w & 0xffffffffu;
        if (b > f && b - f > most_left) most = t, most_left = b - f;
      }
      if (most < 0) return n;
      if (const int64_t i = take(most, false); i >= 0) return i;
    }
  };
#pragma omp parallel num_threads(static_cast<int>(shares))
  {
    const int64_t own = omp_get_thread_num();
    int64_t i = claim(own);
    while (i < n) {
      const int64_t next = claim(own);
      f(i, next);
      i = next;
    }
  }
}

// f(i, j) for every cell of a rows x cols grid: parallel_blocks over the cells in row-major
// order (cell i * cols + j), one cell per block (OpenMP's collapse(2) with a static schedule).
// A cell's work must not depend on which thread runs it.
template <class F>
void parallel_grid(int64_t rows, int64_t cols, F&& f) {
  parallel_blocks(rows * cols, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) f(c / cols, c % cols);
  });
}

}  // namespace s3r
