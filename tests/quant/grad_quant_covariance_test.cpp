// The covariance of the backward quantizer's rounding errors (SPEC section 5, property 2): a
// threshold shared by a token's (or an example's) elements correlates their errors as Lemma 2
// says, independent thresholds do not, and centering by the token mean (S3R-EC's c, Theorem 1)
// lowers their variance and covariance equally. The problems and the quantizer's f32 arithmetic:
// grad_stats_problem.hpp. Seeds are fixed; every tolerance is derived from the sample size (or
// from an f32 rounding-error bound) in a comment beside it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "check_util.hpp"
#include "quant/grad_stats_problem.hpp"
#include "s3r/quant/grad_quant.hpp"
#include "test_util.hpp"

namespace s3r {
namespace {

using namespace grad_stats;  // the problems and the quantizer's f32 arithmetic
using testing::bernstein_tolerance;
using testing::Checker;
using testing::kU64;
using testing::str;

// Sample covariance (denominator draws - 1) of columns i and j of the draws x width matrix s.
double sample_covariance(const std::vector<double>& s, size_t width, int draws, size_t i,
                         size_t j) {
  double mi = 0.0, mj = 0.0;
  for (int d = 0; d < draws; ++d) {
    mi += s[d * width + i];
    mj += s[d * width + j];
  }
  mi /= draws;
  mj /= draws;
  double sum = 0.0;
  for (int d = 0; d < draws; ++d) sum += (s[d * width + i] - mi) * (s[d * width + j] - mj);
  return sum / (draws - 1);
}

// The model of two rounding errors E_i = D (U_i - p_i) + const, U the round-up indicators with
// P(U = 1) = p: either one shared threshold (the up-events are nested, P(both) = min(p_i, p_j);
// Lemma 2) or independent thresholds. delta bounds the error of p itself (0 when exact).
struct PairModel {
  double pi, pj;
  bool shared;
  double delta = 0.0;
};

// Cov(E_i, E_j) and Var((E_i - mu_i)(E_j - mu_j)), in units of D^2 and D^4, from the four joint
// outcomes of (U_i, U_j).
struct PairMoments {
  double cov, var_product;
};

PairMoments pair_moments(const PairModel& m) {
  const double both = m.shared ? std::min(m.pi, m.pj) : m.pi * m.pj;
  const double prob[2][2] = {{1.0 - m.pi - m.pj + both, m.pj - both}, {m.pi - both, both}};
  double mean = 0.0, mean_sq = 0.0;
  for (int a = 0; a < 2; ++a) {
    for (int b = 0; b < 2; ++b) {
      const double prod = (a - m.pi) * (b - m.pj);
      mean += prob[a][b] * prod;
      mean_sq += prob[a][b] * prod * prod;
    }
  }
  return {mean, std::max(0.0, mean_sq - mean * mean)};
}

// f64 rounding of one sample covariance of values in (-D, D]: centered values lie in (-2D, 2D),
// products in (-4D^2, 4D^2); recursive summation of `draws` of them errs by at most
// draws * u64 * 4D^2 (relative to the denominator draws - 1, up to a factor 2 for the means).
double covariance_fp_slack(int draws, double D) { return 16.0 * draws * kU64 * D * D; }

// Tolerance of the sample covariance of E_i, E_j over `draws` draws. With A the mean of the
// products centered at the true means mu, the estimator is
//   (M / (M - 1)) (A - (mean_i - mu_i)(mean_j - mu_j)),
// so it differs from the covariance by at most (M / (M - 1)) (tol_A + tol_i tol_j) +
// |cov| / (M - 1). Products lie in [-D^2, D^2] (|U - p| <= 1), so |product - cov| <= 2 D^2;
// |E - mu| <= D. A p off by delta moves Var(U) by <= delta and Var(product) by <= 2 delta
// (derivatives of p(1 - p) and of the joint moments are bounded by 1 on [0, 1]).
double covariance_tolerance(const PairModel& m, double D, int draws) {
  const PairMoments pm = pair_moments(m);
  const double D2 = D * D;
  const double sigma_product = D2 * std::sqrt(pm.var_product + 2.0 * m.delta);
  const double tol_a = bernstein_tolerance(sigma_product, 2.0 * D2, draws);
  const double tol_i = bernstein_tolerance(D * std::sqrt(m.pi * (1 - m.pi) + m.delta), D, draws);
  const double tol_j = bernstein_tolerance(D * std::sqrt(m.pj * (1 - m.pj) + m.delta), D, draws);
  const double ratio = static_cast<double>(draws) / (draws - 1);
  return ratio * (tol_a + tol_i * tol_j) + std::fabs(pm.cov) * D2 / (draws - 1) +
         covariance_fp_slack(draws, D);
}

// Checks the sample covariance of columns i, j of s (kDraws rows) against the model's, allowing
// also delta D^2 for the model's own error (|Var(U) at p + delta - Var(U) at p| <= delta).
// name_i, name_j name the two columns in a failure message.
void check_covariance(Checker& chk, const std::vector<double>& s, size_t width, size_t i,
                      size_t j, const char* name_i, const char* name_j, const PairModel& m,
                      double D) {
  const double expected = D * D * pair_moments(m).cov;
  const double tol = covariance_tolerance(m, D, kDraws) + m.delta * D * D;
  chk.near(expected, sample_covariance(s, width, kDraws, i, j), tol, [&] {
    return str("Cov(", name_i, "[", i, "], ", name_j, "[", j, "]) (columns; p = ", m.pi, ", ",
               m.pj, m.shared ? ", shared" : ", independent", " threshold)");
  });
}

// Lemma 2 with the exact 7-bit probabilities pt: up-events are upper sets {k >= k_i} of the 128
// thresholds (fl(x + r) and the clamp are monotone in r), so P(both up) = min(pt_i, pt_j).
PairModel seven_bit_pair(float xi, float xj, bool shared) {
  return {up_probability_7bit(xi), up_probability_7bit(xj), shared};
}

// The dX errors of tokens 0, 1 and 4 of fixed_problem() over kDraws keys: columns 0..N-1,
// N..2N-1 and 2N..3N-1 of `s` (token 1: the same Threefry word as token 0, next byte, same
// example; token 4: the next word, the next example).
struct TokenSample {
  Problem p = fixed_problem();
  double D = step_of(p);
  AlignedVector<float> x = scaled(p, static_cast<float>(D));
  int64_t N = p.N;
  size_t width = 3 * static_cast<size_t>(N);
  std::vector<double> s;
  TokenSample(GradRounding mode, uint32_t seed) {
    std::vector<Element> elements;
    for (int64_t t : {0, 1, 4}) {
      const auto row = row_elements(0, t, N);
      elements.insert(elements.end(), row.begin(), row.end());
    }
    s = sample_errors(p, mode, seed, kDraws, elements);
  }
};

// Token 0's errors against token 1's (sharing its threshold or not) and token 4's (never).
void check_across_tokens(Checker& chk, const TokenSample& ts, bool shared_with_1) {
  const int64_t N = ts.N;
  for (size_t i = 0; i < static_cast<size_t>(N); ++i) {
    for (size_t j = 0; j < static_cast<size_t>(N); ++j) {
      check_covariance(chk, ts.s, ts.width, i, N + j, "E[t=0]", "E[t=1]",
                       seven_bit_pair(ts.x[i], ts.x[N + j], shared_with_1), ts.D);
      check_covariance(chk, ts.s, ts.width, i, 2 * N + j, "E[t=0]", "E[t=4]",
                       seven_bit_pair(ts.x[i], ts.x[4 * N + j], false), ts.D);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 1. Shared-threshold covariance (Lemma 2) and independent thresholds.

TEST(GradQuantStats, SharedTokenThresholdCovarianceMatchesLemma2) {
  const TokenSample ts(GradRounding::kS3r, 77);
  const double D = ts.D;
  const int64_t N = ts.N;
  const auto& x = ts.x;
  Checker chk(str("s3r, ", kDraws, " draws"));
  int detectable = 0;
  for (size_t i = 0; i < static_cast<size_t>(N); ++i) {
    for (size_t j = i; j < static_cast<size_t>(N); ++j) {
      const float xi = x[i], xj = x[j];
      const PairModel model = seven_bit_pair(xi, xj, true);
      const double expected = D * D * pair_moments(model).cov;  // D^2 (min(pt_i, pt_j) - pt_i pt_j)
      check_covariance(chk, ts.s, ts.width, i, j, "E[t=0]", "E[t=0]", model, D);
      // The continuous formula: |pt - p| <= delta = 1/256 + ulp(|x| + 1)/2 (previous test);
      // |min(a,b) - min(a',b')| <= delta and |ab - a'b'| <= 2 delta, so within 3 delta D^2.
      const double pi = residual(xi), pj = residual(xj);
      const double continuous = D * D * (std::min(pi, pj) - pi * pj);
      const double delta =
          1.0 / 256.0 + ulp32(std::max(std::fabs(xi), std::fabs(xj)) + 1.0) / 2.0;
      chk.near(expected, continuous, 3.0 * delta * D * D,
               [&] { return str("continuous Lemma 2 at (", i, ", ", j, ")"); });
      // Would a covariance of 0 (independent thresholds) fail here, with the tolerance the
      // independent model would get?
      const PairModel independent = seven_bit_pair(xi, xj, false);
      if (i != j && expected > covariance_tolerance(independent, D, kDraws)) ++detectable;
    }
  }
  // Different tokens have different thresholds: covariance 0.
  check_across_tokens(chk, ts, false);
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
  // The test has power: on many pairs, independent thresholds (covariance 0) would fail.
  EXPECT_GE(detectable, N) << "pairs whose Lemma 2 covariance exceeds the tolerance of 0";
}

TEST(GradQuantStats, SharedExampleThresholdCovarianceMatchesLemma2) {
  // S = 4: tokens 0 and 1 share a threshold, 0 and 4 do not
  const TokenSample ts(GradRounding::kS3rBcast, 78);
  Checker chk(str("s3r-bcast, ", kDraws, " draws"));
  check_across_tokens(chk, ts, true);
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
}

TEST(GradQuantStats, IndependentThresholdsGiveZeroCovariance) {
  const Problem p = fixed_problem();
  const double D = step_of(p);
  const AlignedVector<float> x = scaled(p, static_cast<float>(D));
  const int64_t N = p.N;
  std::vector<Element> elements = row_elements(0, 0, N);  // codes for dX, then for dW
  const auto dw = row_elements(1, 0, N);
  elements.insert(elements.end(), dw.begin(), dw.end());
  const size_t width = elements.size();
  const auto s = sample_errors(p, GradRounding::kSr, 79, kDraws, elements);
  Checker chk(str("sr, ", kDraws, " draws"));
  for (size_t i = 0; i < static_cast<size_t>(N); ++i) {
    // The probability of rounding up is within delta = ulp(|x| + 1) + 2^-22 of the residual p
    // (f32 and the 23-bit grid, see the first test).
    auto sr_pair = [&](size_t a, size_t b, bool same) {
      const double delta = ulp32(std::max(std::fabs(x[a]), std::fabs(x[b])) + 1.0) + 0x1p-22;
      return PairModel{residual(x[a]), residual(x[b]), same, delta};
    };
    // Variance D^2 p (1 - p) of both products (one variable: the "shared" model with i = j).
    check_covariance(chk, s, width, i, i, "E0[t=0]", "E0[t=0]", sr_pair(i, i, true), D);
    check_covariance(chk, s, width, N + i, N + i, "E1[t=0]", "E1[t=0]", sr_pair(i, i, true), D);
    // The two products' codes of one element are independent.
    check_covariance(chk, s, width, i, N + i, "E0[t=0]", "E1[t=0]", sr_pair(i, i, false), D);
    for (size_t j = i + 1; j < static_cast<size_t>(N); ++j) {
      check_covariance(chk, s, width, i, j, "E0[t=0]", "E0[t=0]", sr_pair(i, j, false), D);
      check_covariance(chk, s, width, N + i, N + j, "E1[t=0]", "E1[t=0]", sr_pair(i, j, false),
                       D);
      check_covariance(chk, s, width, i, N + j, "E0[t=0]", "E1[t=0]", sr_pair(i, j, false), D);
    }
  }
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
}

// ---------------------------------------------------------------------------------------------
// 2. Centering (Theorem 1).

// Average diagonal and off-diagonal entries of the sample covariance (denominator draws - 1) of
// the N columns of the draws x N matrix v.
struct CovAverages {
  double diag, off;
};

CovAverages covariance_averages(const std::vector<double>& v, int64_t N, int draws) {
  std::vector<double> mean(static_cast<size_t>(N), 0.0);
  for (int d = 0; d < draws; ++d) {
    for (int64_t i = 0; i < N; ++i) mean[i] += v[d * N + i];
  }
  for (double& m : mean) m /= draws;
  double diag = 0.0, all = 0.0;
  for (int d = 0; d < draws; ++d) {
    double row_sum = 0.0, row_sq = 0.0;
    for (int64_t i = 0; i < N; ++i) {
      const double c = v[d * N + i] - mean[i];
      row_sum += c;
      row_sq += c * c;
    }
    diag += row_sq;
    all += row_sum * row_sum;  // sum over all (i, j) of the centered products
  }
  diag /= draws - 1;
  all /= draws - 1;
  return {diag / N, (all - diag) / (N * (N - 1))};
}

double sample_variance(const std::vector<double>& v) {
  double mean = 0.0;
  for (double a : v) mean += a;
  mean /= static_cast<double>(v.size());
  double sq = 0.0;
  for (double a : v) sq += (a - mean) * (a - mean);
  return sq / static_cast<double>(v.size() - 1);
}

TEST(GradQuantStats, CenteringByTokenMeanLowersVarianceAndCovarianceEqually) {
  const Problem p = fixed_problem();
  const float D = step_of(p);
  const AlignedVector<float> x = scaled(p, D);
  const int64_t T = p.T, N = p.N;
  const double eps_c = stat_bounds(D, p.S, N).c;  // |c[t] - mean_n E[t,n]| (see stat_bounds)

  // e[t]: draws x N errors of token t; c[t]: the quantizer's token means.
  std::vector<std::vector<double>> e(T), c(T);
  Checker chk(str("s3r, ", kDraws, " draws"));
  QuantizedGrad out;
  testing::ScopedThreads one_thread(1);  // as in sample_errors
  for (int d = 0; d < kDraws; ++d) {
    quantize(out, p, GradRounding::kS3r, draw_key(4321, static_cast<uint32_t>(d)), true);
    ASSERT_EQ(out.stats[0].token_mean.size(), static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      double sum = 0.0;
      for (int64_t n = 0; n < N; ++n) {
        const double v = error_of(out, 0, x, t * N + n);
        e[t].push_back(v);
        sum += v;
      }
      c[t].push_back(out.stats[0].token_mean[t]);
      if (d < 200) {  // plenty to catch a wrong mean; keeps the check count modest
        chk.near(sum / N, c[t].back(), eps_c + N * kU64 * D,
                 [&] { return str("c[t=", t, "] at draw ", d); });
      }
    }
  }
  // f64 rounding of the averaged sample covariances: centered values of E - c lie in (-4D, 4D),
  // products in (-16 D^2, 16 D^2), each covariance errs by <= draws * u64 * 16 D^2; four of
  // them enter each comparison.
  const double fp = 64.0 * kDraws * kU64 * static_cast<double>(D) * D;
  // The sample variance of (mean_n E - c) is at most eps_c^2 draws / (draws - 1).
  const double var_gap = eps_c * eps_c * kDraws / (kDraws - 1);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> centered(e[t]);
    for (int d = 0; d < kDraws; ++d) {
      for (int64_t n = 0; n < N; ++n) centered[d * N + n] -= c[t][d];
    }
    const CovAverages raw = covariance_averages(e[t], N, kDraws);
    const CovAverages cen = covariance_averages(centered, N, kDraws);
    const double var_c = sample_variance(c[t]);
    const double drop_diag = raw.diag - cen.diag, drop_off = raw.off - cen.off;
    const std::string row = str("token ", t);
    // Subtracting any per-draw scalar c lowers both averages by 2 Cov(m, c) - Var(c), m the
    // exact row mean: an identity of sample covariances, so only f64 rounding separates them.
    chk.near(drop_diag, drop_off, fp,
             [&] { return row + ": average off-diagonal drop vs variance drop"; });
    // 2 Cov(m, c) - Var(c) - Var(c) = -2 Cov(c - m, c), and |Cov(c - m, c)| <= sd(c - m) sd(c)
    // <= sqrt(var_gap) sd(c): the drop is Var(mean) to that tolerance.
    const double var_tol = 2.0 * std::sqrt(var_gap * var_c) + fp;
    chk.near(var_c, drop_diag, var_tol, [&] { return row + ": drop vs Var(c)"; });
    // N avg_diag + N (N - 1) avg_off = N^2 Var(m - c) after centering, avg_diag >= 0: so the
    // centered average off-diagonal covariance is <= N var_gap / (N - 1), and it equals
    // -avg_diag / (N - 1) within the same amount.
    const double bound = N * var_gap / (N - 1) + fp;
    chk.at_most(cen.off, bound,
                [&] { return row + ": centered average off-diagonal covariance"; });
    chk.near(-cen.diag / (N - 1), cen.off, bound,
             [&] { return row + ": centered off-diagonal vs -diagonal/(N-1)"; });
    // Power: the shared threshold makes the raw covariances positive (Lemma 2), and centering
    // removes a variance that is large against the tolerances above.
    chk.at_least(raw.off, 100.0 * fp,
                 [&] { return row + ": raw average off-diagonal covariance"; });
    chk.at_least(var_c, 100.0 * var_tol, [&] { return row + ": Var(c)"; });
  }
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
}

}  // namespace
}  // namespace s3r
