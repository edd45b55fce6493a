// The AVX2 int8 GEMM's block plan (gemm/s8_gemm.hpp's plan_avx2_blocks): blocks of at most 24 x 16
// micro-panels that split the output evenly over the threads, at the shapes of the presets' layers.
// Integer sums are exact, so the plan is speed only; Matmul's tests check the sums in every backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>

#include "gemm/s8_gemm.hpp"

namespace s3r::gemm::s8 {
namespace {

// The micro-panels of each thread's contiguous run of blocks (row-major), the largest of them.
int64_t largest_run(int64_t m_panels, int64_t n_panels, int64_t mc, int64_t nc, int64_t threads) {
  const int64_t rows = (m_panels + mc - 1) / mc, cols = (n_panels + nc - 1) / nc;
  const int64_t per = (rows * cols + threads - 1) / threads;
  int64_t largest = 0;
  for (int64_t first = 0; first < rows * cols; first += per) {
    int64_t run = 0;
    for (int64_t b = first; b < std::min(rows * cols, first + per); ++b) {
      run += std::min(mc, m_panels - b / cols * mc) * std::min(nc, n_panels - b % cols * nc);
    }
    largest = std::max(largest, run);
  }
  return largest;
}

TEST(Avx2Blocks, SplitThePresetsProductsEvenlyOverTheThreads) {
  // (rows, columns) in 6 x 16 micro-panels: `small` (T 4096, C 256, F 768) and `wide` (T 2048,
  // C 1024, F 4096): forward and dX (T rows), dW (C or F rows, T deep).
  for (auto [m, n] : {std::pair<int64_t, int64_t>{683, 48}, {683, 16}, {43, 48}, {128, 16}, {43, 16},
                      {342, 256}, {342, 64}, {171, 256}, {683, 64}, {171, 64}}) {
    for (int64_t threads : {1, 2, 3, 4}) {
      const auto [mc, nc] = plan_avx2_blocks(m, n, threads);
      ASSERT_TRUE(mc >= 1 && mc <= 24 && nc >= 1 && nc <= 16) << mc << " x " << nc;
      const double even = static_cast<double>(m * n) / static_cast<double>(threads);
      // Within 6% of an even split. Without the balancing step, 43 x 48 on 2 threads ran as
      // 9 blocks of 16 x 16: 1280 micro-panels against 784, 24% over.
      EXPECT_LE(static_cast<double>(largest_run(m, n, mc, nc, threads)), 1.06 * even)
          << m << " x " << n << " panels on " << threads << " threads as " << mc << " x " << nc << " blocks";
    }
  }
  EXPECT_EQ(largest_run(43, 48, 16, 16, 2), 1280);  // the old plan, as the comment says
}

TEST(Avx2Blocks, BlocksStayLargeWhereTheOutputIsLarge) {
  // W3's products (T 2048, H 2048, D 8192) on 2 threads: 24 x 16 blocks where they split within
  // 3% (1366 x 128 panels); where they do not, the largest blocks down to half that size whose
  // runs split evenly: the 342-panel rows of `wide`'s and W3's products as 18 rows of 19. Never
  // smaller than 16 x 16 there: 9 x 16 blocks were 7-12% slower than 16 x 16, and 16 x 16 1-3%
  // slower than 19 x 16 (`wide`'s products).
  EXPECT_EQ(plan_avx2_blocks(1366, 128, 2), std::make_pair(int64_t{24}, int64_t{16}));
  for (auto [m, n] : {std::pair<int64_t, int64_t>{342, 512}, {342, 128}, {342, 256}, {683, 48}}) {
    EXPECT_EQ(plan_avx2_blocks(m, n, 2), std::make_pair(int64_t{19}, int64_t{16})) << m << " x " << n;
  }
}

// The products packed by slice: each block repeats the packing of its A and B panels for every
// K slice, so that blocks are as large as the caches allow (32 x 24) and few, and the plan weighs
// that packing (about 11 cycles per micro-panel and pair of k) against the microkernel's 8 per
// micro-tile. At `small`'s dW shapes on 2 threads these are the plans that measured fastest
// (2026-12-05, forced plans through a throwaway build): 43 x 16 panels as 22 x 16 (138 G/s; 4 x 8,
// the blocks of plan_avx2_blocks, 105 G/s by slice), 43 x 48 as 22 x 24 (145 G/s; 22 x 16 140,
// 11 x 16 130).
TEST(Avx2Blocks, SliceBlocksAreLargeAndSplitEvenly) {
  EXPECT_EQ(plan_avx2_slice_blocks(43, 16, 2), std::make_pair(int64_t{22}, int64_t{16}));
  EXPECT_EQ(plan_avx2_slice_blocks(43, 48, 2), std::make_pair(int64_t{22}, int64_t{24}));
  for (auto [m, n] : {std::pair<int64_t, int64_t>{43, 16}, {43, 48}, {128, 16}, {128, 48}, {1, 1}, {7, 3},
                      {33, 100}}) {
    for (int64_t threads : {1, 2, 3, 4}) {
      const auto [mc, nc] = plan_avx2_slice_blocks(m, n, threads);
      ASSERT_TRUE(mc >= 1 && mc <= std::min<int64_t>(32, m) && nc >= 1 && nc <= std::min<int64_t>(24, n))
          << m << " x " << n << " on " << threads << ": " << mc << " x " << nc;
      // Within 12% of an even split of the micro-panels wherever the output has enough of them
      // for every thread.
      if (m * n >= 64 * threads) {
        EXPECT_LE(static_cast<double>(largest_run(m, n, mc, nc, threads)),
                  1.12 * static_cast<double>(m * n) / static_cast<double>(threads))
            << m << " x " << n << " panels on " << threads << " threads as " << mc << " x " << nc << " blocks";
      }
    }
  }
  // One thread: whole blocks of the largest size, not a split.
  EXPECT_EQ(plan_avx2_slice_blocks(43, 48, 1), std::make_pair(int64_t{22}, int64_t{24}));
}

}  // namespace
}  // namespace s3r::gemm::s8
