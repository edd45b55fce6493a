// Tests of the rounding's share of AdamW's second moment (s3r/nn/rounding_variance.hpp), the
// arithmetic of `s3r diag second-moment`: the estimator of the variance the rounding adds to a
// gradient coordinate, on a small layer whose exact variance is known (the exact distribution of
// the rounding errors, tests/nn/linear_rounding_model.hpp), and the share's summary.
#include "s3r/nn/rounding_variance.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "nn/linear_problem.hpp"
#include "nn/linear_reference.hpp"
#include "nn/linear_rounding_model.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/nn/quant_linear.hpp"

namespace s3r::nn {
namespace {

using testing::GradientMoments;
using testing::Moments;
using testing::Problem;

TEST(SquaredDeviation, MeanOfSquaredDeviationsFromTheReference) {
  SquaredDeviation d(AlignedVector<float>{1.0f, 2.0f, -3.0f});
  EXPECT_EQ(d.mean(), (std::vector<double>{0.0, 0.0, 0.0}));
  d.add(AlignedVector<float>{2.0f, 2.0f, -3.0f});
  d.add(AlignedVector<float>{0.0f, 4.0f, -1.0f});
  EXPECT_EQ(d.samples(), 2);
  EXPECT_EQ(d.mean(), (std::vector<double>{1.0, 2.0, 2.0}));  // (1+1)/2, (0+4)/2, (0+4)/2
  EXPECT_THROW(d.add(AlignedVector<float>{1.0f}), Error);
}

TEST(ShareAccumulator, SharesOfBiasCorrectedSecondMomentAndQuantiles) {
  // share = c2 r / (v / bias2); v = 0 is counted and left out.
  ShareAccumulator a(0.25, 0.5);
  a.add(std::vector<double>{1.0, 7.0, 2.0}, AlignedVector<float>{4.0f, 0.0f, 1.0f});
  const ShareSummary s = a.summary();
  EXPECT_EQ(s.coordinates, 2);
  EXPECT_EQ(s.zero_v, 1);
  EXPECT_DOUBLE_EQ(s.median, 0.25 * 1.0 / 8.0);  // sorted {0.03125, 0.25}: index floor(0.5) = 0
  EXPECT_DOUBLE_EQ(s.max, 0.25 * 2.0 / 2.0);
  EXPECT_DOUBLE_EQ(s.aggregate, 0.25 * 3.0 / 10.0);
  // 101 shares i / 100 (added in two groups, out of order): the quantiles are the i-th values.
  ShareAccumulator b(1.0, 1.0);
  std::vector<double> r1, r2;
  for (int i = 100; i >= 50; --i) r1.push_back(i / 100.0);
  for (int i = 0; i < 50; ++i) r2.push_back(i / 100.0);
  b.add(r1, AlignedVector<float>(r1.size(), 1.0f));
  b.add(r2, AlignedVector<float>(r2.size(), 1.0f));
  const ShareSummary q = b.summary();
  EXPECT_EQ(q.coordinates, 101);
  EXPECT_FLOAT_EQ(q.median, 0.5f);
  EXPECT_FLOAT_EQ(q.q90, 0.9f);
  EXPECT_FLOAT_EQ(q.q99, 0.99f);
  EXPECT_FLOAT_EQ(q.max, 1.0f);
  EXPECT_EQ(ShareAccumulator(1.0, 1.0).summary().coordinates, 0);
  EXPECT_THROW(ShareAccumulator(1.0, 0.0), Error);
  EXPECT_THROW(ShareAccumulator(-1.0, 0.5), Error);
  EXPECT_THROW(b.add(r1, AlignedVector<float>(1, 1.0f)), Error);
}

// A small layer, its exact-G weight gradient (unquantized G through the int8 forward, double),
// and the estimator of `s3r diag second-moment` over `keys` layer keys: r of every dW coordinate,
// with the per-key squared deviations' sample variance for the tolerance.
struct Estimate {
  std::vector<double> r, se;  // (K, N): the estimate and its standard error
  std::vector<double> fp;     // (K, N): allowance for the f32 roundings of dW and its reference
};

constexpr int64_t T = 64, K = 12, N = 16, S = 16;

Estimate estimate_dw(const Problem& p, LinearMode mode, Correction correction, int keys) {
  const testing::Operands o = testing::forward_operands(p);
  const testing::Reference ref = testing::unquantized_backward(p, o);
  const AlignedVector<float> ref_f(ref.dw.begin(), ref.dw.end());
  LinearInput xin;
  LinearWeight win;
  prepare_input(xin, p.x, T, K, mode, "X");
  prepare_weight(win, p.w, K, N, mode, "W");
  LinearWorkspace ws;
  SquaredDeviation dev(ref_f);
  std::vector<double> sum4(K * N, 0.0);
  AlignedVector<float> dw(K * N);
  for (int k = 0; k < keys; ++k) {
    const Key key = testing::make_layer_key(77, static_cast<uint32_t>(k), 3);
    linear_backward({}, dw, p.g, xin, win, {correction, S, key, false}, ws);
    dev.add(dw);
    for (int64_t i = 0; i < K * N; ++i) {
      const double d = static_cast<double>(dw[i]) - ref_f[i];
      sum4[i] += d * d * d * d;
    }
  }
  Estimate e{dev.mean(), std::vector<double>(K * N), std::vector<double>(K * N)};
  for (int64_t i = 0; i < K * N; ++i) {
    const double var_d2 = std::max(0.0, sum4[i] / keys - e.r[i] * e.r[i]);
    e.se[i] = std::sqrt(var_d2 / keys);
    // Each deviation is off by at most a (a few f32 roundings of dW's size, generously), so its
    // square by 2 |d| a + a^2.
    const double a = 1e-6 * std::fabs(ref.dw[i]);
    e.fp[i] = 2.0 * std::sqrt(e.r[i]) * a + a * a;
  }
  return e;
}

// The exact E[(dW - dW_ref)^2] = Var + mean^2 of every coordinate, from the rounding model.
std::vector<double> exact_mse(const Problem& p, LinearMode mode, bool two_way) {
  const testing::Operands o = testing::forward_operands(p);
  const testing::GradCodes gc = testing::grad_codes(p, o, mode, Key{0, 0});
  if (mode == LinearMode::kRtne) {
    const testing::Reference ref = testing::unquantized_backward(p, o);
    std::vector<double> m(K * N);
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t n = 0; n < N; ++n) {
        double dw = 0.0;  // D / sw[n] sum_t Xq[t,k] rne(x[t,n]), then minus dW_ref
        for (int64_t t = 0; t < T; ++t) dw += static_cast<double>(o.xq[t * K + k]) * gc.q[0][t * N + n];
        const double d = dw * gc.D / o.sw[n] - ref.dw[k * N + n];
        m[k * N + n] = d * d;
      }
    }
    return m;
  }
  const testing::RoundingModel model = testing::rounding_model(p, o, gc, mode);
  const GradientMoments gm = testing::gradient_moments(model, p, o, false, two_way);
  std::vector<double> m;
  for (const Moments& x : gm.dw) m.push_back(x.var + x.mean * x.mean);
  return m;
}

// Every coordinate's estimate within 5 standard errors (estimated from the keys' squared
// deviations, as s3r's statistical tests do) plus the float allowance, and that tolerance small
// enough that a 25% error in the variance would be caught everywhere, and a 10% one in at least
// three quarters of the coordinates.
void expect_estimates_exact(LinearMode mode, Correction correction, int keys) {
  const Problem p = testing::make_problem(T, K, N, S, 4243, false);
  const Estimate e = estimate_dw(p, mode, correction, keys);
  const std::vector<double> exact = exact_mse(p, mode, correction == Correction::kTwoWay);
  int resolved = 0, compared = 0;
  for (int64_t i = 0; i < K * N; ++i) {
    if (exact[i] == 0.0) {  // a zero X row or W column: no rounding reaches this coordinate
      EXPECT_LE(e.r[i], 1e-12 * (1.0 + exact[i])) << "dW " << i;
      continue;
    }
    ++compared;
    const double tol = 5.0 * e.se[i] + e.fp[i];
    EXPECT_NEAR(e.r[i], exact[i], tol) << to_string(mode) << " dW[" << i / N << "," << i % N << "], "
                                       << keys << " keys";
    if (tol < 0.1 * exact[i]) ++resolved;
    EXPECT_LT(tol, 0.25 * exact[i]) << "the tolerance would let a 25% error pass at dW " << i;
  }
  EXPECT_GT(compared, K * N / 2);
  // Columns of small |x| = |G'/D| (a quarter of them here) round to one of two adjacent codes
  // with a small probability: heavy-tailed deviations and wider tolerances.
  EXPECT_GE(resolved, compared * 3 / 4) << "the tolerance would let a 10% error pass";
}

TEST(RoundingVariance, SrEstimateMatchesTheExactVarianceOfASmallLayer) {
  expect_estimates_exact(LinearMode::kSr, Correction::kNone, 12000);
}

TEST(RoundingVariance, S3rEstimateMatchesTheExactVarianceOfASmallLayer) {
  expect_estimates_exact(LinearMode::kS3r, Correction::kNone, 12000);
}

TEST(RoundingVariance, TwoWayEstimateMatchesTheExactVarianceOfASmallLayer) {
  expect_estimates_exact(LinearMode::kS3r, Correction::kTwoWay, 12000);
}

TEST(RoundingVariance, RtneGivesItsBiasSquaredFromOneKey) {
  // Deterministic: one key's squared deviation is the bias squared; se = 0.
  expect_estimates_exact(LinearMode::kRtne, Correction::kNone, 1);
}

}  // namespace
}  // namespace s3r::nn
