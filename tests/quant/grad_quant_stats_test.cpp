// Statistical properties of the backward quantizer (SPEC section 5, properties 1 and 3, and the
// S3R-EC statistics of section 4): unbiasedness over keys (Lemma 1), the exact 7-bit bias bound,
// and the zero row and column sums of E - Estr. The shared-threshold covariance (Lemma 2) and
// centering (Theorem 1): grad_quant_covariance_test.cpp; the problems and the quantizer's f32
// arithmetic both use: grad_stats_problem.hpp. Seeds are fixed; every tolerance is derived (from
// the sample size, or from an f32 rounding-error bound) in a comment beside it.
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
#include "quant/grad_stats_problem.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/isa.hpp"
#include "s3r/quant/grad_quant.hpp"
#include "s3r/quant/thresholds.hpp"
#include "s3r/rng/threefry.hpp"
#include "test_util.hpp"

namespace s3r {
namespace {

using namespace grad_stats;  // the problems and the quantizer's f32 arithmetic
using testing::bernstein_tolerance;
using testing::Checker;
using testing::kBernsteinL;
using testing::kU32;
using testing::kU64;
using testing::str;

// ---------------------------------------------------------------------------------------------
// Statistics of one quantization: checks c, a and m against E recomputed from the codes, and
// the zero row and column sums of E - Estr.

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
// 3. E - Estr sums to zero along every row and column of every example.

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