// Tests of s3r::nn QuantLinear (SPEC sections 1-4, and properties 1 and 4 of section 5).
//
// (a) QuantLinearReference: every mode and correction against an independent double-precision
//     implementation of SPEC 1-4 written here. The bit-defined steps (scales and codes of X, W
//     and G', thresholds from the keys) are recomputed with the layer's f32 operations and
//     compared bit for bit; everything after them (int32 products, scales, the S3R-EC statistics,
//     Estr passed explicitly through both products) is done in double, and Y, dX, dW are compared
//     with tolerances derived from the f32 operations of the layer.
// (b) QuantLinearStats.MeanGradientIsUnbiased: over keys, dX and dW average to the unquantized
//     backward of the same forward operands, with exact variances of the threshold distributions.
// (c) QuantLinearResidual: the error reaching dX and dW is R Wq^T / sx and Xq^T R / sw with
//     R = E - Estr (E without correction), and R sums to zero along rows and columns.
// (d) QuantLinearStats.VarianceStory: on a layer whose weight rows share a common component, the
//     measured dX and dW errors of sr, s3r, s3r-bcast and the corrections, against exact
//     expectations and against each other.
//
// Notation: u = 2^-24 (f32 unit roundoff), gamma_n = n u / (1 - n u); a value computed by a
// sequence of operations in which every term passes through at most n f32 roundings is within
// gamma_n * (the same expression with every term replaced by its absolute value) of the exact one
// (Higham, Accuracy and Stability of Numerical Algorithms, section 3.1).
#include "s3r/nn/quant_linear.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iomanip>
#include <iterator>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "s3r/core/bf16.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/isa.hpp"
#include "s3r/nn/linear_mode.hpp"
#include "s3r/quant/grad_quant.hpp"
#include "s3r/rng/threefry.hpp"
#include "check_util.hpp"
#include "test_util.hpp"

namespace s3r::nn {
namespace {

using testing::bernstein_tolerance;
using testing::Checker;
using testing::kBernsteinL;
using testing::kU32;
using testing::kU64;
using testing::str;

double gamma32(double n) { return n * kU32 / (1.0 - n * kU32); }

constexpr LinearMode kAllModes[] = {LinearMode::kF32, LinearMode::kBf16, LinearMode::kRtne,
                                    LinearMode::kSr,  LinearMode::kS3r,  LinearMode::kS3rBcast};
constexpr LinearMode kInt8Modes[] = {LinearMode::kRtne, LinearMode::kSr, LinearMode::kS3r,
                                     LinearMode::kS3rBcast};
constexpr LinearMode kStochasticModes[] = {LinearMode::kSr, LinearMode::kS3r,
                                           LinearMode::kS3rBcast};
constexpr Correction kAllCorrections[] = {Correction::kNone, Correction::kDx, Correction::kTwoWay};


// ---------------------------------------------------------------------------------------------
// Problems.

// One layer's inputs: X (T, K), W (K, N), G (T, N), row-major; S tokens per example.
struct Problem {
  int64_t T = 0, K = 0, N = 0, S = 0;
  std::vector<float> x, w, g;
  int64_t B() const { return T / S; }
  std::string shape() const { return str("T=", T, " K=", K, " N=", N, " S=", S); }
};

float sym_uniform(Key key, uint64_t i) {
  return static_cast<float>(random_bits32(key, i) >> 9) * 0x1p-23f * 2.0f - 1.0f;
}

// Magnitudes over several binades, both signs; X row 5 and W column 3 are exactly zero (scale 1,
// codes 0), and with zero_g G is all zero (D == 0).
Problem make_problem(int64_t T, int64_t K, int64_t N, int64_t S, uint32_t seed, bool zero_g) {
  Problem p{T, K, N, S, {}, {}, {}};
  const Key kx = fold_in(key_from_seed(seed), 1), kw = fold_in(key_from_seed(seed), 2),
            kg = fold_in(key_from_seed(seed), 3);
  p.x.resize(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      // sx = absmax/127 of order 1, like the zero row's scale 1: no token dominates D.
      const float mag = std::ldexp(1.0f, -static_cast<int>(t % 4)) * 100.0f;
      p.x[t * K + k] = t == 5 ? 0.0f : sym_uniform(kx, t * K + k) * mag;
    }
  }
  p.w.resize(static_cast<size_t>(K * N));
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) {
      const float mag = 0.05f * static_cast<float>(1 + n % 3);
      p.w[k * N + n] = n == 3 ? 0.0f : sym_uniform(kw, k * N + n) * mag;
    }
  }
  p.g.resize(static_cast<size_t>(T * N));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      const float mag = std::ldexp(1.0f, -2 * static_cast<int>(n % 5));
      p.g[t * N + n] = zero_g ? 0.0f : sym_uniform(kg, t * N + n) * mag;
    }
  }
  return p;
}

Key make_layer_key(uint32_t seed, uint32_t step, uint32_t layer) {
  return fold_in(fold_in(key_from_seed(seed), step), layer);
}

// ---------------------------------------------------------------------------------------------
// The bit-defined steps, recomputed with the layer's f32 operations (docs/SPEC.md sections 1-3 and its appendix).

// Forward operands (SPEC 1).
struct Operands {
  std::vector<int8_t> xq, wq;   // (T, K), (K, N)
  std::vector<float> sx, sw;    // (T), (N)
  std::vector<int64_t> rowsum;  // (K) sum_n Wq[k, n]
};

// absmax / 127 in f32; an all-zero row or column gets scale 1 (its codes are then 0).
float absmax_scale(float absmax) {
  const float s = absmax / 127.0f;
  return s > 0.0f ? s : 1.0f;
}

// rne(v) clamped to [-127, 127]; std::nearbyint rounds to nearest even in the default mode.
int8_t rne_code(float v) {
  return static_cast<int8_t>(std::clamp(std::nearbyint(v), -127.0f, 127.0f));
}

Operands forward_operands(const Problem& p) {
  const int64_t T = p.T, K = p.K, N = p.N;
  Operands o;
  o.xq.resize(static_cast<size_t>(T * K));
  o.sx.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    float absmax = 0.0f;
    for (int64_t k = 0; k < K; ++k) absmax = std::max(absmax, std::fabs(p.x[t * K + k]));
    o.sx[t] = absmax_scale(absmax);
    for (int64_t k = 0; k < K; ++k) o.xq[t * K + k] = rne_code(p.x[t * K + k] / o.sx[t]);
  }
  o.wq.resize(static_cast<size_t>(K * N));
  o.sw.resize(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    float absmax = 0.0f;
    for (int64_t k = 0; k < K; ++k) absmax = std::max(absmax, std::fabs(p.w[k * N + n]));
    o.sw[n] = absmax_scale(absmax);
    for (int64_t k = 0; k < K; ++k) o.wq[k * N + n] = rne_code(p.w[k * N + n] / o.sw[n]);
  }
  o.rowsum.assign(static_cast<size_t>(K), 0);
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) o.rowsum[k] += o.wq[k * N + n];
  }
  return o;
}

// Thresholds (SPEC 2): sr's 23-bit uniform of word i; the 7-bit threshold i = byte i % 4 of
// word i / 4, r = (k + 0.5) / 128 with k the byte's top 7 bits.
float threshold_sr(Key key, uint64_t i) {
  return static_cast<float>(random_bits32(key, i) >> 9) * 0x1p-23f;
}
float threshold_7bit_of_index(uint32_t k) { return (static_cast<float>(k) + 0.5f) / 128.0f; }
float threshold_7bit(Key key, uint64_t i) {
  const uint32_t byte = (random_bits32(key, i / 4) >> (8 * (i % 4))) & 0xFFu;
  return threshold_7bit_of_index(byte >> 1);
}

// Q = floor(x + r): one f32 addition, floor, clamp to [-127, 127].
int8_t floor_code(float x, float r) {
  const float sum = x + r;
  return static_cast<int8_t>(std::clamp(std::floor(sum), -127.0f, 127.0f));
}

// The backward quantization (SPEC 1-3): G' = (sx G) sw in f32, D = max|G'| / 127, x = G' / D.
struct GradCodes {
  float D = 0.0f;
  std::vector<float> xs;     // (T, N) x = G'/D in f32; 0 when D == 0
  int count = 1;             // 2 under sr
  std::vector<int8_t> q[2];  // (T, N) codes for dX ([0]) and for dW ([count - 1])
};

GradCodes grad_codes(const Problem& p, const Operands& o, LinearMode mode, Key layer_key) {
  const int64_t T = p.T, N = p.N;
  GradCodes c;
  std::vector<float> gp(static_cast<size_t>(T * N));
  float absmax = 0.0f;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      gp[t * N + n] = (o.sx[t] * p.g[t * N + n]) * o.sw[n];
      absmax = std::max(absmax, std::fabs(gp[t * N + n]));
    }
  }
  c.D = absmax / 127.0f;
  c.count = mode == LinearMode::kSr ? 2 : 1;
  c.xs.assign(gp.size(), 0.0f);
  for (int q = 0; q < c.count; ++q) c.q[q].assign(gp.size(), 0);
  if (c.D == 0.0f) return c;  // SPEC 1: every gradient is exactly 0, no division
  const Key keys[2] = {fold_in(layer_key, 0), fold_in(layer_key, 1)};
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t i = t * N + n;
      const float x = gp[i] / c.D;
      c.xs[i] = x;
      for (int q = 0; q < c.count; ++q) {
        switch (mode) {
          case LinearMode::kRtne:
            c.q[q][i] = rne_code(x);
            break;
          case LinearMode::kSr:
            c.q[q][i] = floor_code(x, threshold_sr(keys[q], i));
            break;
          case LinearMode::kS3r:
            c.q[q][i] = floor_code(x, threshold_7bit(keys[0], t));
            break;
          case LinearMode::kS3rBcast:
            c.q[q][i] = floor_code(x, threshold_7bit(keys[0], t / p.S));
            break;
          default:
            break;
        }
      }
    }
  }
  return c;
}

// ---------------------------------------------------------------------------------------------
// The double-precision reference of SPEC 1-4 and the f32 error bounds of the layer.

// G'[t,n] = sx[t] G[t,n] sw[n] in double (one rounding, relative 2^-53).
std::vector<double> exact_folded(const Problem& p, const Operands& o) {
  std::vector<double> gp(static_cast<size_t>(p.T * p.N));
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t n = 0; n < p.N; ++n) {
      gp[t * p.N + n] = static_cast<double>(o.sx[t]) * p.g[t * p.N + n] * o.sw[n];
    }
  }
  return gp;
}

// E = D*Q - G' and its S3R-EC statistics (SPEC 4), in double.
struct ErrorStatsD {
  std::vector<double> e;  // (T, N)
  std::vector<double> c;  // (T)    token means
  std::vector<double> a;  // (B, N) channel means
  std::vector<double> m;  // (B)    grand means
};

ErrorStatsD error_stats(const Problem& p, const std::vector<double>& gp,
                        const std::vector<int8_t>& q, double D) {
  const int64_t T = p.T, N = p.N, S = p.S, B = p.B();
  ErrorStatsD st;
  st.e.resize(static_cast<size_t>(T * N));
  for (int64_t i = 0; i < T * N; ++i) st.e[i] = D * q[i] - gp[i];
  st.c.assign(static_cast<size_t>(T), 0.0);
  st.a.assign(static_cast<size_t>(B * N), 0.0);
  st.m.assign(static_cast<size_t>(B), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      st.c[t] += st.e[t * N + n];
      st.a[(t / S) * N + n] += st.e[t * N + n];
    }
    st.m[t / S] += st.c[t];
    st.c[t] /= static_cast<double>(N);
  }
  for (double& v : st.a) v /= static_cast<double>(S);
  for (double& v : st.m) v /= static_cast<double>(S * N);
  return st;
}

double estr(const ErrorStatsD& st, int64_t t, int64_t n, int64_t S, int64_t N) {
  const int64_t b = t / S;
  return st.a[b * N + n] + st.c[t] - st.m[b];
}

// Bounds on |statistic of the layer - exact statistic of E = D*Q - G'| (SPEC 4).
// - The layer forms E as D * fl(Q - x) with x = fl(G'f / D), G'f = fl(fl(sx G) sw): G'f is
//   within (2u + u^2)|G'| of G', and D x within u |G'f| <= u (1 + 3u)|G'| of G'f, so each
//   element of its E is within 3.01 u |G'| of the exact one; a mean of such elements, within
//   3.01 u times the mean of |G'|.
// - The rest is the rounding of the statistics themselves, bounded in units of D by
//   tests/quant/grad_quant_stats_test.cpp (stat_bounds): (ceil(N/16) + 6) u for c and m (16-lane
//   f32 row sums), (min(S, 32) + 2) u for a (f32 block column sums).
struct StatEps {
  std::vector<double> c, a, m;  // (T), (B, N), (B)
};

StatEps stat_eps(const Problem& p, const std::vector<double>& gp, double D) {
  const int64_t T = p.T, N = p.N, S = p.S, B = p.B();
  const double row = (static_cast<double>((N + 15) / 16) + 6.0) * kU32 * D;
  const double col = (static_cast<double>(std::min<int64_t>(S, 32)) + 2.0) * kU32 * D;
  StatEps eps;
  eps.c.assign(static_cast<size_t>(T), 0.0);
  eps.a.assign(static_cast<size_t>(B * N), 0.0);
  eps.m.assign(static_cast<size_t>(B), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      const double v = 3.01 * kU32 * std::fabs(gp[t * N + n]);
      eps.c[t] += v / N;
      eps.a[(t / S) * N + n] += v / S;
      eps.m[t / S] += v / (S * N);
    }
  }
  for (double& v : eps.c) v += row;
  for (double& v : eps.a) v += col;
  for (double& v : eps.m) v += row;
  return eps;
}

// Magnitudes that the f32 error bounds of one int8 backward pass need (bounds, not values).
struct Magnitudes {
  double D = 0.0;
  std::vector<double> q;       // (T, N) |Q|
  std::vector<double> a;       // (B, N) |a| of the layer: |a_exact| + eps_a
  std::vector<double> cm;      // (T)    |c - m| of the layer: |c - m|_exact + eps_c + eps_m
  std::vector<double> eps_a;   // (B, N)
  std::vector<double> eps_cm;  // (T) eps_c + eps_m
};

Magnitudes magnitudes(const Problem& p, const std::vector<int8_t>& q, const ErrorStatsD& st,
                      const StatEps& eps, double D) {
  const int64_t T = p.T, S = p.S;
  Magnitudes mg;
  mg.D = D;
  for (int8_t v : q) mg.q.push_back(std::abs(static_cast<double>(v)));
  for (size_t i = 0; i < st.a.size(); ++i) mg.a.push_back(std::fabs(st.a[i]) + eps.a[i]);
  mg.eps_a = eps.a;
  for (int64_t t = 0; t < T; ++t) {
    mg.eps_cm.push_back(eps.c[t] + eps.m[t / S]);
    mg.cm.push_back(std::fabs(st.c[t] - st.m[t / S]) + mg.eps_cm.back());
  }
  return mg;
}

// A bound valid for every draw: |Q| <= |x| + 1, |E| <= D(1 + 4u) so |a| <= D(1 + 4u) and
// |c - m| <= 2 D (1 + 4u).
Magnitudes worst_magnitudes(const Problem& p, const GradCodes& gc, const StatEps& eps) {
  const int64_t T = p.T, S = p.S;
  Magnitudes mg;
  mg.D = gc.D;
  const double e_max = gc.D * (1.0 + 4.0 * kU32);
  for (float x : gc.xs) mg.q.push_back(std::fabs(static_cast<double>(x)) + 1.0);
  for (double v : eps.a) mg.a.push_back(e_max + v);
  mg.eps_a = eps.a;
  for (int64_t t = 0; t < T; ++t) {
    mg.eps_cm.push_back(eps.c[t] + eps.m[t / S]);
    mg.cm.push_back(2.0 * e_max + mg.eps_cm.back());
  }
  return mg;
}

// Rounding depths of the int8 backward (quant_linear.cpp, kernels/*/linear_*.cpp):
// dX, main term: fl(1/sx), fl(D inv), fl(acc scale) (acc exact in f32: |acc| <= 127^2 N < 2^24),
//   fl(v - corr), fl(old + v): 5. Correction: wa = Wq a_b summed in 16 f32 lanes with FMA
//   (ceil(N/16) roundings per lane, a 4-level tree; the reference kernel: double then one
//   rounding), then fl(wa + delta rowsum), fl(. inv) with fl(1/sx), fl(v - .), fl(old + .):
//   ceil(N/16) + 9. delta = fl(c - m), fl(delta rowsum) (rowsum exact), then the same 5: 7.
int64_t dx_depth(int64_t N) { return (N + 15) / 16 + 9; }
// dW, main term: fl(D/sw), fl(acc col_scale) (|acc| <= 127^2 T < 2^24), the correction's sum
//   post-op: 3. Correction: U^T A in f32 with A = fl(-a/sw) and fl(-1/sw); the a path:
//   fl(-a/sw), product, B additions, post-op: B + 3; the v path: v[k] = sum_t fl(xq fl(c - m))
//   recursively in f32 (first addition to 0 exact): T + 1, then fl(-1/sw), product, B additions,
//   post-op: T + B + 4.
int64_t dw_depth(int64_t T, int64_t B) { return T + B + 4; }
// The test's own double arithmetic: at most T + N + K + 10 roundings of relative 2^-53 on any
// term of a reference value (products and sums of at most T, N or K terms, a few scalings).
double ref_slack(const Problem& p, double abs_value) {
  return static_cast<double>(p.T + p.N + p.K + 10) * kU64 * abs_value;
}

// f32 error bound of dX[t, k] (int8 mode): gamma_L (|D acc| + |correction|)/sx + gamma_L |old|
// + the statistics' error propagated through the correction.
double dx_tolerance(const Problem& p, const Operands& o, const Magnitudes& mg, int64_t t, int64_t k,
                    bool correct, double old_abs) {
  const int64_t N = p.N, S = p.S;
  double main = 0.0, corr = 0.0, stat = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const double w = std::abs(static_cast<double>(o.wq[k * N + n]));
    main += mg.D * mg.q[t * N + n] * w;
    if (correct) {
      corr += w * mg.a[(t / S) * N + n];
      stat += w * mg.eps_a[(t / S) * N + n];
    }
  }
  if (correct) {
    const double rs = std::abs(static_cast<double>(o.rowsum[k]));
    corr += mg.cm[t] * rs;
    stat += mg.eps_cm[t] * rs;
  }
  const double g = gamma32(static_cast<double>(dx_depth(N)));
  // old + v is exact when v is exactly 0 (G == 0: dX must stay unchanged, bit for bit).
  const double abs_value = (main + corr) / o.sx[t] + (main + corr > 0.0 ? old_abs : 0.0);
  return g * abs_value + (1.0 + g) * stat / o.sx[t] + ref_slack(p, abs_value);
}

// f32 error bound of dW[k, n] (int8 mode), likewise; u_b[k] = sum_{s in b} Xq[s, k].
double dw_tolerance(const Problem& p, const Operands& o, const Magnitudes& mg, int64_t k, int64_t n,
                    bool correct) {
  const int64_t T = p.T, K = p.K, N = p.N, S = p.S, B = p.B();
  double main = 0.0, corr = 0.0, stat = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    const double xv = std::abs(static_cast<double>(o.xq[t * K + k]));
    main += mg.D * xv * mg.q[t * N + n];
    if (correct) {
      corr += xv * mg.cm[t];
      stat += xv * mg.eps_cm[t];
    }
  }
  if (correct) {
    for (int64_t b = 0; b < B; ++b) {
      double u = 0.0;
      for (int64_t s = b * S; s < (b + 1) * S; ++s) u += o.xq[s * K + k];
      corr += std::fabs(u) * mg.a[b * N + n];
      stat += std::fabs(u) * mg.eps_a[b * N + n];
    }
  }
  const double g = gamma32(static_cast<double>(dw_depth(T, B)));
  const double abs_value = (main + corr) / o.sw[n];
  return g * abs_value + (1.0 + g) * stat / o.sw[n] + ref_slack(p, abs_value);
}

// Expected values of one output tensor and their tolerances.
struct Expected {
  std::vector<double> value, tol;
};

// Y (T, N) of every mode. int8: sx sw sum_k Xq Wq; the layer computes fl(sx fl(sw acc)) (acc
// exact in f32 for 127^2 K < 2^24): 2 roundings of a product, gamma_2 |Y|. f32 and bf16: sum_k
// X W of the (bf16-rounded) operands, f32 accumulation of K terms (bf16 products are exact):
// gamma_K sum_k |X W|.
Expected expected_forward(const Problem& p, LinearMode mode, const Operands& o) {
  const int64_t T = p.T, K = p.K, N = p.N;
  Expected y;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0.0, abs_sum = 0.0;
      if (is_int8(mode)) {
        int64_t acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += int64_t{o.xq[t * K + k]} * o.wq[k * N + n];
        sum = static_cast<double>(o.sx[t]) * o.sw[n] * static_cast<double>(acc);
        abs_sum = std::fabs(sum);
        y.tol.push_back(gamma32(2.0) * abs_sum + ref_slack(p, abs_sum));
      } else {
        for (int64_t k = 0; k < K; ++k) {
          float a = p.x[t * K + k], b = p.w[k * N + n];
          if (mode == LinearMode::kBf16) a = to_float(to_bf16(a)), b = to_float(to_bf16(b));
          sum += static_cast<double>(a) * b;
          abs_sum += std::fabs(static_cast<double>(a) * b);
        }
        y.tol.push_back(gamma32(static_cast<double>(K)) * abs_sum + ref_slack(p, abs_sum));
      }
      y.value.push_back(sum);
    }
  }
  return y;
}

struct ExpectedBackward {
  Expected dx, dw;
};

// Float modes: dX = G W^T (+ old), dW = X^T G of the (bf16-rounded) operands; f32 accumulation
// of N (dX, plus the accumulation into old: N + 1) and T (dW) terms with exact bf16 products.
ExpectedBackward expected_backward_float(const Problem& p, LinearMode mode,
                                         const std::vector<float>& dx_old) {
  const int64_t T = p.T, K = p.K, N = p.N;
  auto rounded = [&](float v) { return mode == LinearMode::kBf16 ? to_float(to_bf16(v)) : v; };
  ExpectedBackward r;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const double old = dx_old.empty() ? 0.0 : dx_old[t * K + k];
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t n = 0; n < N; ++n) {
        const double v = static_cast<double>(rounded(p.g[t * N + n])) * rounded(p.w[k * N + n]);
        sum += v;
        abs_sum += std::fabs(v);
      }
      if (abs_sum > 0.0) abs_sum += std::fabs(old);  // adding an exact 0 is exact
      r.dx.value.push_back(old + sum);
      r.dx.tol.push_back(gamma32(static_cast<double>(N + 1)) * abs_sum + ref_slack(p, abs_sum));
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t t = 0; t < T; ++t) {
        const double v = static_cast<double>(rounded(p.x[t * K + k])) * rounded(p.g[t * N + n]);
        sum += v;
        abs_sum += std::fabs(v);
      }
      r.dw.value.push_back(sum);
      r.dw.tol.push_back(gamma32(static_cast<double>(T)) * abs_sum + ref_slack(p, abs_sum));
    }
  }
  return r;
}

// Int8 modes (SPEC 1, 2, 4), with the codes of the test: dX (T, K) from the dX codes,
//   dX[t,k] = old + (1/sx[t]) sum_n (D Q[t,n] - [correct_dx] Estr[t,n]) Wq[k,n]
// and dW (K, N) from the dW codes (sr: the second quantization),
//   dW[k,n] = (1/sw[n]) sum_t Xq[t,k] (D Q[t,n] - [two-way] Estr[t,n])
// with Estr formed explicitly from c, a, m of E = D*Q - G' (double).
ExpectedBackward expected_backward_int8(const Problem& p, const Operands& o, const GradCodes& gc,
                                        Correction correction, const std::vector<float>& dx_old) {
  const int64_t T = p.T, K = p.K, N = p.N, S = p.S;
  const double D = gc.D;
  const std::vector<double> gp = exact_folded(p, o);
  const StatEps eps = stat_eps(p, gp, D);
  ExpectedBackward r;
  {
    const std::vector<int8_t>& q = gc.q[0];
    const ErrorStatsD st = error_stats(p, gp, q, D);
    const Magnitudes mg = magnitudes(p, q, st, eps, D);
    const bool correct = correction != Correction::kNone;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const double old = dx_old.empty() ? 0.0 : dx_old[t * K + k];
        int64_t acc = 0;
        double corr = 0.0;
        for (int64_t n = 0; n < N; ++n) {
          acc += int64_t{q[t * N + n]} * o.wq[k * N + n];
          if (correct) corr += estr(st, t, n, S, N) * o.wq[k * N + n];
        }
        r.dx.value.push_back(old + (D * static_cast<double>(acc) - corr) / o.sx[t]);
        r.dx.tol.push_back(dx_tolerance(p, o, mg, t, k, correct, std::fabs(old)));
      }
    }
  }
  {
    const std::vector<int8_t>& q = gc.q[gc.count - 1];
    const ErrorStatsD st = error_stats(p, gp, q, D);
    const Magnitudes mg = magnitudes(p, q, st, eps, D);
    const bool correct = correction == Correction::kTwoWay;
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t n = 0; n < N; ++n) {
        int64_t acc = 0;
        double corr = 0.0;
        for (int64_t t = 0; t < T; ++t) {
          acc += int64_t{o.xq[t * K + k]} * q[t * N + n];
          if (correct) corr += o.xq[t * K + k] * estr(st, t, n, S, N);
        }
        r.dw.value.push_back((D * static_cast<double>(acc) - corr) / o.sw[n]);
        r.dw.tol.push_back(dw_tolerance(p, o, mg, k, n, correct));
      }
    }
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Running the layer.

struct LayerRun {
  LinearInput in;
  LinearWeight weight;
  LinearWorkspace ws;
};

void prepare(LayerRun& run, const Problem& p, LinearMode mode) {
  prepare_input(run.in, p.x, p.T, p.K, mode, "test.X");
  prepare_weight(run.weight, p.w, p.K, p.N, mode, "test.W");
}

LinearBackwardConfig backward_config(const Problem& p, Correction correction, Key key,
                                     bool accumulate) {
  LinearBackwardConfig config;
  config.correction = correction;
  config.tokens_per_example = p.S;
  config.layer_key = key;
  config.accumulate_dx = accumulate;
  return config;
}

// A row-major (rows x cols) tensor against its expectation, element by element.
void check_tensor(Checker& chk, const char* name, const Expected& e, std::span<const float> got,
                  int64_t rows, int64_t cols, const char* row_letter, const char* col_letter) {
  if (got.size() != e.value.size()) {
    chk.expect(false, [&] {
      return str(name, " has ", got.size(), " elements, expected ", e.value.size());
    });
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      chk.near(e.value[i], got[i], e.tol[i],
               [&] { return str(name, "[", row_letter, "=", r, ", ", col_letter, "=", c, "]"); });
    }
  }
}

template <typename T>
void check_bits(Checker& chk, const char* name, const std::vector<T>& expected,
                const std::vector<T>& got, int64_t cols) {
  if (got.size() != expected.size()) {
    chk.expect(false, [&] {
      return str(name, " has ", got.size(), " elements, expected ", expected.size());
    });
    return;
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    const double e = static_cast<double>(expected[i]), a = static_cast<double>(got[i]);
    chk.near(e, a, 0.0, [&] { return str(name, "[", i / cols, ", ", i % cols, "] (bit-exact)"); });
  }
}

// Scales, codes and row sums of the prepared operands, bit for bit (SPEC 1).
void check_operands(Checker& chk, const LayerRun& run, const Operands& o, const Problem& p) {
  check_bits(chk, "Xq", o.xq, run.in.codes, p.K);
  check_bits(chk, "sx", o.sx, run.in.scales, 1);
  check_bits(chk, "Wq", o.wq, run.weight.codes, p.N);
  check_bits(chk, "sw", o.sw, run.weight.scales, 1);
  std::vector<float> rowsum;
  for (int64_t v : o.rowsum) rowsum.push_back(static_cast<float>(v));
  check_bits(chk, "rowsum(Wq)", rowsum, run.weight.code_row_sums, 1);
}

// D and the codes of G' that the layer used (its workspace), bit for bit (SPEC 1-3).
void check_grad_codes(Checker& chk, const LinearWorkspace& ws, const GradCodes& gc,
                      const Problem& p) {
  chk.near(gc.D, ws.grad.step, 0.0, [] { return std::string("step D (bit-exact)"); });
  chk.expect(ws.grad.count == gc.count,
             [&] { return str("quantization count ", ws.grad.count, ", expected ", gc.count); });
  for (int q = 0; q < std::min(gc.count, ws.grad.count); ++q) {
    check_bits(chk, q == 0 ? "Q (dX codes)" : "Q (dW codes)", gc.q[q], ws.grad.codes[q], p.N);
  }
}

enum class Variant { kPlain, kAccumulate, kNoDx };
const char* to_string(Variant v) {
  switch (v) {
    case Variant::kPlain:
      return "dX = ...";
    case Variant::kAccumulate:
      return "dX += ...";
    case Variant::kNoDx:
      return "no dX";
  }
  return "?";
}

// One backward pass of `mode` against the reference; the forward operands are prepared in `run`.
void check_backward(Checker& chk, LayerRun& run, const Problem& p, LinearMode mode,
                    Correction correction, Variant variant, Key key) {
  const int64_t T = p.T, K = p.K, N = p.N;
  std::vector<float> dx_old;
  if (variant == Variant::kAccumulate) {
    for (int64_t i = 0; i < T * K; ++i) dx_old.push_back(sym_uniform(key_from_seed(7), i));
  }
  std::vector<float> dx = variant == Variant::kNoDx ? std::vector<float>{}
                          : variant == Variant::kAccumulate
                              ? dx_old
                              : std::vector<float>(static_cast<size_t>(T * K), 12345.0f);
  std::vector<float> dw(static_cast<size_t>(K * N), 12345.0f);
  linear_backward(dx, dw, p.g, run.in, run.weight,
                  backward_config(p, correction, key, variant == Variant::kAccumulate), run.ws);
  ExpectedBackward e;
  if (is_int8(mode)) {
    const Operands o = forward_operands(p);
    const GradCodes gc = grad_codes(p, o, mode, key);
    check_grad_codes(chk, run.ws, gc, p);
    e = expected_backward_int8(p, o, gc, correction, dx_old);
  } else {
    e = expected_backward_float(p, mode, dx_old);
  }
  if (variant != Variant::kNoDx) check_tensor(chk, "dX", e.dx, dx, T, K, "t", "k");
  check_tensor(chk, "dW", e.dw, dw, K, N, "k", "n");
}

// (a) Every mode, correction and ISA, each example length S of `lengths`, three dX variants,
// with `threads` OpenMP threads (hundreds of tiny calls whose parallel regions crawl when the
// cores are shared, so most sweeps use one; results must not depend on it).
void run_reference_sweep(const Problem& base, int threads, const std::vector<int64_t>& lengths,
                         Checker& chk) {
  testing::ScopedThreads scoped_threads(threads);
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    for (int64_t S : lengths) {
      Problem p = base;
      p.S = S;
      for (LinearMode mode : kAllModes) {
        LayerRun run;
        prepare(run, p, mode);
        const std::string where =
            str(isa_name(isa), ", ", threads, " threads, ", p.shape(), ", mode ", to_string(mode));
        chk.set_context(where + ", forward");
        if (is_int8(mode)) check_operands(chk, run, forward_operands(p), p);
        std::vector<float> y(static_cast<size_t>(p.T * p.N), 12345.0f);
        linear_forward(y, run.in, run.weight);
        check_tensor(chk, "Y", expected_forward(p, mode, forward_operands(p)), y, p.T, p.N, "t",
                     "n");
        const std::vector<Correction> corrections =
            is_int8(mode)
                ? std::vector<Correction>(std::begin(kAllCorrections), std::end(kAllCorrections))
                : std::vector<Correction>{Correction::kNone};
        for (Correction correction : corrections) {
          for (Variant variant : {Variant::kPlain, Variant::kAccumulate, Variant::kNoDx}) {
            const Key key = make_layer_key(2024, static_cast<uint32_t>(S), 3);
            chk.set_context(
                str(where, ", correction ", to_string(correction), ", ", to_string(variant)));
            check_backward(chk, run, p, mode, correction, variant, key);
          }
        }
      }
    }
  }
}

TEST(QuantLinearReference, EveryModeCorrectionAndIsaMatchesDoubleReference) {
  Checker chk("");
  const Problem p = make_problem(12, 20, 17, 1, 11u, false);
  run_reference_sweep(p, 1, {1, p.T / 2, p.T}, chk);
  run_reference_sweep(p, 2, {p.T / 2}, chk);  // the threaded paths of every kernel
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
  EXPECT_GT(chk.checks(), 0);
}

// G == 0: D == 0, so dX = 0 (unchanged when accumulating) and dW = 0 exactly. The reference
// gives these values with tolerance 0 (every magnitude in the bounds is 0, and adding an exact 0
// to the old dX is exact).
TEST(QuantLinearReference, ZeroGradientGivesExactZeros) {
  Checker chk("");
  run_reference_sweep(make_problem(12, 20, 17, 1, 12u, true), 1, {1, 6, 12}, chk);
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
  EXPECT_GT(chk.checks(), 0);
}

// Odd sizes that cross the 16-lane and 64-column blocks of the kernels.
TEST(QuantLinearReference, LargerOddShapeMatchesDoubleReference) {
  Checker chk("");
  run_reference_sweep(make_problem(20, 67, 37, 1, 13u, false), 1, {1, 10, 20}, chk);
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
}

// ---------------------------------------------------------------------------------------------
// The exact distribution of the rounding errors over the thresholds ((b) and (d)).
//
// For fixed x the code clamp(floor(fl(x + r))) is nondecreasing in r (f32 addition, floor and
// the clamp are monotone) and, for r in [0, 1), takes at most two adjacent values (checked
// below). So E[t,n] = e_lo + jump * U with jump = D (hi - lo) and U = 1 iff the threshold index
// is >= first_up: a 7-bit index k of 128 equally likely values, or sr's index j of 2^23. Tokens
// are independent (s3r: distinct threshold bytes; sr: distinct words), and so are examples under
// s3r-bcast; under sr so are all elements, and the two code tensors.

double ulp32(double v) {  // ulp of an f32 number in the binade of v >= 1
  int e = 0;
  std::frexp(v, &e);
  return std::ldexp(1.0, e - 24);
}

constexpr int kLevels7 = 128;             // 7-bit thresholds
constexpr uint32_t kLevels23 = 1u << 23;  // sr's 23-bit thresholds

struct RoundingModel {
  LinearMode mode = LinearMode::kS3r;
  int64_t T = 0, N = 0, S = 0;
  double D = 0.0;
  std::vector<double> e_lo;    // (T, N) D lo - G'
  std::vector<double> jump;    // (T, N) D (hi - lo), 0 or D
  std::vector<int> first_up;   // (T, N) 7-bit: first k with code hi (kLevels7: never)
  std::vector<double> p_up;    // (T, N) P(code = hi)
  std::vector<double> bias;    // (T, N) bound on |E[E]| (see rounding_model)
  std::vector<double> e_rtne;  // (T, N) D rne(x) - G': the error of a biased rounding
  bool two_valued = true;      // the assumption above held for every element
};

RoundingModel rounding_model(const Problem& p, const Operands& o, const GradCodes& gc,
                             LinearMode mode) {
  RoundingModel m;
  m.mode = mode;
  m.T = p.T, m.N = p.N, m.S = p.S;
  m.D = gc.D;
  const std::vector<double> gp = exact_folded(p, o);
  const bool seven = mode != LinearMode::kSr;
  for (int64_t i = 0; i < p.T * p.N; ++i) {
    const float x = gc.xs[i];
    auto code7 = [&](int k) { return floor_code(x, threshold_7bit_of_index(k)); };
    auto code23 = [&](uint32_t j) { return floor_code(x, static_cast<float>(j) * 0x1p-23f); };
    const int lo = seven ? code7(0) : code23(0);
    const int hi = seven ? code7(kLevels7 - 1) : code23(kLevels23 - 1);
    m.two_valued = m.two_valued && (hi == lo || hi == lo + 1);
    int first = seven ? kLevels7 : static_cast<int>(kLevels23);
    double p_up = 0.0;
    if (hi != lo && seven) {
      first = 0;
      while (code7(first) != hi) ++first;
      for (int k = first; k < kLevels7; ++k) m.two_valued = m.two_valued && code7(k) == hi;
      p_up = static_cast<double>(kLevels7 - first) / kLevels7;
    } else if (hi != lo) {  // binary search for the first j with code hi
      uint32_t a = 0, b = kLevels23 - 1;
      while (a < b) {
        const uint32_t mid = a + (b - a) / 2;
        if (code23(mid) == hi)
          b = mid;
        else
          a = mid + 1;
      }
      first = static_cast<int>(a);
      p_up = static_cast<double>(kLevels23 - a) / kLevels23;
    }
    m.e_lo.push_back(m.D * lo - gp[i]);
    m.jump.push_back(m.D * (hi - lo));
    m.first_up.push_back(first);
    m.p_up.push_back(p_up);
    m.e_rtne.push_back(m.D * rne_code(x) - gp[i]);
    // |E[D Q] - G'| <= |E[D Q] - D x| + |D x - G'|. The first: D/256 + D ulp(|x| + 1)/2 for the
    // 7-bit thresholds (SPEC 2; exact bound checked in grad_quant_stats_test.cpp), and
    // D (ulp(|x| + 1) + 2^-22) for sr (f32 addition and the 2^-23 grid, same file); the
    // second 3.01 u |G'| (stat_eps).
    const double ulp = ulp32(std::fabs(static_cast<double>(x)) + 1.0);
    m.bias.push_back((seven ? m.D / 256.0 + m.D * ulp / 2.0 : m.D * (ulp + 0x1p-22)) +
                     3.01 * kU32 * std::fabs(gp[i]));
  }
  return m;
}

// Mean, variance and the largest deviation from the mean of a random quantity, and two
// deterministic companions: a bound on its bias and its value under rtne.
struct Moments {
  double mean = 0.0, var = 0.0, dev = 0.0, bias = 0.0, rtne = 0.0;
};

// Per token s, the distribution of h_s = sum_n beta[n] E[s, n] over that token's thresholds.
struct TokenMoments {
  std::vector<Moments> token;  // (T); bias = sum_n |beta| bias
  std::vector<double> values;  // (T, 128) h_s at each 7-bit threshold index (s3r, s3r-bcast)
};

TokenMoments token_moments(const RoundingModel& m, const std::vector<double>& beta) {
  const int64_t T = m.T, N = m.N;
  TokenMoments tm;
  tm.token.resize(static_cast<size_t>(T));
  const bool seven = m.mode != LinearMode::kSr;
  if (seven) tm.values.assign(static_cast<size_t>(T * kLevels7), 0.0);
  for (int64_t s = 0; s < T; ++s) {
    Moments& mo = tm.token[s];
    double base = 0.0;
    std::vector<double> bucket(kLevels7 + 1, 0.0);  // jumps by first threshold index
    for (int64_t n = 0; n < N; ++n) {
      const int64_t i = s * N + n;
      const double bn = beta[n];
      if (bn == 0.0) continue;
      base += bn * m.e_lo[i];
      mo.bias += std::fabs(bn) * m.bias[i];
      mo.rtne += bn * m.e_rtne[i];
      if (seven) {
        bucket[m.first_up[i]] += bn * m.jump[i];
      } else {
        const double pu = m.p_up[i], j = bn * m.jump[i];
        mo.mean += j * pu;
        mo.var += j * j * pu * (1.0 - pu);
        mo.dev += std::fabs(j) * std::max(pu, 1.0 - pu);
      }
    }
    if (!seven) {
      mo.mean += base;
      continue;
    }
    double* v = &tm.values[s * kLevels7];
    double up = 0.0;
    for (int k = 0; k < kLevels7; ++k) {
      up += bucket[k];
      v[k] = base + up;
      mo.mean += v[k] / kLevels7;
    }
    for (int k = 0; k < kLevels7; ++k) {
      mo.var += (v[k] - mo.mean) * (v[k] - mo.mean) / kLevels7;
      mo.dev = std::max(mo.dev, std::fabs(v[k] - mo.mean));
    }
  }
  return tm;
}

// Moments of sum_j alpha[j] h_{t0 + j} for tokens [t0, t0 + alpha.size()) of one example.
// sr and s3r: independent tokens, so means, variances and deviation bounds add. s3r-bcast: one
// threshold for the example, so the sum is evaluated at each of the 128 thresholds.
Moments combine(const RoundingModel& m, const TokenMoments& tm, int64_t t0,
                const std::vector<double>& alpha) {
  Moments r;
  for (size_t j = 0; j < alpha.size(); ++j) {
    const Moments& h = tm.token[t0 + j];
    r.bias += std::fabs(alpha[j]) * h.bias;
    r.rtne += alpha[j] * h.rtne;
    if (m.mode != LinearMode::kS3rBcast) {
      r.mean += alpha[j] * h.mean;
      r.var += alpha[j] * alpha[j] * h.var;
      r.dev += std::fabs(alpha[j]) * h.dev;
    }
  }
  if (m.mode == LinearMode::kS3rBcast) {
    double sum[kLevels7] = {};
    for (size_t j = 0; j < alpha.size(); ++j) {
      if (alpha[j] == 0.0) continue;
      const double* v = &tm.values[(t0 + j) * kLevels7];
      for (int k = 0; k < kLevels7; ++k) sum[k] += alpha[j] * v[k];
    }
    for (double v : sum) r.mean += v / kLevels7;
    for (double v : sum) {
      r.var += (v - r.mean) * (v - r.mean) / kLevels7;
      r.dev = std::max(r.dev, std::fabs(v - r.mean));
    }
  }
  return r;
}

void add_to(Moments& total, const Moments& part) {  // independent parts
  total.mean += part.mean;
  total.var += part.var;
  total.dev += part.dev;
  total.bias += part.bias;
  total.rtne += part.rtne;
}

// Output errors as linear functionals of E, per example b: sum_{s in b, n} alpha_s beta_n E[s,n].
// From dX = (1/sx) (G' + E - [corr] Estr) Wq^T and E - Estr = P_S E_b P_N per example
// (P_L = I - 1 1^T / L, SPEC 4):
//   dX[t,k] - dX_ref:  beta = Wq[k,:] (none) or Wq[k,:] - rowsum[k]/N (corrected),
//                      alpha_s = [s = t]/sx[t] (none) or ([s = t] - 1/S)/sx[t]
//   dW[k,n] - dW_ref:  beta = e_n (none) or e_n - 1/N (two-way),
//                      alpha_s = Xq[s,k]/sw[n] (none) or (Xq[s,k] - mean_{s' in b} Xq[s',k])/sw[n]
std::vector<double> dx_beta(const Problem& p, const Operands& o, int64_t k, bool corrected) {
  std::vector<double> beta;
  for (int64_t n = 0; n < p.N; ++n) {
    beta.push_back(o.wq[k * p.N + n] - (corrected ? static_cast<double>(o.rowsum[k]) / p.N : 0.0));
  }
  return beta;
}

std::vector<double> dw_beta(const Problem& p, int64_t n, bool corrected) {
  std::vector<double> beta(static_cast<size_t>(p.N), corrected ? -1.0 / p.N : 0.0);
  beta[n] += 1.0;
  return beta;
}

std::vector<double> dx_alpha(const Problem& p, const Operands& o, int64_t t, bool corrected) {
  std::vector<double> alpha;
  for (int64_t s = (t / p.S) * p.S; s < (t / p.S + 1) * p.S; ++s) {
    alpha.push_back(((s == t ? 1.0 : 0.0) - (corrected ? 1.0 / p.S : 0.0)) / o.sx[t]);
  }
  return alpha;
}

std::vector<double> dw_alpha(const Problem& p, const Operands& o, int64_t b, int64_t k, int64_t n,
                             bool corrected) {
  double mean = 0.0;
  for (int64_t s = b * p.S; s < (b + 1) * p.S; ++s) mean += o.xq[s * p.K + k];
  mean /= static_cast<double>(p.S);
  std::vector<double> alpha;
  for (int64_t s = b * p.S; s < (b + 1) * p.S; ++s) {
    alpha.push_back((o.xq[s * p.K + k] - (corrected ? mean : 0.0)) / o.sw[n]);
  }
  return alpha;
}

// The exact distribution of every element of dX - dX_ref (T, K) and dW - dW_ref (K, N).
struct GradientMoments {
  std::vector<Moments> dx, dw;
};

GradientMoments gradient_moments(const RoundingModel& m, const Problem& p, const Operands& o,
                                 bool correct_dx, bool correct_dw) {
  GradientMoments g;
  g.dx.resize(static_cast<size_t>(p.T * p.K));
  for (int64_t k = 0; k < p.K; ++k) {
    const TokenMoments tm = token_moments(m, dx_beta(p, o, k, correct_dx));
    for (int64_t t = 0; t < p.T; ++t) {
      g.dx[t * p.K + k] = combine(m, tm, (t / p.S) * p.S, dx_alpha(p, o, t, correct_dx));
    }
  }
  g.dw.resize(static_cast<size_t>(p.K * p.N));
  for (int64_t n = 0; n < p.N; ++n) {
    const TokenMoments tm = token_moments(m, dw_beta(p, n, correct_dw));
    for (int64_t k = 0; k < p.K; ++k) {
      for (int64_t b = 0; b < p.B(); ++b) {
        add_to(g.dw[k * p.N + n], combine(m, tm, b * p.S, dw_alpha(p, o, b, k, n, correct_dw)));
      }
    }
  }
  return g;
}

// The unquantized backward of the quantized forward operands, in double:
// dX_ref = G (Wq sw)^T = G' Wq^T / sx and dW_ref = (sx Xq)^T G = Xq^T G' / sw.
struct Reference {
  std::vector<double> dx, dw;  // (T, K), (K, N)
};

Reference unquantized_backward(const Problem& p, const Operands& o) {
  Reference r;
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t k = 0; k < p.K; ++k) {
      double sum = 0.0;
      for (int64_t n = 0; n < p.N; ++n) {
        sum += static_cast<double>(p.g[t * p.N + n]) * o.sw[n] * o.wq[k * p.N + n];
      }
      r.dx.push_back(sum);
    }
  }
  for (int64_t k = 0; k < p.K; ++k) {
    for (int64_t n = 0; n < p.N; ++n) {
      double sum = 0.0;
      for (int64_t t = 0; t < p.T; ++t) {
        sum += static_cast<double>(o.sx[t]) * o.xq[t * p.K + k] * p.g[t * p.N + n];
      }
      r.dw.push_back(sum);
    }
  }
  return r;
}


// ---------------------------------------------------------------------------------------------
// (b) Unbiasedness (SPEC 5.1, Lemma 1).

constexpr int kMeanDraws = 2000;

// Tolerance of the mean over kMeanDraws keys of one output element with exact moments `mo`:
// Bernstein (sampling), the bias bound sum |alpha beta| bias (7-bit: D/256 per element, SPEC 2),
// the f32 error of one draw (`fp`, the same for every draw), and the double sums of the test
// (kMeanDraws terms: kMeanDraws u64 relative to the largest possible term).
double mean_tolerance(const Moments& mo, double ref, double fp) {
  const double largest = std::fabs(ref) + std::fabs(mo.mean) + mo.dev + fp;
  return bernstein_tolerance(std::sqrt(mo.var), mo.dev, kMeanDraws) + mo.bias + fp +
         kMeanDraws * kU64 * largest;
}

// Checks the means of one output tensor; returns how many elements a biased rounding (rtne)
// would fail, to show that the tolerances have power.
int check_means(Checker& chk, const char* name, const std::vector<double>& sum,
                const std::vector<double>& ref, const std::vector<Moments>& mo,
                const std::vector<double>& fp, int64_t cols) {
  int detect = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double tol = mean_tolerance(mo[i], ref[i], fp[i]);
    chk.near(ref[i], sum[i] / kMeanDraws, tol, [&] {
      return str("mean of ", name, "[", i / cols, ", ", i % cols, "] over ", kMeanDraws,
                 " keys (sd of one draw ", std::sqrt(mo[i].var), ", bias bound ", mo[i].bias,
                 ", exact mean ", ref[i] + mo[i].mean, ")");
    });
    if (std::fabs(mo[i].rtne) > tol) ++detect;
  }
  return detect;
}

TEST(QuantLinearStats, MeanGradientIsUnbiased) {
  const Problem p = make_problem(16, 24, 20, 4, 21u, false);
  const Operands o = forward_operands(p);
  const Reference ref = unquantized_backward(p, o);
  // One thread: results do not depend on it (SPEC 3), and thousands of tiny parallel regions
  // crawl when the cores are shared.
  testing::ScopedThreads one_thread(1);
  Checker chk("");
  for (LinearMode mode : kStochasticModes) {
    const GradCodes gc = grad_codes(p, o, mode, Key{0, 0});  // D and x do not depend on the key
    const RoundingModel model = rounding_model(p, o, gc, mode);
    ASSERT_TRUE(model.two_valued) << to_string(mode);
    const Magnitudes worst = worst_magnitudes(p, gc, stat_eps(p, exact_folded(p, o), gc.D));
    LayerRun run;
    prepare(run, p, mode);
    std::vector<double> sum_dx[3], sum_dw[3];
    std::vector<float> dx(static_cast<size_t>(p.T * p.K)), dw(static_cast<size_t>(p.K * p.N));
    for (int c = 0; c < 3; ++c) sum_dx[c].assign(dx.size(), 0.0), sum_dw[c].assign(dw.size(), 0.0);
    for (int d = 0; d < kMeanDraws; ++d) {
      const Key key = make_layer_key(5150, static_cast<uint32_t>(d), 7);
      for (int c = 0; c < 3; ++c) {
        linear_backward(dx, dw, p.g, run.in, run.weight,
                        backward_config(p, kAllCorrections[c], key, false), run.ws);
        for (size_t i = 0; i < dx.size(); ++i) sum_dx[c][i] += dx[i];
        for (size_t i = 0; i < dw.size(); ++i) sum_dw[c][i] += dw[i];
      }
    }
    for (int c = 0; c < 3; ++c) {
      const Correction correction = kAllCorrections[c];
      const bool correct_dx = correction != Correction::kNone;
      const bool correct_dw = correction == Correction::kTwoWay;
      chk.set_context(
          str("mode ", to_string(mode), ", correction ", to_string(correction), ", ", p.shape()));
      const GradientMoments gm = gradient_moments(model, p, o, correct_dx, correct_dw);
      std::vector<double> fp_dx, fp_dw;
      for (int64_t t = 0; t < p.T; ++t) {
        for (int64_t k = 0; k < p.K; ++k) {
          fp_dx.push_back(dx_tolerance(p, o, worst, t, k, correct_dx, 0.0));
        }
      }
      for (int64_t k = 0; k < p.K; ++k) {
        for (int64_t n = 0; n < p.N; ++n) {
          fp_dw.push_back(dw_tolerance(p, o, worst, k, n, correct_dw));
        }
      }
      const int detect_dx = check_means(chk, "dX", sum_dx[c], ref.dx, gm.dx, fp_dx, p.K);
      const int detect_dw = check_means(chk, "dW", sum_dw[c], ref.dw, gm.dw, fp_dw, p.N);
      // Power: rtne's deterministic error in place of the mean would fail on many elements (about
      // half or more here; elements of channels with |x| << 1 have a tiny rtne error).
      chk.expect(4 * detect_dx > static_cast<int>(ref.dx.size()), [&] {
        return str("rtne's bias exceeds the dX tolerance on only ", detect_dx, " of ",
                   ref.dx.size(), " elements");
      });
      chk.expect(4 * detect_dw > static_cast<int>(ref.dw.size()), [&] {
        return str("rtne's bias exceeds the dW tolerance on only ", detect_dw, " of ",
                   ref.dw.size(), " elements");
      });
    }
  }
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
}

// ---------------------------------------------------------------------------------------------
// (c) The error that reaches dX and dW is that of R = E - Estr (E without correction).

// |sum of R over a row or column| in double: c, a, m, each R element and the sum take at most
// 2 max(S, N) + 10 roundings of relative 2^-53 on any term of the sum of |E| + |a| + |c| + |m|.
double residual_sum_tolerance(double abs_sum, int64_t S, int64_t N) {
  return static_cast<double>(2 * std::max(S, N) + 10) * kU64 * abs_sum;
}

// R (T, N) of one code tensor: E - Estr when `corrected`, else E. Checks the zero row and
// column sums per example of a corrected R.
std::vector<double> residual(Checker& chk, const Problem& p, const std::vector<double>& gp,
                             const std::vector<int8_t>& q, double D, bool corrected,
                             const char* name) {
  const int64_t T = p.T, N = p.N, S = p.S;
  const ErrorStatsD st = error_stats(p, gp, q, D);
  std::vector<double> r(st.e), mag(st.e.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t b = t / S, i = t * N + n;
      if (corrected) r[i] -= estr(st, t, n, S, N);
      mag[i] =
          std::fabs(st.e[i]) + std::fabs(st.a[b * N + n]) + std::fabs(st.c[t]) + std::fabs(st.m[b]);
    }
  }
  if (!corrected) return r;
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0.0, abs_sum = 0.0;
    for (int64_t n = 0; n < N; ++n) sum += r[t * N + n], abs_sum += mag[t * N + n];
    chk.near(0.0, sum, residual_sum_tolerance(abs_sum, S, N),
             [&] { return str(name, ": row sum of R = E - Estr at t=", t); });
  }
  for (int64_t b = 0; b < p.B(); ++b) {
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t t = b * S; t < (b + 1) * S; ++t) sum += r[t * N + n], abs_sum += mag[t * N + n];
      chk.near(0.0, sum, residual_sum_tolerance(abs_sum, S, N),
               [&] { return str(name, ": column sum of R = E - Estr at b=", b, ", n=", n); });
    }
  }
  return r;
}

TEST(QuantLinearResidual, GradientErrorIsResidualThroughBothProducts) {
  const Problem p = make_problem(16, 20, 17, 4, 31u, false);
  const Operands o = forward_operands(p);
  const Reference ref = unquantized_backward(p, o);
  const std::vector<double> gp = exact_folded(p, o);
  testing::ScopedThreads one_thread(1);  // as in (a)
  Checker chk("");
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    for (LinearMode mode : kInt8Modes) {
      LayerRun run;
      prepare(run, p, mode);
      for (Correction correction : kAllCorrections) {
        chk.set_context(str(isa_name(isa), ", mode ", to_string(mode), ", correction ",
                            to_string(correction), ", ", p.shape()));
        std::vector<float> dx(static_cast<size_t>(p.T * p.K)), dw(static_cast<size_t>(p.K * p.N));
        const Key key = make_layer_key(77, 1, static_cast<uint32_t>(correction));
        linear_backward(dx, dw, p.g, run.in, run.weight, backward_config(p, correction, key, false),
                        run.ws);
        // R from the codes the layer used and G' (double).
        const QuantizedGrad& qg = run.ws.grad;
        const double D = qg.step;
        const bool correct_dx = correction != Correction::kNone;
        const bool correct_dw = correction == Correction::kTwoWay;
        const std::vector<double> r_dx =
            residual(chk, p, gp, qg.codes_for_dx(), D, correct_dx, "dX");
        const std::vector<double> r_dw =
            residual(chk, p, gp, qg.codes_for_dw(), D, correct_dw, "dW");
        // f32 tolerances of the layer (as in (a)) with the magnitudes of these codes.
        const StatEps eps = stat_eps(p, gp, D);
        const Magnitudes mg_dx =
            magnitudes(p, qg.codes_for_dx(), error_stats(p, gp, qg.codes_for_dx(), D), eps, D);
        const Magnitudes mg_dw =
            magnitudes(p, qg.codes_for_dw(), error_stats(p, gp, qg.codes_for_dw(), D), eps, D);
        for (int64_t t = 0; t < p.T; ++t) {
          for (int64_t k = 0; k < p.K; ++k) {
            double err = 0.0, abs_sum = 0.0;  // (1/sx) (R Wq^T)[t, k]
            for (int64_t n = 0; n < p.N; ++n) {
              const double w = o.wq[k * p.N + n];
              err += r_dx[t * p.N + n] * w;
              abs_sum += (std::fabs(r_dx[t * p.N + n]) + std::fabs(gp[t * p.N + n])) * std::fabs(w);
            }
            err /= o.sx[t];
            const size_t i = static_cast<size_t>(t * p.K + k);
            // The layer's f32 error, and the double rounding of dX_ref and R Wq^T / sx.
            const double tol =
                dx_tolerance(p, o, mg_dx, t, k, correct_dx, 0.0) + ref_slack(p, abs_sum / o.sx[t]);
            chk.near(err, dx[i] - ref.dx[i], tol,
                     [&] { return str("dX - dX_ref vs R Wq^T / sx at [t=", t, ", k=", k, "]"); });
          }
        }
        for (int64_t k = 0; k < p.K; ++k) {
          for (int64_t n = 0; n < p.N; ++n) {
            double err = 0.0, abs_sum = 0.0;  // (1/sw) (Xq^T R)[k, n]
            for (int64_t t = 0; t < p.T; ++t) {
              const double xv = o.xq[t * p.K + k];
              err += xv * r_dw[t * p.N + n];
              abs_sum +=
                  std::fabs(xv) * (std::fabs(r_dw[t * p.N + n]) + std::fabs(gp[t * p.N + n]));
            }
            err /= o.sw[n];
            const size_t i = static_cast<size_t>(k * p.N + n);
            const double tol =
                dw_tolerance(p, o, mg_dw, k, n, correct_dw) + ref_slack(p, abs_sum / o.sw[n]);
            chk.near(err, dw[i] - ref.dw[i], tol,
                     [&] { return str("dW - dW_ref vs Xq^T R / sw at [k=", k, ", n=", n, "]"); });
          }
        }
      }
    }
  }
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
  EXPECT_GT(chk.checks(), 0);
}

// ---------------------------------------------------------------------------------------------
// (d) The variance story (SPEC 5.4, Proposition 1) on a layer whose weight rows share a common
// component, W[k,n] = mu_k + small noise, so that rowsum(Wq)[k] ~ 127 N mu_k / max|W| is large:
// a token-shared threshold makes the errors of a token's N channels positively correlated
// (Lemma 2), and Wq adds them coherently into dX; the correction removes the token means c
// (and a, m) that carry this common mode. dW sums over tokens, whose thresholds are independent
// under s3r as under sr, so its error variance does not change. Under s3r-bcast the tokens of an
// example share one threshold: with activations X[t,k] = nu_k + noise, Xq adds an example's
// correlated errors coherently into dW, and so does any sum of dX over an example's tokens.
// dX itself of one token depends on that token's threshold only, uniform under s3r and
// s3r-bcast alike, so its error has exactly the same distribution under both.

Problem shared_component_problem() {
  Problem p{32, 48, 128, 8, {}, {}, {}};
  const Key key = key_from_seed(4242);
  // Activations with a per-feature component common to all tokens (as outlier features of LLMs
  // have): nu_k + noise, so that sum_s Xq[s,k] E[s,n] adds the errors of an example coherently.
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t k = 0; k < p.K; ++k) {
      const float nu = sym_uniform(fold_in(key, 7), k);
      p.x.push_back(nu + sym_uniform(fold_in(key, 1), t * p.K + k));
    }
  }
  for (int64_t k = 0; k < p.K; ++k) {
    const float u = sym_uniform(fold_in(key, 2), k);
    const float mu = (u < 0.0f ? -0.5f : 0.5f) + 0.5f * u;  // |mu| in [0.5, 1), both signs
    for (int64_t n = 0; n < p.N; ++n) {
      p.w.push_back(mu + 0.1f * sym_uniform(fold_in(key, 3), k * p.N + n));
    }
  }
  // Near-Gaussian gradients (sum of three uniforms) with token scales 1/3, 2/3, 1: x = G'/D
  // covers many residuals.
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t n = 0; n < p.N; ++n) {
      float v = 0.0f;
      for (uint32_t j = 4; j < 7; ++j) v += sym_uniform(fold_in(key, j), t * p.N + n);
      p.g.push_back(v * static_cast<float>(1 + t % 3) / 3.0f);
    }
  }
  return p;
}

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
  std::vector<float> dx(static_cast<size_t>(p.T * p.K)), dw(static_cast<size_t>(p.K * p.N));
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
  testing::ScopedThreads one_thread(1);
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

// ---------------------------------------------------------------------------------------------
// Errors (SPEC 1): a non-finite X or W is an error naming the tensor; a non-finite G is reported
// as NonFiniteGradient; operands prepared for different modes do not mix.

TEST(QuantLinearErrors, NonFiniteOperandsAndMismatchedModesThrow) {
  const Problem p = make_problem(12, 20, 17, 4, 41u, false);
  for (LinearMode mode : kInt8Modes) {
    SCOPED_TRACE(str("mode ", to_string(mode)));
    Problem bad = p;
    bad.x[3 * p.K + 2] = std::numeric_limits<float>::quiet_NaN();
    bad.w[4 * p.N + 1] = std::numeric_limits<float>::infinity();
    LinearInput in;
    LinearWeight weight;
    try {
      prepare_input(in, bad.x, p.T, p.K, mode, "blocks.0.test.X");
      ADD_FAILURE() << "NaN in X was quantized silently";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("blocks.0.test.X"), std::string::npos) << e.what();
    }
    try {
      prepare_weight(weight, bad.w, p.K, p.N, mode, "blocks.0.test.W");
      ADD_FAILURE() << "Inf in W was quantized silently";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("blocks.0.test.W"), std::string::npos) << e.what();
    }
    LayerRun run;
    prepare(run, p, mode);
    std::vector<float> g = p.g, dx(static_cast<size_t>(p.T * p.K)),
                       dw(static_cast<size_t>(p.K * p.N));
    g[5 * p.N + 6] = -std::numeric_limits<float>::infinity();
    const LinearBackwardConfig config = backward_config(p, Correction::kTwoWay, Key{1, 2}, false);
    EXPECT_THROW(linear_backward(dx, dw, g, run.in, run.weight, config, run.ws), NonFiniteGradient);
    LayerRun other;
    prepare(other, p, mode == LinearMode::kS3r ? LinearMode::kSr : LinearMode::kS3r);
    EXPECT_THROW(linear_backward(dx, dw, p.g, run.in, other.weight, config, run.ws), Error);
    std::vector<float> y(static_cast<size_t>(p.T * p.N));
    EXPECT_THROW(linear_forward(y, run.in, other.weight), Error);
  }
}

}  // namespace
}  // namespace s3r::nn
