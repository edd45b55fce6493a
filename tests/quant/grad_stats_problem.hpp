#pragma once
// Test library of the backward quantizer's statistical tests (grad_quant_stats_test.cpp,
// grad_quant_covariance_test.cpp): small gradients G with their forward scales, the quantizer's
// own f32 arithmetic recomputed (G' = sx G sw, D, x = G'/D), the exact 7-bit rounding
// probabilities, sampled rounding errors over keys, and the f32 error bounds of the S3R-EC
// statistics.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/quant/grad_quant.hpp"
#include "s3r/quant/thresholds.hpp"
#include "s3r/rng/threefry.hpp"
#include "test_util.hpp"

namespace s3r::grad_stats {

inline constexpr int kDraws = 4000;  // keys per statistical test (SE of a mean <= 0.5 D / 63)

// Problems and the quantizer's own f32 arithmetic, recomputed.

// G (T, N) row-major, the forward scales sx (T) and sw (N), S tokens per example.
struct Problem {
  int64_t T = 0, N = 0, S = 0;
  AlignedVector<float> g, sx, sw;
};

inline float sym_uniform(Key key, uint64_t i) {
  return uniform23(random_bits32(key, i)) * 2.0f - 1.0f;
}

// Both signs, magnitudes over several binades (channel n scaled by 4^-(n % 5)), scales that are
// not all 1; with zero_row, token rows t % 7 == 3 are exactly 0.
inline Problem make_problem(int64_t B, int64_t S, int64_t N, uint32_t seed, bool zero_row) {
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
inline Problem fixed_problem() {
  Problem p = make_problem(2, 4, 24, 20240607u, false);
  p.g[2 * 24 + 5] = 0.0f;
  return p;
}

// G'[t,n] = (sx[t] * G[t,n]) * sw[n] in f32, in the quantizer's order (grad_quant.hpp).
inline float folded(const Problem& p, int64_t t, int64_t n) {
  return (p.sx[t] * p.g[t * p.N + n]) * p.sw[n];
}

// D = max |G'| / 127 in f32.
inline float step_of(const Problem& p) {
  float absmax = 0.0f;
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t n = 0; n < p.N; ++n) absmax = std::max(absmax, std::fabs(folded(p, t, n)));
  }
  return absmax / 127.0f;
}

// x = G'/D in f32, the value the quantizer rounds (T, N).
inline AlignedVector<float> scaled(const Problem& p, float D) {
  AlignedVector<float> x(static_cast<size_t>(p.T * p.N));
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t n = 0; n < p.N; ++n) x[t * p.N + n] = folded(p, t, n) / D;
  }
  return x;
}

// ulp of an f32 number in the binade of v (v >= 1).
inline double ulp32(double v) {
  int e = 0;
  std::frexp(v, &e);  // v = m 2^e, m in [0.5, 1): the binade [2^(e-1), 2^e) has ulp 2^(e-24)
  return std::ldexp(1.0, e - 24);
}

inline double clamp_code(double q) { return std::clamp(q, -127.0, 127.0); }

// The residual p = x - floor(x) (exact in double).
inline double residual(float x) {
  return static_cast<double>(x) - std::floor(static_cast<double>(x));
}

// E[Q] under a uniform 7-bit threshold, exactly: the mean over the 128 values
// r_k = threshold7_from_byte(2k) = (k + 0.5)/128 of the quantizer's f32 formula clamp(floor(x+r)).
inline double mean_code_7bit(float x) {
  double sum = 0.0;
  for (uint32_t k = 0; k < 128; ++k) {
    sum += clamp_code(std::floor(x + threshold7_from_byte(2 * k)));  // x + r rounds in f32
  }
  return sum / 128.0;
}

// The exact probability pt of rounding up under a uniform 7-bit threshold.
inline double up_probability_7bit(float x) {
  return mean_code_7bit(x) - std::floor(static_cast<double>(x));
}

inline Key draw_key(uint32_t seed, uint32_t draw) { return fold_in(key_from_seed(seed), draw); }

inline void quantize(QuantizedGrad& out, const Problem& p, GradRounding mode, Key key, bool stats) {
  GradQuantConfig config;
  config.mode = mode;
  config.tokens_per_example = p.S;
  config.layer_key = key;
  config.want_stats = stats;
  quantize_gradient(out, std::span<const float>(p.g), p.T, p.N, p.sx, p.sw, config);
}

// E = D*(Q - x) of element i of code tensor q: Q - x is exact in double, the product is
// rounded once (relative 2^-53).
inline double error_of(const QuantizedGrad& out, int q, const AlignedVector<float>& x, int64_t i) {
  return static_cast<double>(out.step) *
         (static_cast<double>(out.codes[q][i]) - static_cast<double>(x[i]));
}

// One element of a code tensor.
struct Element {
  int q;  // code tensor: 0 (dX), 1 (dW, sr only)
  int64_t t, n;
};

inline std::vector<Element> row_elements(int q, int64_t t, int64_t N) {
  std::vector<Element> row;
  for (int64_t n = 0; n < N; ++n) row.push_back({q, t, n});
  return row;
}

// E of `elements` over `draws` keys draw_key(seed, d); row d (of draws x elements) is draw d.
inline std::vector<double> sample_errors(const Problem& p, GradRounding mode, uint32_t seed,
                                         int draws, const std::vector<Element>& elements) {
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

inline StatBounds stat_bounds(double D, int64_t S, int64_t N) {
  const double row = static_cast<double>((N + 15) / 16) + 6.0;
  const double col = static_cast<double>(std::min<int64_t>(S, 32)) + 2.0;
  return {D * row * testing::kU32, D * col * testing::kU32, D * row * testing::kU32};
}

}  // namespace s3r::grad_stats
