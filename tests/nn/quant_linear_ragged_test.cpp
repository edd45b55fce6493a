// The quantized linear layer's backward over a mixture of experts' rows (BatchPlacement::ragged):
// the dense backward when the rows are the dense ones, and a row's gradient independent of where
// the expert sort put it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "nn/linear_problem.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/nn/quant_linear.hpp"
#include "test_util.hpp"

namespace s3r::nn {
namespace {

struct Grads {
  AlignedVector<float> dx, dw;
};

Grads backward(const testing::Problem& p, LinearMode mode, Correction correction, const BatchPlacement& place) {
  LinearInput xin;
  LinearWeight win;
  prepare_input(xin, p.x, p.T, p.K, mode, "X");
  prepare_weight(win, p.w, p.K, p.N, mode, "W");
  Grads out{AlignedVector<float>(static_cast<size_t>(p.T * p.K)), AlignedVector<float>(static_cast<size_t>(p.K * p.N))};
  LinearWorkspace ws;
  const LinearBackwardConfig cfg{correction, p.S, testing::make_layer_key(3, 9, 4), false, -1, place};
  linear_backward(out.dx, out.dw, p.g, xin, win, cfg, ws);
  return out;
}

const LinearMode kModes[] = {LinearMode::kF32, LinearMode::kBf16, LinearMode::kRtne, LinearMode::kSr,
                             LinearMode::kS3r, LinearMode::kS3rBcast};
const Correction kCorrections[] = {Correction::kNone, Correction::kDx, Correction::kTwoWay};

// Ids t and examples of S rows: every mode, correction and leaf count gives the dense bits.
TEST(QuantLinearRagged, UniformRowsAreTheDenseBackward) {
  const testing::Problem p = testing::make_problem(48, 40, 24, 8, 17, false);
  std::vector<uint64_t> ids(static_cast<size_t>(p.T));
  std::iota(ids.begin(), ids.end(), uint64_t{0});
  std::vector<int64_t> offsets;
  for (int64_t b = 0; b <= p.B(); ++b) offsets.push_back(b * p.S);
  for (LinearMode mode : kModes) {
    for (Correction c : kCorrections) {
      if (!is_int8(mode) && c != Correction::kNone) continue;
      for (int64_t leaves : {1, 2, 6}) {
        const std::string ctx = std::string(to_string(mode)) + " correction " + std::to_string(int(c)) +
                                " leaves " + std::to_string(leaves);
        const Grads want = backward(p, mode, c, BatchPlacement{nullptr, 0, leaves});
        const Grads got =
            backward(p, mode, c, BatchPlacement{nullptr, 0, leaves, RaggedRows{ids, offsets, uint64_t(p.S)}});
        ASSERT_EQ(got.dx, want.dx) << ctx;
        ASSERT_EQ(got.dw, want.dw) << ctx;
      }
    }
  }
}

// Rows permuted as an expert sort permutes them, each with its id (one example): every row's dX
// is the one it has in place, bit for bit without the correction; dW (an exact int32 sum) is
// the same bits. With the dX correction the example's means are summed in another order, so dX
// agrees to f32 rounding.
TEST(QuantLinearRagged, ARowsGradientDoesNotDependOnItsPlace) {
  testing::Problem p = testing::make_problem(40, 24, 32, 40, 5, false);
  std::vector<uint64_t> order(static_cast<size_t>(p.T));
  std::iota(order.begin(), order.end(), uint64_t{0});
  std::stable_sort(order.begin(), order.end(), [](uint64_t a, uint64_t b) { return (a * 5) % 3 < (b * 5) % 3; });
  testing::Problem sorted = p;
  for (int64_t i = 0; i < p.T; ++i) {
    const int64_t t = static_cast<int64_t>(order[i]);
    std::copy_n(p.x.begin() + t * p.K, p.K, sorted.x.begin() + i * p.K);
    std::copy_n(p.g.begin() + t * p.N, p.N, sorted.g.begin() + i * p.N);
  }
  const std::vector<int64_t> offsets = {0, p.T};
  const BatchPlacement place{nullptr, 0, 1, RaggedRows{order, offsets, uint64_t(p.T)}};
  for (LinearMode mode : {LinearMode::kRtne, LinearMode::kSr, LinearMode::kS3r, LinearMode::kS3rBcast}) {
    for (Correction c : {Correction::kNone, Correction::kDx}) {
      const std::string ctx = std::string(to_string(mode)) + " correction " + std::to_string(int(c));
      const Grads want = backward(p, mode, c, BatchPlacement{});
      const Grads got = backward(sorted, mode, c, place);
      ASSERT_EQ(got.dw, want.dw) << ctx;
      float scale = 0.0f;  // the correction's terms are of dX's size; their f32 sums' order differs
      for (float v : want.dx) scale = std::max(scale, std::fabs(v));
      for (int64_t i = 0; i < p.T; ++i) {
        for (int64_t k = 0; k < p.K; ++k) {
          const float w = want.dx[order[i] * p.K + k], g = got.dx[i * p.K + k];
          if (c == Correction::kNone) {
            ASSERT_EQ(g, w) << ctx << " row " << i;
          } else {
            ASSERT_NEAR(g, w, 1e-5 * scale) << ctx << " row " << i;
          }
        }
      }
    }
  }
}

// Uneven examples (some empty) with the two-way correction and leaves: runs, and the f32 mode's
// dW is the exact sum whichever leaves the rows fall in.
TEST(QuantLinearRagged, UnevenExamplesWithLeaves) {
  const testing::Problem p = testing::make_problem(30, 16, 20, 30, 8, false);
  std::vector<uint64_t> ids(static_cast<size_t>(p.T));
  for (int64_t t = 0; t < p.T; ++t) ids[t] = static_cast<uint64_t>(2 * t);
  const std::vector<int64_t> offsets = {0, 0, 7, 7, 20, 30};  // 5 examples
  const BatchPlacement one{nullptr, 0, 1, RaggedRows{ids, offsets, 16}};
  const BatchPlacement five{nullptr, 0, 5, RaggedRows{ids, offsets, 16}};
  const Grads a = backward(p, LinearMode::kF32, Correction::kNone, one);
  const Grads b = backward(p, LinearMode::kF32, Correction::kNone, five);
  for (size_t i = 0; i < a.dw.size(); ++i) ASSERT_NEAR(a.dw[i], b.dw[i], 1e-5 * (std::fabs(a.dw[i]) + 1e-3));
  EXPECT_EQ(a.dx, b.dx);
  const Grads q = backward(p, LinearMode::kS3r, Correction::kTwoWay, five);
  for (float v : q.dw) ASSERT_TRUE(std::isfinite(v));
  EXPECT_THROW(backward(p, LinearMode::kS3r, Correction::kDx, BatchPlacement{nullptr, 0, 2, RaggedRows{ids, offsets, 16}}),
               Error);  // 2 leaves do not divide 5 examples
}

}  // namespace
}  // namespace s3r::nn
