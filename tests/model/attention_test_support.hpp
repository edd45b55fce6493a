#pragma once
// Shared by the fused attention tests (attention_test.cpp, attention_gqa_test.cpp): the double
// reference written from the definition, first-order error bounds computed from the data, and
// runners of the function under test. See attention_test.cpp's header for the method.

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "s3r/core/error.hpp"
#include "s3r/core/isa.hpp"
#include "s3r/model/layers.hpp"
#include "check_util.hpp"
#include "test_util.hpp"

#include "s3r/core/aligned_vector.hpp"
#include "s3r/model/attention.hpp"

namespace s3r::model::attention_testing {


using DVec = std::vector<double>;
using FVec = AlignedVector<float>;

constexpr double kU = 0x1p-24;       // f32 unit roundoff
constexpr double kExpErr = 0x1p-21;  // relative error bound of the polynomial exp
// exp_poly clamps its argument at -87: a probability below e^-87 comes out as e^-87 (1.65e-38),
// an absolute error below kExpFloor; and each f32 operation on subnormals rounds to 2^-149.
constexpr double kExpFloor = 1.7e-38;
constexpr double kTiny = 0x1p-149;

struct Shape {
  int64_t B, S, NH, HD;
  int64_t W = 0;  // sliding window (row i attends to keys i - W < j <= i); 0: none
  // The first key row i attends to.
  int64_t first_key(int64_t i) const { return W > 0 ? std::max<int64_t>(0, i - W + 1) : 0; }
  int64_t C() const { return NH * HD; }
  int64_t T() const { return B * S; }
  size_t acts() const { return static_cast<size_t>(T() * C()); }
  size_t rows() const { return static_cast<size_t>(B * NH * S); }
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(HD)); }
  std::string str() const {
    return "B=" + std::to_string(B) + " S=" + std::to_string(S) + " NH=" + std::to_string(NH) +
           " HD=" + std::to_string(HD) + (W > 0 ? " W=" + std::to_string(W) : "");
  }
};

inline FVec random_vec(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  FVec v(n);
  for (auto& x : v) x = normal(gen);
  return v;
}

inline DVec to_double(const FVec& v) { return {v.begin(), v.end()}; }

struct Inputs {
  FVec q, k, v, dout;
};

// q and k ~ N(0, qk_sigma^2): qk_sigma = 4 spreads the scores (std 16) so that the running
// maximum moves often and the rescaling matters.
inline Inputs make_inputs(const Shape& s, uint32_t seed, float qk_sigma = 1.0f) {
  return {random_vec(s.acts(), seed, qk_sigma), random_vec(s.acts(), seed + 1, qk_sigma),
          random_vec(s.acts(), seed + 2), random_vec(s.acts(), seed + 3)};
}

inline size_t at(const Shape& s, int64_t b, int64_t t, int64_t h, int64_t d) {
  return static_cast<size_t>((b * s.S + t) * s.C() + h * s.HD + d);
}

inline double dot(const Shape& s, const DVec& a, const DVec& b, int64_t bb, int64_t h, int64_t i,
           int64_t j) {
  double acc = 0.0;
  for (int64_t d = 0; d < s.HD; ++d) acc += a[at(s, bb, i, h, d)] * b[at(s, bb, j, h, d)];
  return acc;
}

// ---- the double reference ----------------------------------------------------------------------

struct RefForward {
  DVec out;  // (T, C)
  DVec lse;  // (B, NH, S)
  DVec p;    // (B, NH, S, S), 0 where masked
};

// softmax over keys first_key(i) - window_offset <= j <= i + mask_offset (mask_offset = 1 is the
// causal mask's off-by-one mutant, window_offset = 1 the window's).
inline RefForward reference_forward(const Shape& s, const DVec& q, const DVec& k, const DVec& v,
                             int64_t mask_offset = 0, int64_t window_offset = 0) {
  RefForward r{DVec(s.acts(), 0.0), DVec(s.rows()), DVec(s.rows() * s.S, 0.0)};
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      for (int64_t i = 0; i < s.S; ++i) {
        const int64_t last = std::min(s.S - 1, i + mask_offset);
        const int64_t first = std::max<int64_t>(0, s.first_key(i) - window_offset);
        double* p = r.p.data() + ((b * s.NH + h) * s.S + i) * s.S;
        double mx = -INFINITY;
        for (int64_t j = first; j <= last; ++j) {
          p[j] = s.scale() * dot(s, q, k, b, h, i, j);
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = first; j <= last; ++j) sum += std::exp(p[j] - mx);
        for (int64_t j = first; j <= last; ++j) p[j] = std::exp(p[j] - mx) / sum;
        r.lse[(b * s.NH + h) * s.S + i] = mx + std::log(sum);
        for (int64_t j = first; j <= last; ++j) {
          for (int64_t d = 0; d < s.HD; ++d)
            r.out[at(s, b, i, h, d)] += p[j] * v[at(s, b, j, h, d)];
        }
      }
    }
  }
  return r;
}

// The forward-bug mutant: a blocked online softmax (blocks of 32 keys) that rescales the running
// sum but forgets to rescale the accumulated output when the maximum grows.
inline DVec forward_without_rescale(const Shape& s, const DVec& q, const DVec& k, const DVec& v) {
  DVec out(s.acts(), 0.0);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      for (int64_t i = 0; i < s.S; ++i) {
        double m = -INFINITY, l = 0.0;
        DVec acc(s.HD, 0.0);
        for (int64_t j0 = 0; j0 <= i; j0 += 32) {
          const int64_t j1 = std::min(i + 1, j0 + 32);
          double mb = -INFINITY;
          for (int64_t j = j0; j < j1; ++j) mb = std::max(mb, s.scale() * dot(s, q, k, b, h, i, j));
          const double mn = std::max(m, mb);
          l *= std::exp(m - mn);
          for (int64_t j = j0; j < j1; ++j) {
            const double e = std::exp(s.scale() * dot(s, q, k, b, h, i, j) - mn);
            l += e;
            for (int64_t d = 0; d < s.HD; ++d) acc[d] += e * v[at(s, b, j, h, d)];
          }
          m = mn;
        }
        for (int64_t d = 0; d < s.HD; ++d) out[at(s, b, i, h, d)] = acc[d] / l;
      }
    }
  }
  return out;
}

struct RefGrads {
  DVec dq, dk, dv;
};

// The analytic backward from the reference's probabilities:
//   dv_j = sum_i p_ij dout_i,  dp_ij = dout_i . v_j,  D_i = sum_j p_ij dp_ij,
//   ds_ij = p_ij (dp_ij - D_i) scale,  dq_i = sum_j ds_ij k_j,  dk_j = sum_i ds_ij q_i.
// drop_d and drop_scale are mutants.
inline RefGrads reference_backward(const Shape& s, const DVec& q, const DVec& k, const DVec& v,
                            const DVec& dout, const RefForward& f, bool drop_d = false,
                            bool drop_scale = false) {
  RefGrads g{DVec(s.acts(), 0.0), DVec(s.acts(), 0.0), DVec(s.acts(), 0.0)};
  DVec dp(s.S);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      for (int64_t i = 0; i < s.S; ++i) {
        const double* p = f.p.data() + ((b * s.NH + h) * s.S + i) * s.S;
        double D = 0.0;
        for (int64_t j = 0; j < s.S; ++j) {
          dp[j] = dot(s, dout, v, b, h, i, j);
          D += p[j] * dp[j];
        }
        if (drop_d) D = 0.0;
        for (int64_t j = 0; j < s.S; ++j) {
          if (p[j] == 0.0) continue;
          const double ds = p[j] * (dp[j] - D) * (drop_scale ? 1.0 : s.scale());
          for (int64_t d = 0; d < s.HD; ++d) {
            g.dv[at(s, b, j, h, d)] += p[j] * dout[at(s, b, i, h, d)];
            g.dq[at(s, b, i, h, d)] += ds * k[at(s, b, j, h, d)];
            g.dk[at(s, b, j, h, d)] += ds * q[at(s, b, i, h, d)];
          }
        }
      }
    }
  }
  return g;
}

// ---- error bounds from the data -----------------------------------------------------------------

inline double max_abs(const DVec& x) {
  double m = 0.0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

// First-order bounds on the error of each f32 output element, from the exact (double) values.
// With u = 2^-24 and the kernels' operation order (kernels/attention_kernels.hpp):
//  score   ds_ij = (HD + 1) u scale sum_d |q_id| |k_jd| + u |s_ij|   (an HD-term fma chain, the
//          multiply by the f32-rounded scale)
//  weight  exp(s_ij - m) of row i, after its nb = i / 32 + 1 key blocks' rescalings, carries a
//          relative error rho_ij = ds_ij + (nb + 1)(2^-21 + 2u) + u (m_i - s_ij) + nb u R_i
//          (R_i = max_j (m_i - s_ij): the rounding of each exp's and rescaling's argument); the
//          shift m itself cancels in the normalization.
//  out     sum_j p_ij |v_jd - out_id| rho_ij + (S + nb + 1) u (sum_j p_ij |v_jd| + |out_id|)
//          (perturbed weights move out by p (v - out); the fma chain, the sum l, the division)
//  lse     sum_j p_ij rho_ij + (S + nb + 1) u + u |lse_i|
// Backward, p = exp(s - lse) is not renormalized, so lse's error stays:
//  p       pi_ij = ds_ij + dlse_i + 2^-21 + u |s_ij - lse_i| + 2u                      (relative)
//  dp      (HD + 1) u sum_d |v_jd| |dout_id|;  D_i: sum_d |dout_id| dout_id_err + u |D_i|
//  ds      scale p_ij (pi_ij |g_ij| + dp_err + D_err + 3u |g_ij|) + u |ds_ij|, g = dp - D
//  dq_id   sum_j ds_err_ij |k_jd| + (S + 1) u sum_j |ds_ij| |k_jd|   (dk alike over i with q;
//  dv_jd   sum_i p_ij pi_ij |dout_id| + (S + 1) u sum_i p_ij |dout_id|     dv with p and dout)
// plus, per probability, an absolute kExpFloor (exp's clamp) and per operation 2^-149 (subnormal
// results). They are upper bounds (no cancellation assumed), typically 10-100x the observed error,
// and far below what a wrong mask, rescale, D or scale does (the *BoundsCatch* tests).
struct Bounds {
  DVec out, lse, dq, dk, dv;
};

// error_bounds for one (batch b, head h), in three passes over its rows: the forward (out, lse;
// the scores sv), ds with its error (and dv's), then dq and dk from ds.
struct HeadBounds {
  const Shape& s;
  const DVec &q, &k, &v, &dout;
  const RefForward& ref;
  Bounds& e;
  int64_t b, h;
  const double* P;  // the head's probabilities (S, S) and log-sum-exps (S)
  const double* L;
  DVec ds_err, sv, ds, rho;

  HeadBounds(const Shape& s_, const DVec& q_, const DVec& k_, const DVec& v_, const DVec& dout_,
             const RefForward& ref_, Bounds& e_, int64_t b_, int64_t h_)
      : s(s_), q(q_), k(k_), v(v_), dout(dout_), ref(ref_), e(e_), b(b_), h(h_),
        P(ref.p.data() + (b * s.NH + h) * s.S * s.S), L(ref.lse.data() + (b * s.NH + h) * s.S),
        ds_err(static_cast<size_t>(s.S * s.S)), sv(static_cast<size_t>(s.S * s.S)),
        ds(static_cast<size_t>(s.S * s.S)), rho(static_cast<size_t>(s.S)) {}

  double abs_dot(const DVec& a, const DVec& c, int64_t i, int64_t j) const {
    double acc = 0.0;
    for (int64_t d = 0; d < s.HD; ++d) acc += std::fabs(a[at(s, b, i, h, d)] * c[at(s, b, j, h, d)]);
    return acc;
  }

  void forward_row(int64_t i) {
    const int64_t S = s.S, HD = s.HD;
    const double sc = s.scale();
    const int64_t nb = i / 32 + 1;
    double m = -INFINITY;
    for (int64_t j = s.first_key(i); j <= i; ++j) {
      sv[i * S + j] = sc * dot(s, q, k, b, h, i, j);
      m = std::max(m, sv[i * S + j]);
    }
    double R = 0.0;
    for (int64_t j = s.first_key(i); j <= i; ++j) R = std::max(R, m - sv[i * S + j]);
    double lse_err = 0.0;
    for (int64_t j = s.first_key(i); j <= i; ++j) {
      const double dsc = (HD + 1) * kU * sc * abs_dot(q, k, i, j) + kU * std::fabs(sv[i * S + j]);
      rho[j] = dsc + (nb + 1) * (kExpErr + 2 * kU) + kU * (m - sv[i * S + j]) + nb * kU * R;
      lse_err += P[i * S + j] * rho[j];
    }
    e.lse[(b * s.NH + h) * S + i] = lse_err + (S + nb + 1) * kU + kU * std::fabs(L[i]);
    for (int64_t d = 0; d < HD; ++d) {
      const double o = ref.out[at(s, b, i, h, d)];
      double a = 0.0, c = 0.0;
      for (int64_t j = s.first_key(i); j <= i; ++j) {
        const double vj = v[at(s, b, j, h, d)];
        a += (P[i * S + j] * rho[j] + kExpFloor) * std::fabs(vj - o);
        c += P[i * S + j] * std::fabs(vj);
      }
      e.out[at(s, b, i, h, d)] = a + (S + nb + 1) * kU * (c + std::fabs(o)) + (S + 2) * kTiny;
    }
  }

  void ds_row(int64_t i) {
    const int64_t S = s.S, HD = s.HD;
    const double sc = s.scale();
    const double dlse = e.lse[(b * s.NH + h) * S + i];
    double D = 0.0, D_err = 0.0;
    for (int64_t j = s.first_key(i); j <= i; ++j) D += P[i * S + j] * dot(s, dout, v, b, h, i, j);
    for (int64_t d = 0; d < HD; ++d) D_err += std::fabs(dout[at(s, b, i, h, d)]) * e.out[at(s, b, i, h, d)];
    D_err += kU * std::fabs(D);
    for (int64_t j = 0; j < S; ++j) {
      const size_t ij = static_cast<size_t>(i * S + j);
      if (j > i || j < s.first_key(i)) {
        ds[ij] = ds_err[ij] = 0.0;
        continue;
      }
      const double dsc = (HD + 1) * kU * sc * abs_dot(q, k, i, j) + kU * std::fabs(sv[ij]);
      const double pi = dsc + dlse + kExpErr + kU * std::fabs(sv[ij] - L[i]) + 2 * kU;
      const double g = dot(s, dout, v, b, h, i, j) - D;
      const double dp_err = (HD + 1) * kU * abs_dot(dout, v, i, j);
      ds[ij] = P[ij] * g * sc;
      ds_err[ij] = sc * P[ij] * (pi * std::fabs(g) + dp_err + D_err + 3 * kU * std::fabs(g)) +
                   sc * kExpFloor * (std::fabs(g) + dp_err + D_err) + kU * std::fabs(ds[ij]) + 3 * kTiny;
      for (int64_t d = 0; d < HD; ++d) {
        const double pd = P[ij] * std::fabs(dout[at(s, b, i, h, d)]);
        e.dv[at(s, b, j, h, d)] +=
            pd * pi + (S + 1) * kU * pd + kExpFloor * std::fabs(dout[at(s, b, i, h, d)]) + kTiny;
      }
    }
  }

  void dq_dk_row(int64_t i) {
    const int64_t S = s.S;
    for (int64_t j = s.first_key(i); j <= i; ++j) {
      const size_t ij = static_cast<size_t>(i * S + j);
      for (int64_t d = 0; d < s.HD; ++d) {
        const double kj = std::fabs(k[at(s, b, j, h, d)]), qi = std::fabs(q[at(s, b, i, h, d)]);
        e.dq[at(s, b, i, h, d)] += ds_err[ij] * kj + (S + 1) * kU * std::fabs(ds[ij]) * kj + kTiny;
        e.dk[at(s, b, j, h, d)] += ds_err[ij] * qi + (S + 1) * kU * std::fabs(ds[ij]) * qi + kTiny;
      }
    }
  }
};

inline Bounds error_bounds(const Shape& s, const DVec& q, const DVec& k, const DVec& v, const DVec& dout,
                           const RefForward& ref) {
  Bounds e{DVec(s.acts(), 0.0), DVec(s.rows(), 0.0), DVec(s.acts(), 0.0), DVec(s.acts(), 0.0),
           DVec(s.acts(), 0.0)};
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      HeadBounds head(s, q, k, v, dout, ref, e, b, h);
      for (int64_t i = 0; i < s.S; ++i) head.forward_row(i);
      if (dout.empty()) continue;
      for (int64_t i = 0; i < s.S; ++i) head.ds_row(i);
      for (int64_t i = 0; i < s.S; ++i) head.dq_dk_row(i);
    }
  }
  return e;
}

// max over elements of |a - b| / bound: > 1 means outside the bound, and a NaN element is
// infinitely far outside it (std::max would skip it).
inline double worst_ratio(const DVec& a, const DVec& b, const DVec& bound) {
  double w = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(a[i] - b[i]);
    const double r = e == 0.0 ? 0.0 : e / bound[i];  // (e / 0 = inf: outside any bound)
    if (!(r <= w)) w = std::isnan(r) ? INFINITY : r;
  }
  return w;
}

// ---- running the function under test ------------------------------------------------------------

struct Result {
  FVec out, lse, dq, dk, dv;
};

inline Result run_flash(const Shape& s, const Inputs& in) {
  Result r{FVec(s.acts()), FVec(s.rows()), FVec(s.acts()), FVec(s.acts()), FVec(s.acts())};
  flash_attention_forward(r.out, r.lse, in.q, in.k, in.v, s.S, s.NH, s.NH, s.HD, s.W);
  flash_attention_backward(r.dq, r.dk, r.dv, in.dout, r.out, in.q, in.k, in.v, r.lse, s.S, s.NH,
                           s.NH, s.HD, s.W);
  return r;
}

inline Result run_flash(const Shape& s, const Inputs& in, Isa isa) {
  ScopedIsa scoped(isa);
  return run_flash(s, in);
}

// Every element within its bound; prints the worst ratio error / bound (observed, for the record).
inline void expect_within(const char* what, const Shape& s, const FVec& got, const DVec& want,
                   const DVec& bound, const std::string& where, double factor = 1.0) {
  double worst = 0.0;
  size_t at_worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double r = e == 0.0 ? 0.0 : e / (factor * bound[i]);
    if (testing::worse_than(r, worst)) worst = r, at_worst = i;  // a NaN is the worst, and stays
  }
  EXPECT_LE(worst, 1.0) << where << " " << what << " " << s.str() << ": index " << at_worst
                        << " expected " << want[at_worst] << " got " << got[at_worst] << " bound "
                        << factor * bound[at_worst];
  std::printf("  %-9s %-26s %-4s worst error / bound %.3f\n", where.c_str(), s.str().c_str(), what,
              worst);
}

// Bit-for-bit equality (+0 and -0 and NaN payloads told apart).
inline void expect_same_bits(const char* what, const FVec& want, const FVec& got, const std::string& ctx) {
  ASSERT_EQ(want.size(), got.size()) << ctx << " " << what;
  if (std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0) return;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::bit_cast<uint32_t>(want[i]) != std::bit_cast<uint32_t>(got[i])) {
      ADD_FAILURE() << ctx << " " << what << ": first difference at index " << i << ": expected "
                    << want[i] << " got " << got[i];
      return;
    }
  }
}

// Every output of two runs (out, lse, dq, dk, dv) bit for bit.
inline void expect_same_result(const Result& want, const Result& got, const std::string& ctx) {
  expect_same_bits("out", want.out, got.out, ctx);
  expect_same_bits("lse", want.lse, got.lse, ctx);
  expect_same_bits("dq", want.dq, got.dq, ctx);
  expect_same_bits("dk", want.dk, got.dk, ctx);
  expect_same_bits("dv", want.dv, got.dv, ctx);
}

// Every vectorized tier gives the reference tier's bits on every shape (the same operations in
// the same order), with q and k of sd 1 and 4 (inputs from `seed`).
inline void expect_tiers_agree(const std::vector<Shape>& shapes, uint32_t seed, const std::vector<Isa>& tiers) {
  for (float sigma : {1.0f, 4.0f}) {
    for (const Shape& s : shapes) {
      const Inputs in = make_inputs(s, seed, sigma);
      const Result want = run_flash(s, in, Isa::kReference);
      for (Isa isa : tiers) {
        const std::string ctx = std::string(isa_name(isa)) + " vs reference, " + s.str() + (sigma > 1.0f ? " x4" : "");
        expect_same_result(want, run_flash(s, in, isa), ctx);
      }
    }
  }
}

// Shapes: S around the block of 32 (1, 31, 32, 33, 64, 65) and not a multiple of it (37, 100);
// HD a multiple of 16 (16, 64), not (2, 6, 24, 40, 80).
inline const std::vector<Shape>& sweep() {
  static const std::vector<Shape> shapes = {{1, 1, 1, 2},   {2, 31, 2, 6},   {1, 32, 2, 16},
                                            {2, 33, 1, 24}, {2, 37, 3, 8},   {1, 64, 2, 64},
                                            {1, 65, 1, 40}, {2, 100, 2, 64}, {1, 100, 1, 80},
                                            {1, 40, 8, 64}};  // rows 2 KB apart: copied
  return shapes;
}

}  // namespace s3r::model::attention_testing
