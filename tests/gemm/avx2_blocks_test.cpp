// The AVX2 int8 GEMM's block plan (gemm/s8_gemm.hpp's plan_avx2_blocks): blocks of at most 16 x 16
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
      ASSERT_TRUE(mc >= 1 && mc <= 16 && nc >= 1 && nc <= 16) << mc << " x " << nc;
      const double even = static_cast<double>(m * n) / static_cast<double>(threads);
      // Within 6% of an even split. Without the balancing step, 43 x 48 on 2 threads ran as
      // 9 blocks of 16 x 16: 1280 micro-panels against 784, 24% over.
      EXPECT_LE(static_cast<double>(largest_run(m, n, mc, nc, threads)), 1.06 * even)
          << m << " x " << n << " panels on " << threads << " threads as " << mc << " x " << nc << " blocks";
    }
  }
  EXPECT_EQ(largest_run(43, 48, 16, 16, 2), 1280);  // the old plan, as the comment says
}

TEST(Avx2Blocks, KeepWholeBlocksWhereTheSplitIsAlreadyEven) {
  // W3's products (T 2048, H 2048, D 8192): 16 x 16 blocks split within 3% on 2 threads; 9 x 16,
  // which splits a little more evenly, was 7-12% slower.
  for (auto [m, n] : {std::pair<int64_t, int64_t>{342, 512}, {342, 128}, {1366, 128}, {683, 48}}) {
    EXPECT_EQ(plan_avx2_blocks(m, n, 2), std::make_pair(int64_t{16}, int64_t{16})) << m << " x " << n;
  }
}

}  // namespace
}  // namespace s3r::gemm::s8
