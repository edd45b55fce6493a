// The fixed-block OpenMP loops (src/core/parallel_blocks.hpp): every block of [0, n) exactly
// once, with the documented boundaries, on several threads; the all-of variant runs every block
// and is false when any block is; the dynamic variant and the grid visit the same blocks / cells;
// the claimed-ahead hand-out tells each item its thread's next one.
#include "core/parallel_blocks.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "test_util.hpp"

namespace s3r {
namespace {

// visits[i] counts the calls whose block held i; starts[k] is set by the block that starts at
// k * block and must end at min(n, (k + 1) * block).
struct Visits {
  explicit Visits(int64_t n, int64_t block)
      : n(n), block(block), visits(static_cast<size_t>(n)), bad_bounds(0) {}
  void record(int64_t i0, int64_t i1) {
    if (i0 % block != 0 || i1 != std::min(n, i0 + block) || i0 >= i1) ++bad_bounds;
    for (int64_t i = i0; i < i1; ++i) ++visits[static_cast<size_t>(i)];
  }
  int64_t n, block;
  std::vector<std::atomic<int>> visits;
  std::atomic<int> bad_bounds;
};

TEST(ParallelBlocks, EveryBlockOnceWithItsBoundaries) {
  testing::ScopedThreads threads(2);
  for (int64_t block : {1, 7, 64}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, block - 1, block, block + 1, 10 * block + 3}) {
      Visits v(n, block);
      parallel_blocks(n, block, [&](int64_t i0, int64_t i1) { v.record(i0, i1); });
      EXPECT_EQ(v.bad_bounds.load(), 0) << "n=" << n << " block=" << block;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(v.visits[static_cast<size_t>(i)].load(), 1) << "n=" << n << " i=" << i;
      }
    }
  }
}

TEST(ParallelBlocks, AllOfRunsEveryBlockAndIsFalseWhenOneIs) {
  testing::ScopedThreads threads(2);
  const int64_t n = 100, block = 8;
  for (int64_t failing : {int64_t{-1}, int64_t{0}, int64_t{48}, int64_t{96}}) {
    Visits v(n, block);
    const bool all = parallel_blocks_all(n, block, [&](int64_t i0, int64_t i1) {
      v.record(i0, i1);
      return i0 != failing;
    });
    EXPECT_EQ(all, failing < 0) << "failing block at " << failing;
    EXPECT_EQ(v.bad_bounds.load(), 0);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(v.visits[static_cast<size_t>(i)].load(), 1) << "failing " << failing << " i=" << i;
    }
  }
  EXPECT_TRUE(parallel_blocks_all(0, block, [](int64_t, int64_t) { return false; }))
      << "no blocks: vacuously true";
}

// The dynamic schedule hands out the same blocks; on 1, 2 and 3 threads, every block once with
// its boundaries (blocks of very uneven cost, so that the hand-out order varies).
TEST(ParallelBlocks, DynamicVisitsTheSameBlocksOnAnyThreadCount) {
  for (int t : {1, 2, 3}) {
    testing::ScopedThreads threads(t);
    for (int64_t block : {1, 5}) {
      for (int64_t n : {int64_t{0}, int64_t{1}, 4 * block + 2}) {
        Visits v(n, block);
        parallel_blocks_dynamic(n, block, [&](int64_t i0, int64_t i1) {
          volatile double spin = 0;
          for (int64_t k = 0; k < (i0 % 3) * 20000; ++k) spin = spin + 1.0;
          v.record(i0, i1);
        });
        EXPECT_EQ(v.bad_bounds.load(), 0) << "threads=" << t << " n=" << n << " block=" << block;
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(v.visits[static_cast<size_t>(i)].load(), 1) << "threads=" << t << " n=" << n << " i=" << i;
        }
      }
    }
  }
}

// parallel_items_claimed_ahead: every item once, and the `next` each call is given is the item
// its thread runs next (n after its last), on 1, 2 and 3 threads (items of uneven cost, so that
// threads take items from each other's shares).
TEST(ParallelBlocks, ClaimedAheadNamesEachThreadsNextItem) {
  for (int t : {1, 2, 3}) {
    testing::ScopedThreads threads(t);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{17}}) {
      std::vector<std::vector<std::pair<int64_t, int64_t>>> runs(static_cast<size_t>(t));
      parallel_items_claimed_ahead(n, [&](int64_t i, int64_t next) {
        volatile double spin = 0;
        for (int64_t k = 0; k < (i % 3) * 20000; ++k) spin = spin + 1.0;
        runs[static_cast<size_t>(omp_get_thread_num())].emplace_back(i, next);
      });
      std::vector<int> visits(static_cast<size_t>(n));
      for (const auto& run : runs) {
        for (size_t c = 0; c < run.size(); ++c) {
          const auto [i, next] = run[c];
          ASSERT_TRUE(i >= 0 && i < n) << "threads=" << t << " n=" << n << " item " << i;
          ++visits[static_cast<size_t>(i)];
          const int64_t expected = c + 1 < run.size() ? run[c + 1].first : n;
          EXPECT_EQ(next, expected) << "threads=" << t << " n=" << n << " item " << i;
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(visits[static_cast<size_t>(i)], 1) << "threads=" << t << " n=" << n << " i=" << i;
      }
    }
  }
}

// parallel_grid calls f(i, j) once for every cell of a rows x cols grid, empty grids included.
TEST(ParallelBlocks, GridVisitsEveryCellOnce) {
  testing::ScopedThreads threads(2);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{0, 3}, {3, 0}, {1, 1}, {3, 5}, {7, 2}}) {
    std::vector<std::atomic<int>> visits(static_cast<size_t>(rows * cols));
    std::atomic<int> outside{0};
    parallel_grid(rows, cols, [&](int64_t i, int64_t j) {
      if (i < 0 || i >= rows || j < 0 || j >= cols) {
        ++outside;
        return;
      }
      ++visits[static_cast<size_t>(i * cols + j)];
    });
    EXPECT_EQ(outside.load(), 0) << rows << " x " << cols;
    for (int64_t c = 0; c < rows * cols; ++c) {
      ASSERT_EQ(visits[static_cast<size_t>(c)].load(), 1) << rows << " x " << cols << " cell " << c;
    }
  }
}

}  // namespace
}  // namespace s3r
