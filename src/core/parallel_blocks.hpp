#pragma once
// Fixed-block OpenMP loops, the one way s3r threads a range: [0, n) is cut into blocks of
// `block` elements from 0 (the last one shorter), and the blocks are shared among the threads in
// a static schedule (parallel_blocks_dynamic: a dynamic one). A block's work must not depend on
// which thread runs it; then results are the same bits for any thread count. Where a kernel's
// results depend on the block boundaries, the block size is part of its numerics, and the
// caller says so.
#include <omp.h>

#include <algorithm>
#include <cstdint>

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
