// Forward RTNE quantizers: SPEC section 1, reference vs every tier (whole ranges and blocks that
// start mid-range), edge cases and bad input.
#include "s3r/quant/forward_quant.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/ref/numerics.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "test_util.hpp"

namespace s3r {
namespace {

const int64_t kSizes[] = {1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 1000};

AlignedVector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  AlignedVector<float> x(static_cast<size_t>(rows * cols));
  for (auto& v : x) v = normal(gen) * std::exp(2.0f * normal(gen));  // heavy-tailed magnitudes
  if (rows > 2) {
    for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(cols + c)] = 0.0f;  // a zero row
  }
  return x;
}

struct Quantized {
  std::vector<int8_t> codes;
  AlignedVector<float> scales;
};

// The outputs get one guard element past their end, which must stay untouched.
constexpr int8_t kGuardCode = 0x5A;
constexpr float kGuardScale = -7.0f;

Quantized rows_rtne(const AlignedVector<float>& x, int64_t rows, int64_t cols) {
  Quantized q{std::vector<int8_t>(x.size() + 1, kGuardCode),
              AlignedVector<float>(static_cast<size_t>(rows) + 1, kGuardScale)};
  quantize_rows_rtne(std::span(q.codes).first(x.size()),
                     std::span(q.scales).first(static_cast<size_t>(rows)), x, rows, cols, "X");
  EXPECT_EQ(q.codes.back(), kGuardCode)
      << "rows: codes written past the end, " << rows << "x" << cols;
  EXPECT_EQ(q.scales.back(), kGuardScale) << "rows: scales written past the end";
  q.codes.pop_back();
  q.scales.pop_back();
  return q;
}

Quantized cols_rtne(const AlignedVector<float>& w, int64_t rows, int64_t cols) {
  Quantized q{std::vector<int8_t>(w.size() + 1, kGuardCode),
              AlignedVector<float>(static_cast<size_t>(cols) + 1, kGuardScale)};
  quantize_cols_rtne(std::span(q.codes).first(w.size()),
                     std::span(q.scales).first(static_cast<size_t>(cols)), w, rows, cols, "W");
  EXPECT_EQ(q.codes.back(), kGuardCode)
      << "cols: codes written past the end, " << rows << "x" << cols;
  EXPECT_EQ(q.scales.back(), kGuardScale) << "cols: scales written past the end";
  q.codes.pop_back();
  q.scales.pop_back();
  return q;
}

void expect_same(const Quantized& a, const Quantized& b, const char* what, int64_t rows,
                 int64_t cols) {
  for (size_t i = 0; i < a.scales.size(); ++i) {
    ASSERT_EQ(a.scales[i], b.scales[i]) << what << " scale " << i << " shape " << rows << "x" << cols;
  }
  for (size_t i = 0; i < a.codes.size(); ++i) {
    ASSERT_EQ(a.codes[i], b.codes[i]) << what << " code [" << i / cols << ", " << i % cols
                                      << "] shape " << rows << "x" << cols;
  }
}

// Every ISA and thread count gives the reference's scales and codes, bit for bit.
TEST(ForwardQuant, ReferenceAndAvx512AgreeBitExactly) {
  for (int64_t rows : kSizes) {
    for (int64_t cols : kSizes) {
      const auto x = random_matrix(rows, cols, static_cast<uint32_t>(rows * 1000 + cols));
      Quantized ref_rows, ref_cols;
      {
        ScopedIsa isa(Isa::kReference);
        testing::ScopedThreads threads(1);
        ref_rows = rows_rtne(x, rows, cols);
        ref_cols = cols_rtne(x, rows, cols);
      }
      for (Isa isa : testing::runnable_isas()) {
        ScopedIsa scoped(isa);
        for (int threads : {1, 2}) {
          testing::ScopedThreads st(threads);
          expect_same(rows_rtne(x, rows, cols), ref_rows, "rows", rows, cols);
          expect_same(cols_rtne(x, rows, cols), ref_cols, "cols", rows, cols);
        }
      }
    }
  }
}

// The drivers call the kernels on blocks: rows [r0, r1) of quantize_rows_rtne and
// quantize_cols_rtne, columns [c0, c1) (over rows [r0, r1)) of absmax_cols, the blocks of other
// threads beside them. A block that starts mid-range (rows of an odd width start off the lane
// grid; columns off the 8- and 16-lane grid) gives the reference's whole-range values at its
// positions and writes nothing outside it. Every tier, the reference included.
TEST(ForwardQuant, KernelBlocksStartingMidRangeGiveTheWholeRangesValues) {
  const int64_t rows = 13, cols = 37;
  const auto x = random_matrix(rows, cols, 11);
  std::vector<int8_t> row_codes(rows * cols), col_codes(rows * cols);
  AlignedVector<float> row_scales(rows), col_scales(cols);
  ASSERT_TRUE(kernels::ref::quantize_rows_rtne(row_codes.data(), row_scales.data(), x.data(), 0, rows, cols));
  ASSERT_TRUE(kernels::ref::absmax_cols(col_scales.data(), x.data(), 0, rows, cols, 0, cols));
  for (float& s : col_scales) s = kernels::ref::absmax_to_scale(s);
  kernels::ref::quantize_cols_rtne(col_codes.data(), x.data(), col_scales.data(), 0, rows, cols);
  const std::pair<int64_t, int64_t> row_blocks[] = {{1, rows}, {3, 4}, {5, 12}};
  for (Isa isa : testing::runnable_isas()) {
    const kernels::KernelTable& k = kernels::kernels_for(isa);
    for (auto [r0, r1] : row_blocks) {
      const std::string ctx = std::string(isa_name(isa)) + " rows [" + std::to_string(r0) + ", " +
                              std::to_string(r1) + ")";
      std::vector<int8_t> codes(rows * cols + 1, kGuardCode), ccodes(rows * cols + 1, kGuardCode);
      AlignedVector<float> scales(rows + 1, kGuardScale);
      ASSERT_TRUE(k.quantize_rows_rtne(codes.data(), scales.data(), x.data(), r0, r1, cols)) << ctx;
      k.quantize_cols_rtne(ccodes.data(), x.data(), col_scales.data(), r0, r1, cols);
      for (int64_t r = 0; r <= rows; ++r) {
        const bool inside = r >= r0 && r < r1;
        ASSERT_EQ(scales[r], inside ? row_scales[r] : kGuardScale) << ctx << " row scale " << r;
      }
      for (int64_t i = 0; i <= rows * cols; ++i) {
        const bool inside = i >= r0 * cols && i < r1 * cols;
        const std::string at = " at [" + std::to_string(i / cols) + ", " + std::to_string(i % cols) +
                               "]" + (inside ? "" : " (outside the rows)");
        ASSERT_EQ(codes[i], inside ? row_codes[i] : kGuardCode) << ctx << " row codes" << at;
        ASSERT_EQ(ccodes[i], inside ? col_codes[i] : kGuardCode) << ctx << " column codes" << at;
      }
    }
    for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, rows}, {2, 11}}) {
      // The column maxima of these rows, from the reference over every column.
      AlignedVector<float> want(cols);
      ASSERT_TRUE(kernels::ref::absmax_cols(want.data(), x.data(), r0, r1, cols, 0, cols));
      for (auto [c0, c1] : {std::pair<int64_t, int64_t>{1, cols}, {3, 4}, {5, 22}, {9, 33}, {17, 36}}) {
        AlignedVector<float> colmax(cols + 1, kGuardScale);
        ASSERT_TRUE(k.absmax_cols(colmax.data(), x.data(), r0, r1, cols, c0, c1));
        for (int64_t c = 0; c <= cols; ++c) {
          const bool inside = c >= c0 && c < c1;
          ASSERT_EQ(colmax[c], inside ? want[c] : kGuardScale)
              << isa_name(isa) << " absmax_cols rows [" << r0 << ", " << r1 << ") columns [" << c0
              << ", " << c1 << ") at column " << c << (inside ? "" : " (outside the columns)");
        }
      }
    }
  }
}

// The definition itself: scale = absmax/127 (1 for a zero row), codes = rne(x/scale).
TEST(ForwardQuant, FollowsTheSpecFormula) {
  const int64_t rows = 17, cols = 65;
  const auto x = random_matrix(rows, cols, 7);
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    const Quantized q = rows_rtne(x, rows, cols);
    for (int64_t r = 0; r < rows; ++r) {
      float absmax = 0.0f;
      for (int64_t c = 0; c < cols; ++c) absmax = std::max(absmax, std::fabs(x[r * cols + c]));
      const float scale = absmax > 0.0f ? absmax / 127.0f : 1.0f;
      ASSERT_EQ(q.scales[r], scale) << "row " << r;
      for (int64_t c = 0; c < cols; ++c) {
        const float v = x[r * cols + c] / scale;
        const int expected = static_cast<int>(std::nearbyint(std::clamp(v, -127.0f, 127.0f)));
        ASSERT_EQ(q.codes[r * cols + c], expected) << "[" << r << ", " << c << "] isa " << isa_name(isa);
        // Round to nearest: the reconstruction error is at most half a step.
        ASSERT_LE(std::fabs(q.codes[r * cols + c] * scale - x[r * cols + c]), 0.5f * scale * 1.0001f);
      }
    }
  }
}

TEST(ForwardQuant, TiesRoundToEvenAndExtremesMapTo127) {
  // absmax 127 -> scale 1, so x/scale = x exactly.
  const AlignedVector<float> x = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 126.5f, 127.0f, -127.0f};
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    const Quantized q = rows_rtne(x, 1, static_cast<int64_t>(x.size()));
    EXPECT_EQ(q.scales[0], 1.0f);
    const std::vector<int8_t> expected = {0, 2, 2, 0, -2, 126, 127, -127};
    EXPECT_EQ(q.codes, expected) << isa_name(isa);
  }
}

TEST(ForwardQuant, ZeroRowsAndColumnsGetScaleOne) {
  const AlignedVector<float> x(6 * 20, 0.0f);
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    const Quantized r = rows_rtne(x, 6, 20);
    const Quantized c = cols_rtne(x, 6, 20);
    for (float s : r.scales) EXPECT_EQ(s, 1.0f);
    for (float s : c.scales) EXPECT_EQ(s, 1.0f);
    for (int8_t v : r.codes) EXPECT_EQ(v, 0);
    for (int8_t v : c.codes) EXPECT_EQ(v, 0);
  }
}

TEST(ForwardQuant, NonFiniteInputNamesTheTensorAndPosition) {
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      AlignedVector<float> x(5 * 33, 1.0f);
      x[3 * 33 + 31] = bad;
      std::vector<int8_t> codes(x.size());
      AlignedVector<float> sx(5), sw(33);
      try {
        quantize_rows_rtne(codes, sx, x, 5, 33, "blocks.2.attn.q.X");
        FAIL() << "expected s3r::Error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("blocks.2.attn.q.X"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("[3, 31]"), std::string::npos) << e.what();
      }
      EXPECT_THROW(quantize_cols_rtne(codes, sw, x, 5, 33, "W"), Error);
    }
  }
}

TEST(ForwardQuant, MismatchedSizesAreRejected) {
  AlignedVector<float> x(12, 1.0f);
  std::vector<int8_t> codes(12), short_codes(11);
  AlignedVector<float> scales(3), wrong_scales(4);
  EXPECT_THROW(quantize_rows_rtne(codes, scales, x, 3, 5, "X"), Error);       // 12 != 15
  EXPECT_THROW(quantize_rows_rtne(short_codes, scales, x, 3, 4, "X"), Error);
  EXPECT_THROW(quantize_rows_rtne(codes, wrong_scales, x, 3, 4, "X"), Error);
  EXPECT_THROW(quantize_cols_rtne(codes, scales, x, 3, 4, "W"), Error);       // needs 4 scales
  EXPECT_NO_THROW(quantize_cols_rtne(codes, wrong_scales, x, 3, 4, "W"));
}

}  // namespace
}  // namespace s3r
