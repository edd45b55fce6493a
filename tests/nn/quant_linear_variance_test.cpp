// Tests of s3r::nn QuantLinear: the variance story (SPEC 5.4, Proposition 1) on a layer whose weight rows share a common
// component, W[k,n] = mu_k + small noise, so that rowsum(Wq)[k] ~ 127 N mu_k / max|W| is large:
// a token-shared threshold makes the errors of a token's N channels positively correlated
// (Lemma 2), and Wq adds them coherently into dX; the correction removes the token means c
// (and a, m) that carry this common mode. dW sums over tokens, whose thresholds are independent
// under s3r as under sr, so its error variance does not change. Under s3r-bcast the tokens of an
// example share one threshold: with activations X[t,k] = nu_k + noise, Xq adds an example's
// correlated errors coherently into dW, and so does any sum of dX over an example's tokens.
// dX itself of one token depends on that token's threshold only, uniform under s3r and
// s3r-bcast alike, so its error has exactly the same distribution under both. The layer:
// shared_component_problem (linear_problem.hpp).
// Its problems, reference and rounding model: linear_problem.hpp, linear_reference.hpp and
// linear_rounding_model.hpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "check_util.hpp"
#include "nn/layer_run.hpp"
#include "nn/linear_problem.hpp"
#include "nn/linear_reference.hpp"
#include "nn/linear_rounding_model.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/nn/linear_mode.hpp"
#include "s3r/nn/quant_linear.hpp"
#include "test_util.hpp"

namespace s3r::nn {
namespace {

using namespace s3r::nn::testing;  // the problems, the reference and the rounding model
using s3r::testing::Checker;
using s3r::testing::str;

constexpr int kStoryDraws = 2000;

// Relative squared errors of one draw: ||dX - dX_ref||^2 / ||dX_ref||^2, the same for dW, and
// for the example sums sum_{s in b} dX[b*S+s, k] (what a previous layer's dW adds up).
struct ErrorNorms {
  double dx = 0.0, dw = 0.0, dx_sum = 0.0;
};

// Example sums of a (T, K) tensor: (B, K).
std::vector<double> example_sums(const Problem& p, const std::vector<double>& v) {
  std::vector<double> sums(static_cast<size_t>(p.B() * p.K), 0.0);
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t k = 0; k < p.K; ++k) sums[(t / p.S) * p.K + k] += v[t * p.K + k];
  }
  return sums;
}

double squared_norm(const std::vector<double>& v) {
  double s = 0.0;
  for (double a : v) s += a * a;
  return s;
}

// Mean and standard error of a sample.
struct Estimate {
  double mean = 0.0, se = 0.0;
};

Estimate estimate(const std::vector<double>& v) {
  Estimate e;
  for (double a : v) e.mean += a / static_cast<double>(v.size());
  double sq = 0.0;
  for (double a : v) sq += (a - e.mean) * (a - e.mean);
  e.se = std::sqrt(sq / static_cast<double>(v.size() - 1) / static_cast<double>(v.size()));
  return e;
}

struct StoryConfig {
  LinearMode mode;
  Correction correction;
};

// Measured relative MSEs of one configuration over kStoryDraws keys of its own stream.
struct StoryResult {
  Estimate dx, dw, dx_sum;  // measured
  ErrorNorms exact;         // exact expectations from the rounding model
  ErrorNorms fp;            // allowance for the layer's f32 rounding (see fp_allowance)
};

// E||err + delta||^2 - E||err||^2 <= 2 sqrt(E||err||^2) ||tol|| + ||tol||^2 when every
// |delta_i| <= tol_i (Cauchy-Schwarz, then Jensen over draws); relative to ||ref||^2.
double fp_allowance(double mse, const std::vector<double>& tol, double ref_norm2) {
  const double t2 = squared_norm(tol) / ref_norm2;
  return 2.0 * std::sqrt(mse * t2) + t2;
}

StoryResult run_story(const Problem& p, const Operands& o, const Reference& ref,
                      const StoryConfig& cfg, uint32_t stream) {
  LayerRun run;
  prepare(run, p, cfg.mode);
  const double n_dx = squared_norm(ref.dx), n_dw = squared_norm(ref.dw);
  const std::vector<double> ref_sum = example_sums(p, ref.dx);
  const double n_sum = squared_norm(ref_sum);
  std::vector<double> e_dx, e_dw, e_sum;
  AlignedVector<float> dx(static_cast<size_t>(p.T * p.K)), dw(static_cast<size_t>(p.K * p.N));
  std::vector<double> err(dx.size());
  for (int d = 0; d < kStoryDraws; ++d) {
    const Key key = make_layer_key(stream, static_cast<uint32_t>(d), 0);
    linear_backward(dx, dw, p.g, run.in, run.weight, backward_config(p, cfg.correction, key, false),
                    run.ws);
    double s_dx = 0.0, s_dw = 0.0;
    for (size_t i = 0; i < dx.size(); ++i) {
      err[i] = dx[i] - ref.dx[i];
      s_dx += err[i] * err[i];
    }
    for (size_t i = 0; i < dw.size(); ++i) s_dw += (dw[i] - ref.dw[i]) * (dw[i] - ref.dw[i]);
    e_dx.push_back(s_dx / n_dx);
    e_dw.push_back(s_dw / n_dw);
    e_sum.push_back(squared_norm(example_sums(p, err)) / n_sum);
  }
  StoryResult r{estimate(e_dx), estimate(e_dw), estimate(e_sum), {}, {}};

  // Exact expectations: sum over elements of Var + (E[err])^2.
  const GradCodes gc = grad_codes(p, o, cfg.mode, Key{0, 0});
  const RoundingModel model = rounding_model(p, o, gc, cfg.mode);
  const bool correct_dx = cfg.correction != Correction::kNone;
  const bool correct_dw = cfg.correction == Correction::kTwoWay;
  const GradientMoments gm = gradient_moments(model, p, o, correct_dx, correct_dw);
  for (const Moments& m : gm.dx) r.exact.dx += (m.var + m.mean * m.mean) / n_dx;
  for (const Moments& m : gm.dw) r.exact.dw += (m.var + m.mean * m.mean) / n_dw;
  for (int64_t k = 0; k < p.K; ++k) {  // example sums: alpha_s summed over the example's rows
    const TokenMoments tm = token_moments(model, dx_beta(p, o, k, correct_dx));
    for (int64_t b = 0; b < p.B(); ++b) {
      std::vector<double> alpha(static_cast<size_t>(p.S), 0.0);
      for (int64_t t = b * p.S; t < (b + 1) * p.S; ++t) {
        const std::vector<double> a = dx_alpha(p, o, t, correct_dx);
        for (int64_t s = 0; s < p.S; ++s) alpha[s] += a[s];
      }
      const Moments m = combine(model, tm, b * p.S, alpha);
      r.exact.dx_sum += (m.var + m.mean * m.mean) / n_sum;
    }
  }
  // f32 allowances, from the per-draw bounds of (a) with worst-case magnitudes.
  const Magnitudes worst = worst_magnitudes(p, gc, stat_eps(p, exact_folded(p, o), gc.D));
  std::vector<double> tol_dx, tol_dw;
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t k = 0; k < p.K; ++k)
      tol_dx.push_back(dx_tolerance(p, o, worst, t, k, correct_dx, 0));
  }
  for (int64_t k = 0; k < p.K; ++k) {
    for (int64_t n = 0; n < p.N; ++n) tol_dw.push_back(dw_tolerance(p, o, worst, k, n, correct_dw));
  }
  r.fp.dx = fp_allowance(r.dx.mean, tol_dx, n_dx);
  r.fp.dw = fp_allowance(r.dw.mean, tol_dw, n_dw);
  std::vector<double> tol_sum = example_sums(p, tol_dx);  // |sum delta| <= sum tol
  r.fp.dx_sum = fp_allowance(r.dx_sum.mean, tol_sum, n_sum);
  return r;
}

// The standard errors are estimated from the kStoryDraws per-draw squared norms, each a sum of
// thousands of bounded terms (near-Gaussian, moderate kurtosis): the estimate's relative error is
// about sqrt((kurtosis - 1) / (4 M)) < 5% here, so 5 estimated SEs are at least 4.7 true ones
// (a chance failure below 3e-6 per check). Configurations use independent key streams, so the
// SE of a difference is sqrt(se_a^2 + se_b^2) and that of a ratio A/B is
// (A/B) sqrt((se_a/A)^2 + (se_b/B)^2).
constexpr double kStoryZ = 5.0;

double se_ratio(const Estimate& a, const Estimate& b) {
  return a.mean / b.mean * std::hypot(a.se / a.mean, b.se / b.mean);
}

// a > b by more than kStoryZ standard errors of the difference.
void expect_greater(Checker& chk, const char* what, const char* a_name, const Estimate& a,
                    const char* b_name, const Estimate& b) {
  const double margin = kStoryZ * std::hypot(a.se, b.se);
  chk.expect(a.mean - b.mean > margin, [&] {
    return str(what, ": expected ", a_name, " (", a.mean, " +- ", a.se, ") > ", b_name, " (",
               b.mean, " +- ", b.se, ") by more than ", margin);
  });
}

// |a/b - 1| <= kStoryZ se(a/b) + systematic.
void expect_equal_ratio(Checker& chk, const char* what, const Estimate& a, const Estimate& b,
                        double systematic) {
  const double tol = kStoryZ * se_ratio(a, b) + systematic;
  chk.near(1.0, a.mean / b.mean, tol, [&] {
    return str(what, " (", a.mean, " +- ", a.se, " over ", b.mean, " +- ", b.se, "; noise ",
               kStoryZ, " SE + systematic ", systematic, ")");
  });
}

// The measured mean against its exact expectation: kStoryZ SE and the f32 allowance.
void expect_exact(Checker& chk, const char* what, const Estimate& m, double exact, double fp) {
  chk.near(exact, m.mean, kStoryZ * m.se + fp,
           [&] { return str(what, ": measured mean ", m.mean, " +- ", m.se, " vs exact"); });
}

// A bound on |E||dW err||^2_s3r - E||dW err||^2_sr| / ||dW_ref||^2 without sampling: per element,
// Var differs by D^2 |q7 (1 - q7) - q23 (1 - q23)| <= D^2 |q7 - q23| with q the probabilities of
// rounding up, |q7 - p| <= 1/256 + ulp(|x|+1)/2 and |q23 - p| <= ulp(|x|+1) + 2^-22 (the bias
// bounds of rounding_model); the squared means differ by at most the larger squared bias bound.
// Relative to ||dW_ref||^2, like the MSEs.
double dw_systematic_bound(const Problem& p, const Operands& o, const RoundingModel& m7,
                           const Reference& ref) {
  double total = 0.0;
  for (int64_t k = 0; k < p.K; ++k) {
    for (int64_t n = 0; n < p.N; ++n) {
      double var_gap = 0.0, bias = 0.0;
      for (int64_t t = 0; t < p.T; ++t) {
        const double a = o.xq[t * p.K + k] / static_cast<double>(o.sw[n]);
        const int64_t i = t * p.N + n;
        // |x| <= 127 (1 + u): ulp(|x| + 1) <= 2^-16.
        var_gap += a * a * m7.D * m7.D * (1.0 / 256.0 + 1.5 * 0x1p-16 + 0x1p-22);
        bias += std::fabs(a) * m7.bias[i];
      }
      total += var_gap + bias * bias;
    }
  }
  return total / squared_norm(ref.dw);
}

TEST(QuantLinearStats, VarianceStory) {
  const Problem p = shared_component_problem();
  const Operands o = forward_operands(p);
  const Reference ref = unquantized_backward(p, o);
  s3r::testing::ScopedThreads one_thread(1);
  const StoryConfig configs[] = {{LinearMode::kS3rBcast, Correction::kNone},
                                 {LinearMode::kS3r, Correction::kNone},
                                 {LinearMode::kSr, Correction::kNone},
                                 {LinearMode::kS3r, Correction::kTwoWay},
                                 {LinearMode::kS3r, Correction::kDx}};
  std::vector<StoryResult> r;
  Checker chk(str(p.shape(), ", ", kStoryDraws, " draws"));
  for (size_t c = 0; c < std::size(configs); ++c) {
    r.push_back(run_story(p, o, ref, configs[c], 9000u + static_cast<uint32_t>(c)));
    const std::string name =
        str(to_string(configs[c].mode), " + ", to_string(configs[c].correction));
    std::printf(
        "[ story    ] %-20s rel. MSE dX %.4e +- %.1e (exact %.4e), dW %.4e +- %.1e "
        "(exact %.4e), example-summed dX %.4e (exact %.4e)\n",
        name.c_str(), r[c].dx.mean, r[c].dx.se, r[c].exact.dx, r[c].dw.mean, r[c].dw.se,
        r[c].exact.dw, r[c].dx_sum.mean, r[c].exact.dx_sum);
    expect_exact(chk, (name + ": dX").c_str(), r[c].dx, r[c].exact.dx, r[c].fp.dx);
    expect_exact(chk, (name + ": dW").c_str(), r[c].dw, r[c].exact.dw, r[c].fp.dw);
    expect_exact(chk, (name + ": example-summed dX").c_str(), r[c].dx_sum, r[c].exact.dx_sum,
                 r[c].fp.dx_sum);
  }
  const StoryResult &bcast = r[0], &s3r = r[1], &sr = r[2], &two_way = r[3], &dx_only = r[4];
  std::printf(
      "[ story    ] dX ratios: s3r-bcast/s3r %.3f, s3r/sr %.3f, sr/(s3r+two-way) %.3f, "
      "(s3r+dx)/(s3r+two-way) %.3f; dW ratios: s3r/sr %.4f, s3r-bcast/s3r %.3f; "
      "example-summed dX: s3r-bcast/s3r %.3f\n",
      bcast.dx.mean / s3r.dx.mean, s3r.dx.mean / sr.dx.mean, sr.dx.mean / two_way.dx.mean,
      dx_only.dx.mean / two_way.dx.mean, s3r.dw.mean / sr.dw.mean, bcast.dw.mean / s3r.dw.mean,
      bcast.dx_sum.mean / s3r.dx_sum.mean);

  // dX: sharing per token costs variance, the correction more than recovers it.
  expect_greater(chk, "dX error", "s3r", s3r.dx, "sr", sr.dx);
  expect_greater(chk, "dX error", "sr", sr.dx, "s3r + two-way", two_way.dx);
  // dX: a token's dX sees one uniform threshold under s3r and s3r-bcast alike (exactly equal
  // expectations), and dx-only applies the same dX correction as two-way.
  chk.near(s3r.exact.dx, bcast.exact.dx, 1e-12 * s3r.exact.dx,
           [] { return std::string("exact dX error, s3r-bcast vs s3r"); });
  expect_equal_ratio(chk, "dX error ratio s3r-bcast / s3r", bcast.dx, s3r.dx, 0.0);
  expect_equal_ratio(chk, "dX error ratio (s3r + dx) / (s3r + two-way)", dx_only.dx, two_way.dx,
                     0.0);
  // dW: per-token sharing leaves the error of sr (Proposition 1) up to the 7-bit thresholds'
  // systematic difference; per-example sharing does not.
  const GradCodes gc = grad_codes(p, o, LinearMode::kS3r, Key{0, 0});
  const double systematic =
      dw_systematic_bound(p, o, rounding_model(p, o, gc, LinearMode::kS3r), ref) / sr.exact.dw;
  std::printf("[ story    ] dW s3r/sr: noise %.2g (%g SE) + systematic bound %.2g\n",
              kStoryZ * se_ratio(s3r.dw, sr.dw), kStoryZ, systematic);
  expect_equal_ratio(chk, "dW error ratio s3r / sr", s3r.dw, sr.dw, systematic);
  expect_greater(chk, "dW error", "s3r-bcast", bcast.dw, "s3r", s3r.dw);
  expect_greater(chk, "example-summed dX error", "s3r-bcast", bcast.dx_sum, "s3r", s3r.dx_sum);
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
}

}  // namespace
}  // namespace s3r::nn
