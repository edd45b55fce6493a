#pragma once
// Fixed-block OpenMP loops, the one way s3r threads a range: [0, n) is cut into blocks of
// `block` elements from 0 (the last one shorter), and the blocks are shared among the threads in
// a static schedule. A block's work must not depend on which thread runs it; then results are
// the same bits for any thread count. Where a kernel's results depend on the block boundaries,
// the block size is part of its numerics, and the caller says so.
#include <algorithm>
#include <cstdint>

namespace s3r {

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

}  // namespace s3r
