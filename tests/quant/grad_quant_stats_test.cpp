// Statistical properties of the backward quantizer (SPEC section 5, properties 1-3, and the
// S3R-EC statistics of section 4): unbiasedness over keys (Lemma 1), the exact 7-bit bias bound,
// the shared-threshold covariance (Lemma 2), centering (Theorem 1), and the zero row and column
// sums of E - Estr. Seeds are fixed; every tolerance is derived (from the sample size, or from an
// f32 rounding-error bound) in a comment beside it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "check_util.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/isa.hpp"
#include "s3r/quant/grad_quant.hpp"
#include "s3r/quant/thresholds.hpp"
#include "s3r/rng/threefry.hpp"
#include "test_util.hpp"

namespace s3r {
namespace {

using testing::bernstein_tolerance;
using testing::Checker;
using testing::kBernsteinL;
using testing::kU32;
using testing::kU64;
using testing::str;

constexpr int kDraws = 4000;  // keys per statistical test (SE of a mean <= 0.5 D / 63)


// ---------------------------------------------------------------------------------------------
// Problems and the quantizer's own f32 arithmetic, recomputed.

// G (T, N) row-major, the forward scales sx (T) and sw (N), S tokens per example.
struct Problem {
  int64_t T = 0, N = 0, S = 0;
  AlignedVector<float> g, sx, sw;
};

float sym_uniform(Key key, uint64_t i) { return uniform23(random_bits32(key, i)) * 2.0f - 1.0f; }

// Both signs, magnitudes over several binades (channel n scaled by 4^-(n % 5)), scales that are
// not all 1; with zero_row, token rows t % 7 == 3 are exactly 0.
Problem make_problem(int64_t B, int64_t S, int64_t N, uint32_t seed, bool zero_row) {
  Problem p;
  p.T = B * S;
  p.N = N;
  p.S = S;
  const Key key = key_from_seed(seed);
  p.g.resize(static_cast<size_t>(p.T * N));
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      const float mag = std::ldexp(1.0f, -2 * static_cast<int>(n % 5));
      p.g[t * N + n] = (zero_row && t % 7 == 3) ? 0.0f : sym_uniform(key, t * N + n) * mag;
    }
  }
  for (int64_t t = 0; t < p.T; ++t) p.sx.push_back(0.5f + 0.125f * static_cast<float>(t % 5));
  for (int64_t n = 0; n < N; ++n) p.sw.push_back(0.75f + 0.0625f * static_cast<float>(n % 7));
  return p;
}

// The small fixed G of the sampling tests: T = 8 tokens (B = 2 examples of S = 4), N = 24, one
// exact zero.
Problem fixed_problem() {
  Problem p = make_problem(2, 4, 24, 20240607u, false);
  p.g[2 * 24 + 5] = 0.0f;
  return p;
}

// G'[t,n] = (sx[t] * G[t,n]) * sw[n] in f32, in the quantizer's order (grad_quant.hpp).
float folded(const Problem& p, int64_t t, int64_t n) {
  return (p.sx[t] * p.g[t * p.N + n]) * p.sw[n];
}

// D = max |G'| / 127 in f32.
float step_of(const Problem& p) {
  float absmax = 0.0f;
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t n = 0; n < p.N; ++n) absmax = std::max(absmax, std::fabs(folded(p, t, n)));
  }
  return absmax / 127.0f;
}

// x = G'/D in f32, the value the quantizer rounds (T, N).
AlignedVector<float> scaled(const Problem& p, float D) {
  AlignedVector<float> x(static_cast<size_t>(p.T * p.N));
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t n = 0; n < p.N; ++n) x[t * p.N + n] = folded(p, t, n) / D;
  }
  return x;
}

// ulp of an f32 number in the binade of v (v >= 1).
double ulp32(double v) {
  int e = 0;
  std::frexp(v, &e);  // v = m 2^e, m in [0.5, 1): the binade [2^(e-1), 2^e) has ulp 2^(e-24)
  return std::ldexp(1.0, e - 24);
}

double clamp_code(double q) { return std::clamp(q, -127.0, 127.0); }

// The residual p = x - floor(x) (exact in double).
double residual(float x) { return static_cast<double>(x) - std::floor(static_cast<double>(x)); }

// E[Q] under a uniform 7-bit threshold, exactly: the mean over the 128 values
// r_k = threshold7_from_byte(2k) = (k + 0.5)/128 of the quantizer's f32 formula clamp(floor(x+r)).
double mean_code_7bit(float x) {
  double sum = 0.0;
  for (uint32_t k = 0; k < 128; ++k) {
    sum += clamp_code(std::floor(x + threshold7_from_byte(2 * k)));  // x + r rounds in f32
  }
  return sum / 128.0;
}

// The exact probability pt of rounding up under a uniform 7-bit threshold.
double up_probability_7bit(float x) {
  return mean_code_7bit(x) - std::floor(static_cast<double>(x));
}

Key draw_key(uint32_t seed, uint32_t draw) { return fold_in(key_from_seed(seed), draw); }

void quantize(QuantizedGrad& out, const Problem& p, GradRounding mode, Key key, bool stats) {
  GradQuantConfig config;
  config.mode = mode;
  config.tokens_per_example = p.S;
  config.layer_key = key;
  config.want_stats = stats;
  quantize_gradient(out, std::span<const float>(p.g), p.T, p.N, p.sx, p.sw, config);
}

// E = D*(Q - x) of element i of code tensor q: Q - x is exact in double, the product is
// rounded once (relative 2^-53).
double error_of(const QuantizedGrad& out, int q, const AlignedVector<float>& x, int64_t i) {
  return static_cast<double>(out.step) *
         (static_cast<double>(out.codes[q][i]) - static_cast<double>(x[i]));
}

// One element of a code tensor.
struct Element {
  int q;  // code tensor: 0 (dX), 1 (dW, sr only)
  int64_t t, n;
};

std::vector<Element> row_elements(int q, int64_t t, int64_t N) {
  std::vector<Element> row;
  for (int64_t n = 0; n < N; ++n) row.push_back({q, t, n});
  return row;
}

// E of `elements` over `draws` keys draw_key(seed, d); row d (of draws x elements) is draw d.
std::vector<double> sample_errors(const Problem& p, GradRounding mode, uint32_t seed, int draws,
                                  const std::vector<Element>& elements) {
  const AlignedVector<float> x = scaled(p, step_of(p));
  std::vector<double> s;
  s.reserve(static_cast<size_t>(draws) * elements.size());
  QuantizedGrad out;
  // One thread: the codes do not depend on it (SPEC 3), and thousands of tiny parallel regions
  // crawl when the cores are shared with other processes.
  testing::ScopedThreads one_thread(1);
  for (int d = 0; d < draws; ++d) {
    quantize(out, p, mode, draw_key(seed, static_cast<uint32_t>(d)), false);
    for (const Element& e : elements) s.push_back(error_of(out, e.q, x, e.t * p.N + e.n));
  }
  return s;
}


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

// ---------------------------------------------------------------------------------------------
// Statistics of one quantization: checks c, a and m against E recomputed from the codes, and
// the zero row and column sums of E - Estr.

// f32 error bounds of the statistics, in units of D (u = 2^-24). Each e = fl(Q - x) is off by
// at most u/2 (|Q - x| < 1).
// - c (token mean): the row sum of N values |e| < 1 is accumulated in f64 (reference) or in 16
//   f32 lanes of ceil(N/16) terms then a 4-level tree (AVX-512): error <= (ceil(N/16) + 3) u N;
//   with the e roundings (u N / 2), the f32 row sum (u N) is within (ceil(N/16) + 4.5) u N,
//   divided by N in f64 and rounded to f32 (u): (ceil(N/16) + 5.5) u < (ceil(N/16) + 6) u.
// - m (grand mean): the same f32 row sums added in f64, divided by S N, rounded: the same bound.
// - a (channel mean): per block of L = min(S, 32) tokens, L values added in f32:
//   (L - 1) u L + L u / 2; blocks added in f64, divided by S, rounded: (L + 0.5) u < (L + 2) u.
struct StatBounds {
  double c, a, m;
};

StatBounds stat_bounds(double D, int64_t S, int64_t N) {
  const double row = static_cast<double>((N + 15) / 16) + 6.0;
  const double col = static_cast<double>(std::min<int64_t>(S, 32)) + 2.0;
  return {D * row * kU32, D * col * kU32, D * row * kU32};
}

void check_error_stats(Checker& chk, const std::string& ctx, const Problem& p,
                       const QuantizedGrad& out, int q, const AlignedVector<float>& x) {
  const int64_t T = p.T, N = p.N, S = p.S, B = T / S;
  const ErrorStats& st = out.stats[q];
  if (st.token_mean.size() != static_cast<size_t>(T) ||
      st.channel_mean.size() != static_cast<size_t>(B * N) ||
      st.grand_mean.size() != static_cast<size_t>(B)) {
    chk.near(0.0, 1.0, 0.0, [&] {
      return str(ctx, " stats sizes (c, a, m) = (", st.token_mean.size(), ", ",
                 st.channel_mean.size(), ", ", st.grand_mean.size(), "), expected (", T, ", ",
                 B * N, ", ", B, ")");
    });
    return;
  }
  const double D = out.step;
  const StatBounds eps = stat_bounds(D, S, N);
  // The f64 sums of this test over at most S N terms of size <= D: S N u64 D each, 4 of them.
  const double fp64 = 4.0 * static_cast<double>(S * N) * kU64 * D;
  std::vector<double> e(static_cast<size_t>(T * N));
  for (int64_t i = 0; i < T * N; ++i) e[i] = error_of(out, q, x, i);
  for (int64_t b = 0; b < B; ++b) {
    double total = 0.0;
    for (int64_t s = 0; s < S; ++s) {
      double row = 0.0;
      for (int64_t n = 0; n < N; ++n) row += e[(b * S + s) * N + n];
      total += row;
      chk.near(row / N, st.token_mean[b * S + s], eps.c + fp64,
               [&] { return str(ctx, " c[t=", b * S + s, "]"); });
    }
    chk.near(total / (S * N), st.grand_mean[b], eps.m + fp64,
             [&] { return str(ctx, " m[b=", b, "]"); });
    for (int64_t n = 0; n < N; ++n) {
      double col = 0.0;
      for (int64_t s = 0; s < S; ++s) col += e[(b * S + s) * N + n];
      chk.near(col / S, st.channel_mean[b * N + n], eps.a + fp64,
               [&] { return str(ctx, " a[b=", b, ", n=", n, "]"); });
    }
    // Residual R = E - Estr, Estr[s,n] = a[n] + c[s] - m. Exactly, sum_n R[s,n] =
    // N (c_exact - c[s]) - sum_n (a_exact - a)[n] + N (m - m_exact), so |row sum| <=
    // N (eps_c + eps_a + eps_m); likewise |column sum| <= S (eps_c + eps_a + eps_m).
    const double eps_sum = eps.c + eps.a + eps.m;
    const double m = st.grand_mean[b];
    for (int64_t s = 0; s < S; ++s) {
      double sum = 0.0;
      for (int64_t n = 0; n < N; ++n) {
        sum += e[(b * S + s) * N + n] - st.channel_mean[b * N + n] - st.token_mean[b * S + s] + m;
      }
      chk.near(0.0, sum, N * eps_sum + fp64,
               [&] { return str(ctx, " row sum of E - Estr [b=", b, ", s=", s, "]"); });
    }
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0.0;
      for (int64_t s = 0; s < S; ++s) {
        sum += e[(b * S + s) * N + n] - st.channel_mean[b * N + n] - st.token_mean[b * S + s] + m;
      }
      chk.near(0.0, sum, S * eps_sum + fp64,
               [&] { return str(ctx, " column sum of E - Estr [b=", b, ", n=", n, "]"); });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 1. Unbiasedness (Lemma 1).

TEST(GradQuantStats, MeanOfDequantizedCodesConvergesToFoldedGradient) {
  const Problem p = fixed_problem();
  const float D = step_of(p);
  const AlignedVector<float> x = scaled(p, D);
  for (GradRounding mode : {GradRounding::kSr, GradRounding::kS3r, GradRounding::kS3rBcast}) {
    const int count = quantization_count(mode);
    std::vector<double> sum[2];
    for (int q = 0; q < count; ++q) sum[q].assign(x.size(), 0.0);
    QuantizedGrad out;
    // One thread: the codes do not depend on it (SPEC 3), and thousands of tiny parallel regions
    // crawl when the cores are shared with other processes.
    testing::ScopedThreads one_thread(1);
    for (int d = 0; d < kDraws; ++d) {
      quantize(out, p, mode, draw_key(1234, static_cast<uint32_t>(d)), false);
      ASSERT_EQ(out.step, D) << to_string(mode) << " draw " << d;
      ASSERT_EQ(out.count, count) << to_string(mode);
      for (int q = 0; q < count; ++q) {
        for (size_t i = 0; i < x.size(); ++i) sum[q][i] += static_cast<double>(D) * out.codes[q][i];
      }
    }
    Checker chk(str(to_string(mode), ", ", kDraws, " draws"));
    for (int q = 0; q < count; ++q) {
      for (int64_t t = 0; t < p.T; ++t) {
        for (int64_t n = 0; n < p.N; ++n) {
          const size_t i = static_cast<size_t>(t * p.N + n);
          const double xi = x[i];
          // f32 for every mode: x = fl(G'/D) is off by ulp(x)/2, and x + r rounds to f32,
          // moving the rounding-up event by at most ulp(|x| + 1)/2 in r; the 2^-23 grid of sr's
          // r adds at most 2^-23 twice (discretization of p, grid points at the boundary).
          const double delta = ulp32(std::fabs(xi) + 1.0) + 0x1p-22;
          // One draw of D*Q is D*floor(x) + D*U, U ~ Bernoulli(pe) with pe the exact 7-bit pt
          // (s3r*), or within delta of the residual p (sr): sd D sqrt(pe (1 - pe) (+ delta)),
          // |D*Q - mean| <= D. Standard error D sqrt(pe (1 - pe) / 4000) <= 0.0079 D.
          const bool sr = mode == GradRounding::kSr;
          const double pe = sr ? residual(x[i]) : up_probability_7bit(x[i]);
          const double sd = D * std::sqrt(pe * (1.0 - pe) + (sr ? delta : 0.0));
          // Bias allowed: D/256 for the 7-bit thresholds (SPEC 2; checked exactly by the next
          // test), and the f32 delta.
          const double bias = (sr ? 0.0 : D / 256.0) + D * delta;
          chk.near(folded(p, t, n), sum[q][i] / kDraws, bernstein_tolerance(sd, D, kDraws) + bias,
                   [&] {
                     return str("mean of D*Q[", q, "][t=", t, ", n=", n, "] (x = ", xi,
                                ", sd of one draw ", sd, ")");
                   });
        }
      }
    }
    EXPECT_EQ(chk.failures(), 0) << chk.summary();
    EXPECT_EQ(chk.checks(), count * p.T * p.N);
  }
}

TEST(GradQuantStats, RtneIsDeterministicRneAndBiased) {
  const Problem p = fixed_problem();
  const float D = step_of(p);
  const AlignedVector<float> x = scaled(p, D);
  QuantizedGrad a, b;
  quantize(a, p, GradRounding::kRtne, draw_key(1234, 0), false);
  quantize(b, p, GradRounding::kRtne, draw_key(1234, 1), false);
  ASSERT_EQ(a.count, 1);
  ASSERT_EQ(a.step, D);
  double max_bias = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const int expected = static_cast<int>(clamp_code(std::nearbyint(x[i])));  // rne: ties to even
    EXPECT_EQ(a.codes[0][i], expected) << "i = " << i << ", x = " << x[i];
    EXPECT_EQ(b.codes[0][i], a.codes[0][i]) << "other key, i = " << i;
    const int64_t t = static_cast<int64_t>(i) / p.N, n = static_cast<int64_t>(i) % p.N;
    max_bias =
        std::max(max_bias, std::fabs(static_cast<double>(D) * a.codes[0][i] - folded(p, t, n)));
  }
  // rtne's error is its bias (it never averages out). On this G some residual is near 1/2, far
  // outside the tolerance of the previous test (<= 5.48 * 0.5 D / sqrt(4000) + 30 D / 12000 +
  // D/256 + tiny < 0.05 D), so that test would catch a mode that rounded to nearest.
  EXPECT_GT(max_bias, 0.25 * D);
}

// ---------------------------------------------------------------------------------------------
// 2. The 7-bit bias bound D/256, exactly.

TEST(GradQuantStats, SevenBitThresholdBiasIsAtMostOneIn256) {
  // With u = 128 (1 - p), exactly: pt - p = (u - ceil(u - 1/2)) / 128, in (-1/256, 1/256].
  // In f32, fl(x + r) >= floor(x) + 1 can also hold when x + r is up to ulp(|x| + 1)/2 below the
  // integer (never the reverse: rounding is monotone and integers are representable), so the
  // upper side gains ulp(|x| + 1)/2 <= 2^-17.
  Checker chk("mean_k floor(x + r_k) - x");
  double grid_max = -1.0, grid_min = 1.0;
  auto check = [&](float x, bool on_grid) {
    const double bias = mean_code_7bit(x) - static_cast<double>(x);
    const double slack = bias > 0.0 ? ulp32(std::fabs(x) + 1.0) / 2.0 : 0.0;
    chk.near(0.0, bias, 1.0 / 256.0 + slack, [&] { return str("x = ", x); });
    if (on_grid) {
      grid_max = std::max(grid_max, bias);
      grid_min = std::min(grid_min, bias);
    }
  };
  constexpr int kPerUnit = 1024;  // grid spacing h = 2^-10
  for (int j = -127 * kPerUnit; j <= 127 * kPerUnit; ++j) {
    check(static_cast<float>(j) / kPerUnit, true);
  }
  for (uint64_t i = 0; i < 20000; ++i) check(sym_uniform(key_from_seed(5), i) * 127.0f, false);
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
  // Attained: x = 1/256 + n gives p = 1 - r_127 and x + r_127 = n + 1 exactly (grid values have
  // at most 17 significant bits, r_k 8 fractional bits: the f32 sums are exact).
  EXPECT_EQ(grid_max, 1.0 / 256.0);
  // The lower side is approached, not attained: p moves by h per grid step, so within h.
  EXPECT_LE(grid_min, -1.0 / 256.0 + 1.0 / kPerUnit);
  EXPECT_GT(grid_min, -1.0 / 256.0);
}

// ---------------------------------------------------------------------------------------------
// 3. Shared-threshold covariance (Lemma 2) and independent thresholds.

TEST(GradQuantStats, SharedTokenThresholdCovarianceMatchesLemma2) {
  const Problem p = fixed_problem();
  const double D = step_of(p);
  const AlignedVector<float> x = scaled(p, static_cast<float>(D));
  const int64_t N = p.N;
  // Token 0, token 1 (same Threefry word, next byte) and token 4 (next word, next example).
  std::vector<Element> elements;
  for (int64_t t : {0, 1, 4}) {
    const auto row = row_elements(0, t, N);
    elements.insert(elements.end(), row.begin(), row.end());
  }
  const size_t width = elements.size();
  const auto s = sample_errors(p, GradRounding::kS3r, 77, kDraws, elements);

  Checker chk(str("s3r, ", kDraws, " draws"));
  int detectable = 0;
  for (size_t i = 0; i < static_cast<size_t>(N); ++i) {
    for (size_t j = i; j < static_cast<size_t>(N); ++j) {
      const float xi = x[i], xj = x[j];
      const PairModel model = seven_bit_pair(xi, xj, true);
      const double expected = D * D * pair_moments(model).cov;  // D^2 (min(pt_i, pt_j) - pt_i pt_j)
      check_covariance(chk, s, width, i, j, "E[t=0]", "E[t=0]", model, D);
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
  for (size_t i = 0; i < static_cast<size_t>(N); ++i) {
    for (size_t j = 0; j < static_cast<size_t>(N); ++j) {
      check_covariance(chk, s, width, i, N + j, "E[t=0]", "E[t=1]",
                       seven_bit_pair(x[i], x[N + j], false), D);
      check_covariance(chk, s, width, i, 2 * N + j, "E[t=0]", "E[t=4]",
                       seven_bit_pair(x[i], x[4 * N + j], false), D);
    }
  }
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
  // The test has power: on many pairs, independent thresholds (covariance 0) would fail.
  EXPECT_GE(detectable, N) << "pairs whose Lemma 2 covariance exceeds the tolerance of 0";
}

TEST(GradQuantStats, SharedExampleThresholdCovarianceMatchesLemma2) {
  const Problem p = fixed_problem();  // S = 4: tokens 0 and 1 share a threshold, 0 and 4 do not
  const double D = step_of(p);
  const AlignedVector<float> x = scaled(p, static_cast<float>(D));
  const int64_t N = p.N;
  std::vector<Element> elements;
  for (int64_t t : {0, 1, 4}) {
    const auto row = row_elements(0, t, N);
    elements.insert(elements.end(), row.begin(), row.end());
  }
  const size_t width = elements.size();
  const auto s = sample_errors(p, GradRounding::kS3rBcast, 78, kDraws, elements);
  Checker chk(str("s3r-bcast, ", kDraws, " draws"));
  for (size_t i = 0; i < static_cast<size_t>(N); ++i) {
    for (size_t j = 0; j < static_cast<size_t>(N); ++j) {
      check_covariance(chk, s, width, i, N + j, "E[t=0]", "E[t=1]",
                       seven_bit_pair(x[i], x[N + j], true), D);
      check_covariance(chk, s, width, i, 2 * N + j, "E[t=0]", "E[t=4]",
                       seven_bit_pair(x[i], x[4 * N + j], false), D);
    }
  }
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
// 4. Centering (Theorem 1).

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

// ---------------------------------------------------------------------------------------------
// 5. E - Estr sums to zero along every row and column of every example.

TEST(GradQuantStats, StructuredResidualHasZeroRowAndColumnSums) {
  constexpr int64_t kB = 5;
  Checker chk("E - Estr");
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped_isa(isa);
    for (int threads : {1, 2}) {
      testing::ScopedThreads scoped_threads(threads);
      for (GradRounding mode : {GradRounding::kS3r, GradRounding::kS3rBcast, GradRounding::kSr,
                                GradRounding::kRtne}) {
        // S = 37 > 32 splits each example over two blocks of tokens.
        for (int64_t S : {1, 3, 8, 37}) {
          for (int64_t N : {17, 65}) {
            const uint32_t id = static_cast<uint32_t>(S * 1000 + N);
            const Problem p = make_problem(kB, S, N, id, true);
            QuantizedGrad out;
            quantize(out, p, mode, draw_key(99, id), true);
            const float D = step_of(p);
            const std::string ctx = str(isa_name(isa), ", ", threads, " threads, ",
                                        to_string(mode), ", B = ", kB, ", S = ", S, ", N = ", N);
            chk.near(D, out.step, 0.0, [&] { return ctx + ": step D"; });
            const AlignedVector<float> x = scaled(p, D);
            for (int q = 0; q < quantization_count(mode); ++q) {
              check_error_stats(chk, str(ctx, ", quantization ", q), p, out, q, x);
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
  EXPECT_GT(chk.checks(), 0);
}

}  // namespace
}  // namespace s3r
