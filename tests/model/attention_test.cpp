// Fused causal attention (s3r/model/attention.hpp) against a double-precision reference written
// here from the definition (naive softmax over the full score row), against finite differences
// of that reference, and against the two-pass f32 attention of layers.hpp; the causal mask, S not
// a multiple of the block, thread-count invariance and the kernel tiers bit for bit.
//
// Tolerances are first-order error bounds of each element computed from the data (error_bounds
// below: f32 unit roundoff u = 2^-24, the polynomial exp's 2^-21, the lengths of the fma chains),
// never tuned by eye; each test of a tolerance is paired with mutated references
// (mask off by one, a missing rescale, a dropped D or scale) that it must reject by a wide margin.
#include "s3r/model/attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "s3r/core/error.hpp"
#include "s3r/core/isa.hpp"
#include "s3r/model/layers.hpp"
#include "check_util.hpp"
#include "test_util.hpp"

namespace s3r::model {
namespace {

using DVec = std::vector<double>;
using FVec = std::vector<float>;

constexpr double kU = 0x1p-24;       // f32 unit roundoff
constexpr double kExpErr = 0x1p-21;  // relative error bound of the polynomial exp
// exp_poly clamps its argument at -87: a probability below e^-87 comes out as e^-87 (1.65e-38),
// an absolute error below kExpFloor; and each f32 operation on subnormals rounds to 2^-149.
constexpr double kExpFloor = 1.7e-38;
constexpr double kTiny = 0x1p-149;

struct Shape {
  int64_t B, S, NH, HD;
  int64_t C() const { return NH * HD; }
  int64_t T() const { return B * S; }
  size_t acts() const { return static_cast<size_t>(T() * C()); }
  size_t rows() const { return static_cast<size_t>(B * NH * S); }
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(HD)); }
  std::string str() const {
    return "B=" + std::to_string(B) + " S=" + std::to_string(S) + " NH=" + std::to_string(NH) +
           " HD=" + std::to_string(HD);
  }
};

FVec random_vec(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  FVec v(n);
  for (auto& x : v) x = normal(gen);
  return v;
}

DVec to_double(const FVec& v) { return {v.begin(), v.end()}; }

struct Inputs {
  FVec q, k, v, dout;
};

// q and k ~ N(0, qk_sigma^2): qk_sigma = 4 spreads the scores (std 16) so that the running
// maximum moves often and the rescaling matters.
Inputs make_inputs(const Shape& s, uint32_t seed, float qk_sigma = 1.0f) {
  return {random_vec(s.acts(), seed, qk_sigma), random_vec(s.acts(), seed + 1, qk_sigma),
          random_vec(s.acts(), seed + 2), random_vec(s.acts(), seed + 3)};
}

size_t at(const Shape& s, int64_t b, int64_t t, int64_t h, int64_t d) {
  return static_cast<size_t>((b * s.S + t) * s.C() + h * s.HD + d);
}

double dot(const Shape& s, const DVec& a, const DVec& b, int64_t bb, int64_t h, int64_t i,
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

// softmax over keys j <= i + mask_offset (mask_offset = 1 is the off-by-one mutant).
RefForward reference_forward(const Shape& s, const DVec& q, const DVec& k, const DVec& v,
                             int64_t mask_offset = 0) {
  RefForward r{DVec(s.acts(), 0.0), DVec(s.rows()), DVec(s.rows() * s.S, 0.0)};
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      for (int64_t i = 0; i < s.S; ++i) {
        const int64_t last = std::min(s.S - 1, i + mask_offset);
        double* p = r.p.data() + ((b * s.NH + h) * s.S + i) * s.S;
        double mx = -INFINITY;
        for (int64_t j = 0; j <= last; ++j) {
          p[j] = s.scale() * dot(s, q, k, b, h, i, j);
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= last; ++j) sum += std::exp(p[j] - mx);
        for (int64_t j = 0; j <= last; ++j) p[j] = std::exp(p[j] - mx) / sum;
        r.lse[(b * s.NH + h) * s.S + i] = mx + std::log(sum);
        for (int64_t j = 0; j <= last; ++j) {
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
DVec forward_without_rescale(const Shape& s, const DVec& q, const DVec& k, const DVec& v) {
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
RefGrads reference_backward(const Shape& s, const DVec& q, const DVec& k, const DVec& v,
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

double max_abs(const DVec& x) {
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

Bounds error_bounds(const Shape& s, const DVec& q, const DVec& k, const DVec& v, const DVec& dout,
                    const RefForward& ref) {
  Bounds e{DVec(s.acts(), 0.0), DVec(s.rows(), 0.0), DVec(s.acts(), 0.0), DVec(s.acts(), 0.0),
           DVec(s.acts(), 0.0)};
  const int64_t S = s.S, HD = s.HD;
  const double sc = s.scale();
  DVec ds_err(static_cast<size_t>(S * S)), sv(static_cast<size_t>(S * S)),
      ds(static_cast<size_t>(S * S));
  DVec rho(static_cast<size_t>(S));
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const double* P = ref.p.data() + (b * s.NH + h) * S * S;
      const double* L = ref.lse.data() + (b * s.NH + h) * S;
      auto abs_dot = [&](const DVec& a, const DVec& c, int64_t i, int64_t j) {
        double acc = 0.0;
        for (int64_t d = 0; d < HD; ++d)
          acc += std::fabs(a[at(s, b, i, h, d)] * c[at(s, b, j, h, d)]);
        return acc;
      };
      for (int64_t i = 0; i < S; ++i) {  // forward, row i
        const int64_t nb = i / 32 + 1;
        double m = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          sv[i * S + j] = sc * dot(s, q, k, b, h, i, j);
          m = std::max(m, sv[i * S + j]);
        }
        double R = 0.0;
        for (int64_t j = 0; j <= i; ++j) R = std::max(R, m - sv[i * S + j]);
        double lse_err = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          const double dsc =
              (HD + 1) * kU * sc * abs_dot(q, k, i, j) + kU * std::fabs(sv[i * S + j]);
          rho[j] = dsc + (nb + 1) * (kExpErr + 2 * kU) + kU * (m - sv[i * S + j]) + nb * kU * R;
          lse_err += P[i * S + j] * rho[j];
        }
        e.lse[(b * s.NH + h) * S + i] = lse_err + (S + nb + 1) * kU + kU * std::fabs(L[i]);
        for (int64_t d = 0; d < HD; ++d) {
          const double o = ref.out[at(s, b, i, h, d)];
          double a = 0.0, c = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            const double vj = v[at(s, b, j, h, d)];
            a += (P[i * S + j] * rho[j] + kExpFloor) * std::fabs(vj - o);
            c += P[i * S + j] * std::fabs(vj);
          }
          e.out[at(s, b, i, h, d)] = a + (S + nb + 1) * kU * (c + std::fabs(o)) + (S + 2) * kTiny;
        }
      }
      if (dout.empty()) continue;
      for (int64_t i = 0; i < S; ++i) {  // backward: ds and its error, row i
        const double dlse = e.lse[(b * s.NH + h) * S + i];
        double D = 0.0, D_err = 0.0;
        for (int64_t j = 0; j <= i; ++j) D += P[i * S + j] * dot(s, dout, v, b, h, i, j);
        for (int64_t d = 0; d < HD; ++d) {
          D_err += std::fabs(dout[at(s, b, i, h, d)]) * e.out[at(s, b, i, h, d)];
        }
        D_err += kU * std::fabs(D);
        for (int64_t j = 0; j < S; ++j) {
          const size_t ij = static_cast<size_t>(i * S + j);
          if (j > i) {
            ds[ij] = ds_err[ij] = 0.0;
            continue;
          }
          const double dsc = (HD + 1) * kU * sc * abs_dot(q, k, i, j) + kU * std::fabs(sv[ij]);
          const double pi = dsc + dlse + kExpErr + kU * std::fabs(sv[ij] - L[i]) + 2 * kU;
          const double g = dot(s, dout, v, b, h, i, j) - D;
          const double dp_err = (HD + 1) * kU * abs_dot(dout, v, i, j);
          ds[ij] = P[ij] * g * sc;
          ds_err[ij] = sc * P[ij] * (pi * std::fabs(g) + dp_err + D_err + 3 * kU * std::fabs(g)) +
                       sc * kExpFloor * (std::fabs(g) + dp_err + D_err) + kU * std::fabs(ds[ij]) +
                       3 * kTiny;
          for (int64_t d = 0; d < HD; ++d) {
            const double pd = P[ij] * std::fabs(dout[at(s, b, i, h, d)]);
            e.dv[at(s, b, j, h, d)] += pd * pi + (S + 1) * kU * pd +
                                       kExpFloor * std::fabs(dout[at(s, b, i, h, d)]) + kTiny;
          }
        }
      }
      for (int64_t i = 0; i < S; ++i) {
        for (int64_t j = 0; j <= i; ++j) {
          const size_t ij = static_cast<size_t>(i * S + j);
          for (int64_t d = 0; d < HD; ++d) {
            const double kj = std::fabs(k[at(s, b, j, h, d)]), qi = std::fabs(q[at(s, b, i, h, d)]);
            e.dq[at(s, b, i, h, d)] +=
                ds_err[ij] * kj + (S + 1) * kU * std::fabs(ds[ij]) * kj + kTiny;
            e.dk[at(s, b, j, h, d)] +=
                ds_err[ij] * qi + (S + 1) * kU * std::fabs(ds[ij]) * qi + kTiny;
          }
        }
      }
    }
  }
  return e;
}

// max over elements of |a - b| / bound: > 1 means outside the bound, and a NaN element is
// infinitely far outside it (std::max would skip it).
double worst_ratio(const DVec& a, const DVec& b, const DVec& bound) {
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

Result run_flash(const Shape& s, const Inputs& in) {
  Result r{FVec(s.acts()), FVec(s.rows()), FVec(s.acts()), FVec(s.acts()), FVec(s.acts())};
  flash_attention_forward(r.out, r.lse, in.q, in.k, in.v, s.S, s.NH, s.HD);
  flash_attention_backward(r.dq, r.dk, r.dv, in.dout, r.out, in.q, in.k, in.v, r.lse, s.S, s.NH,
                           s.HD);
  return r;
}

Result run_flash(const Shape& s, const Inputs& in, Isa isa) {
  ScopedIsa scoped(isa);
  return run_flash(s, in);
}

// Every element within its bound; prints the worst ratio error / bound (observed, for the record).
void expect_within(const char* what, const Shape& s, const FVec& got, const DVec& want,
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
void expect_same_bits(const char* what, const FVec& want, const FVec& got, const std::string& ctx) {
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

// Shapes: S around the block of 32 (1, 31, 32, 33, 64, 65) and not a multiple of it (37, 100);
// HD a multiple of 16 (16, 64), not (2, 6, 24, 40, 80).
const std::vector<Shape>& sweep() {
  static const std::vector<Shape> shapes = {{1, 1, 1, 2},   {2, 31, 2, 6},   {1, 32, 2, 16},
                                            {2, 33, 1, 24}, {2, 37, 3, 8},   {1, 64, 2, 64},
                                            {1, 65, 1, 40}, {2, 100, 2, 64}, {1, 100, 1, 80}};
  return shapes;
}

// ---- tests
// ----------------------------------------------------------------------------------------

TEST(FlashAttention, ForwardMatchesDoubleReference) {
  const auto tiers = testing::runnable_isas();
  for (float sigma : {1.0f, 4.0f}) {
    for (const Shape& s : sweep()) {
      const Inputs in = make_inputs(s, 11, sigma);
      const DVec q = to_double(in.q), k = to_double(in.k), v = to_double(in.v);
      const RefForward ref = reference_forward(s, q, k, v);
      const Bounds eb = error_bounds(s, q, k, v, {}, ref);
      for (Isa isa : tiers) {
        const Result r = run_flash(s, in, isa);
        const std::string where = std::string(isa_name(isa)) + (sigma > 1.0f ? "/x4" : "");
        expect_within("out", s, r.out, ref.out, eb.out, where);
        expect_within("lse", s, r.lse, ref.lse, eb.lse, where);
      }
    }
  }
}

// The forward bounds reject a causal mask off by one (row i also sees key i + 1) and an online
// softmax that does not rescale its output when the maximum grows, by 10x or more.
TEST(FlashAttention, ForwardBoundsCatchMaskOffByOneAndMissingRescale) {
  for (float sigma : {1.0f, 4.0f}) {
    for (const Shape& s : {Shape{2, 37, 3, 8}, Shape{2, 100, 2, 64}}) {
      const Inputs in = make_inputs(s, 11, sigma);
      const DVec q = to_double(in.q), k = to_double(in.k), v = to_double(in.v);
      const RefForward ref = reference_forward(s, q, k, v);
      const Bounds eb = error_bounds(s, q, k, v, {}, ref);
      const RefForward off = reference_forward(s, q, k, v, 1);
      const std::string ctx = s.str() + (sigma > 1.0f ? " x4" : "");
      EXPECT_GT(worst_ratio(off.out, ref.out, eb.out), 10.0) << "mask off by one, out, " << ctx;
      EXPECT_GT(worst_ratio(off.lse, ref.lse, eb.lse), 10.0) << "mask off by one, lse, " << ctx;
      const DVec bad = forward_without_rescale(s, q, k, v);
      EXPECT_GT(worst_ratio(bad, ref.out, eb.out), 10.0) << "missing rescale, " << ctx;
    }
  }
}

TEST(FlashAttention, BackwardMatchesDoubleReference) {
  const auto tiers = testing::runnable_isas();
  for (float sigma : {1.0f, 4.0f}) {
    for (const Shape& s : sweep()) {
      const Inputs in = make_inputs(s, 21, sigma);
      const DVec q = to_double(in.q), k = to_double(in.k), v = to_double(in.v);
      const DVec dout = to_double(in.dout);
      const RefForward ref = reference_forward(s, q, k, v);
      const RefGrads g = reference_backward(s, q, k, v, dout, ref);
      const Bounds eb = error_bounds(s, q, k, v, dout, ref);
      for (Isa isa : tiers) {
        const Result r = run_flash(s, in, isa);
        const std::string where = std::string(isa_name(isa)) + (sigma > 1.0f ? "/x4" : "");
        expect_within("dq", s, r.dq, g.dq, eb.dq, where);
        expect_within("dk", s, r.dk, g.dk, eb.dk, where);
        expect_within("dv", s, r.dv, g.dv, eb.dv, where);
      }
    }
  }
}

// The backward bounds reject a mask off by one, a missing D_i and a missing 1/sqrt(HD), by 10x.
TEST(FlashAttention, BackwardBoundsCatchPlausibleBugs) {
  for (const Shape& s : {Shape{2, 37, 3, 8}, Shape{2, 100, 2, 64}}) {
    const Inputs in = make_inputs(s, 21);
    const DVec q = to_double(in.q), k = to_double(in.k), v = to_double(in.v);
    const DVec dout = to_double(in.dout);
    const RefForward ref = reference_forward(s, q, k, v);
    const RefGrads g = reference_backward(s, q, k, v, dout, ref);
    const Bounds eb = error_bounds(s, q, k, v, dout, ref);
    struct Mutant {
      const char* name;
      RefGrads grads;
      bool changes_dv;
    };
    const RefForward off = reference_forward(s, q, k, v, 1);
    const Mutant mutants[] = {
        {"mask off by one", reference_backward(s, q, k, v, dout, off), true},
        {"no D", reference_backward(s, q, k, v, dout, ref, true, false), false},
        {"no scale", reference_backward(s, q, k, v, dout, ref, false, true), false}};
    for (const Mutant& m : mutants) {
      EXPECT_GT(worst_ratio(m.grads.dq, g.dq, eb.dq), 10.0) << m.name << " dq, " << s.str();
      EXPECT_GT(worst_ratio(m.grads.dk, g.dk, eb.dk), 10.0) << m.name << " dk, " << s.str();
      if (m.changes_dv) {
        EXPECT_GT(worst_ratio(m.grads.dv, g.dv, eb.dv), 10.0) << m.name << " dv, " << s.str();
      }
    }
  }
}

// Central differences of L = sum(out * r) through the double forward, on a tiny shape, for every
// element of q, k and v. The double analytic reference must match them to 1e-7 relative (so it
// is a valid reference for the other tests), the f32 kernels within their bound (plus the
// differences' own error: truncation O(h^2) and rounding O(1e-16 / h), below 1e-8 relative).
TEST(FlashAttention, BackwardMatchesFiniteDifferences) {
  const Shape s{2, 5, 2, 4};
  const Inputs in = make_inputs(s, 31);
  DVec x[3] = {to_double(in.q), to_double(in.k), to_double(in.v)};
  const DVec r = to_double(in.dout);
  auto loss = [&] {
    const RefForward f = reference_forward(s, x[0], x[1], x[2]);
    double L = 0.0;
    for (size_t i = 0; i < f.out.size(); ++i) L += f.out[i] * r[i];
    return L;
  };
  const RefForward ref = reference_forward(s, x[0], x[1], x[2]);
  const RefGrads g = reference_backward(s, x[0], x[1], x[2], r, ref);
  const Bounds eb = error_bounds(s, x[0], x[1], x[2], r, ref);
  DVec fd[3];
  for (int t = 0; t < 3; ++t) {
    for (size_t i = 0; i < x[t].size(); ++i) {
      const double v0 = x[t][i], h = 1e-5 * (std::fabs(v0) + 1.0);
      x[t][i] = v0 + h;
      const double lp = loss();
      x[t][i] = v0 - h;
      const double lm = loss();
      x[t][i] = v0;
      fd[t].push_back((lp - lm) / (2 * h));
    }
  }
  const char* names[3] = {"dq", "dk", "dv"};
  const DVec* analytic[3] = {&g.dq, &g.dk, &g.dv};
  const DVec* bound[3] = {&eb.dq, &eb.dk, &eb.dv};
  for (int t = 0; t < 3; ++t) {
    const double scale = max_abs(*analytic[t]);
    ASSERT_GT(scale, 0.0) << names[t];
    for (size_t i = 0; i < fd[t].size(); ++i) {
      EXPECT_NEAR((*analytic[t])[i], fd[t][i], 1e-7 * scale)
          << "double reference " << names[t] << "[" << i << "]";
    }
  }
  for (Isa isa : testing::runnable_isas()) {
    const Result res = run_flash(s, in, isa);
    const FVec* flash[3] = {&res.dq, &res.dk, &res.dv};
    for (int t = 0; t < 3; ++t) {
      const double slack = 1e-8 * max_abs(fd[t]);
      for (size_t i = 0; i < fd[t].size(); ++i) {
        EXPECT_NEAR((*flash[t])[i], fd[t][i], (*bound[t])[i] + slack)
            << isa_name(isa) << " " << names[t] << "[" << i << "]";
      }
    }
  }
}

// Against the existing attention_forward / attention_backward (oneDNN f32 products, probabilities
// saved): both are f32 approximations of the same function, with errors of the same kind, so
// they agree within twice our bound; the differences are printed.
TEST(FlashAttention, MatchesTwoPassAttention) {
  for (const Shape& s : {Shape{2, 100, 2, 64}, Shape{2, 256, 2, 64}, Shape{4, 32, 4, 16}}) {
    const Inputs in = make_inputs(s, 41);
    const DVec q = to_double(in.q), k = to_double(in.k), v = to_double(in.v);
    const DVec dout = to_double(in.dout);
    const RefForward ref = reference_forward(s, q, k, v);
    const Bounds eb = error_bounds(s, q, k, v, dout, ref);
    FVec out(s.acts()), probs(s.rows() * s.S), dq(s.acts()), dk(s.acts()), dv(s.acts());
    attention_forward(out, probs, in.q, in.k, in.v, s.S, s.NH, s.HD);
    attention_backward(dq, dk, dv, in.dout, in.q, in.k, in.v, probs, s.S, s.NH, s.HD);
    const Result r = run_flash(s, in);
    struct Pair {
      const char* name;
      const FVec& flash;
      const FVec& two_pass;
      const DVec& bound;
    };
    const Pair pairs[] = {{"out", r.out, out, eb.out},
                          {"dq", r.dq, dq, eb.dq},
                          {"dk", r.dk, dk, eb.dk},
                          {"dv", r.dv, dv, eb.dv}};
    for (const Pair& p : pairs) {
      expect_within(p.name, s, p.flash, DVec(p.two_pass.begin(), p.two_pass.end()), p.bound,
                    "two-pass", 2.0);
      double worst = 0.0, big = 0.0;
      for (size_t i = 0; i < p.flash.size(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(p.flash[i]) - p.two_pass[i]));
        big = std::max(big, std::fabs(static_cast<double>(p.two_pass[i])));
      }
      std::printf("  vs two-pass %-26s %-3s max |diff| %.3g = %.3g of max |value| %.3g\n",
                  s.str().c_str(), p.name, worst, worst / big, big);
    }
  }
}

// Changing the key and value of token t of one example leaves every output, lse and dq row
// before t bit for bit the same (and everything in the other examples), and does change row t.
TEST(FlashAttention, CausalMaskFutureTokensChangeNothingEarlier) {
  const Shape s{2, 70, 2, 16};
  for (Isa isa : testing::runnable_isas()) {
    for (int64_t t : {1, 31, 32, 33, 40, 69}) {
      const Inputs in = make_inputs(s, 51);
      Inputs changed = in;
      const FVec fresh = random_vec(s.C(), 52 + static_cast<uint32_t>(t), 30.0f);
      for (int64_t c = 0; c < s.C(); ++c) {
        changed.k[at(s, 1, t, 0, c)] = fresh[c];
        changed.v[at(s, 1, t, 0, c)] = -fresh[c];
      }
      const Result a = run_flash(s, in, isa), b = run_flash(s, changed, isa);
      const std::string ctx = std::string(isa_name(isa)) + " t=" + std::to_string(t);
      const size_t before = at(s, 1, t, 0, 0);  // example 0 and the rows of example 1 before t
      expect_same_bits("out", FVec(a.out.begin(), a.out.begin() + before),
                       FVec(b.out.begin(), b.out.begin() + before), ctx);
      expect_same_bits("dq", FVec(a.dq.begin(), a.dq.begin() + before),
                       FVec(b.dq.begin(), b.dq.begin() + before), ctx);
      for (int64_t h = 0; h < s.NH; ++h) {
        for (int64_t i = 0; i < s.S; ++i) {
          const size_t r0 = static_cast<size_t>(h * s.S + i),
                       r1 = static_cast<size_t>((s.NH + h) * s.S + i);
          EXPECT_EQ(std::bit_cast<uint32_t>(a.lse[r0]), std::bit_cast<uint32_t>(b.lse[r0])) << ctx;
          if (i < t) {
            EXPECT_EQ(std::bit_cast<uint32_t>(a.lse[r1]), std::bit_cast<uint32_t>(b.lse[r1]))
                << ctx << " i=" << i;
          }
        }
      }
      bool row_t_changed = false;
      for (int64_t c = 0; c < s.C(); ++c)
        row_t_changed |= a.out[at(s, 1, t, 0, c)] != b.out[at(s, 1, t, 0, c)];
      EXPECT_TRUE(row_t_changed) << ctx << ": the change did not reach row t (vacuous test)";
    }
  }
}

TEST(FlashAttention, SameBitsForAnyThreadCount) {
  for (Isa isa : testing::runnable_isas()) {
    for (const Shape& s : {Shape{3, 100, 2, 24}, Shape{2, 64, 3, 64}, Shape{1, 37, 1, 6}}) {
      const Inputs in = make_inputs(s, 61);
      Result one;
      {
        testing::ScopedThreads threads(1);
        one = run_flash(s, in, isa);
      }
      for (int n : {2, 3}) {
        testing::ScopedThreads threads(n);
        const Result r = run_flash(s, in, isa);
        const std::string ctx =
            std::string(isa_name(isa)) + " " + s.str() + " threads=" + std::to_string(n);
        expect_same_bits("out", one.out, r.out, ctx);
        expect_same_bits("lse", one.lse, r.lse, ctx);
        expect_same_bits("dq", one.dq, r.dq, ctx);
        expect_same_bits("dk", one.dk, r.dk, ctx);
        expect_same_bits("dv", one.dv, r.dv, ctx);
      }
    }
  }
}

// Every vectorized tier gives the reference tier's bits (the same operations in the same order).
TEST(FlashAttention, TiersAgreeBitForBit) {
  const auto tiers = testing::vector_isas();
  S3R_SKIP_WITHOUT_VECTOR_TIERS(tiers);
  for (float sigma : {1.0f, 4.0f}) {
    for (const Shape& s : sweep()) {
      const Inputs in = make_inputs(s, 71, sigma);
      const Result want = run_flash(s, in, Isa::kReference);
      for (Isa isa : tiers) {
        const Result got = run_flash(s, in, isa);
        const std::string ctx =
            std::string(isa_name(isa)) + " vs reference, " + s.str() + (sigma > 1.0f ? " x4" : "");
        expect_same_bits("out", want.out, got.out, ctx);
        expect_same_bits("lse", want.lse, got.lse, ctx);
        expect_same_bits("dq", want.dq, got.dq, ctx);
        expect_same_bits("dk", want.dk, got.dk, ctx);
        expect_same_bits("dv", want.dv, got.dv, ctx);
      }
    }
  }
}

// A wrong size is an s3r::Error naming the function, the tensor, its size and the expected one.
TEST(FlashAttention, WrongSizesAreClearErrors) {
  const Shape s{2, 5, 2, 4};  // T = 10, C = 8
  const Inputs in = make_inputs(s, 81);
  FVec out(s.acts()), lse(s.rows()), dq(s.acts()), dk(s.acts()), dv(s.acts());
  auto message = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  FVec short_lse(s.rows() - 1), short_k(s.acts() - 8), odd_q(s.acts() - 8);
  EXPECT_EQ(message([&] { flash_attention_forward(out, short_lse, in.q, in.k, in.v, 5, 2, 4); }),
            "flash_attention_forward: lse has 19 elements, expected 20");
  EXPECT_EQ(message([&] { flash_attention_forward(out, lse, in.q, short_k, in.v, 5, 2, 4); }),
            "flash_attention_forward: k has 72 elements, expected 80");
  EXPECT_EQ(message([&] { flash_attention_forward(out, lse, odd_q, in.k, in.v, 5, 2, 4); }),
            "flash_attention_forward: q has 72 elements, not a multiple of S * C = 5 * 8 (whole "
            "examples of S tokens, C = heads * head_dim)");
  EXPECT_EQ(message([&] { flash_attention_forward(out, lse, in.q, in.k, in.v, 5, 0, 4); }),
            "flash_attention_forward: heads must be >= 1, got 0");
  EXPECT_EQ(message([&] { flash_attention_forward(out, lse, in.q, in.k, in.v, 5, 2, 4); }),
            "(no error)");
  FVec short_dv(s.acts() - 1);
  EXPECT_EQ(message([&] {
              flash_attention_backward(dq, dk, short_dv, in.dout, out, in.q, in.k, in.v, lse, 5, 2,
                                       4);
            }),
            "flash_attention_backward: dv has 79 elements, expected 80");
  EXPECT_EQ(message([&] {
              flash_attention_backward(dq, dk, dv, in.dout, out, in.q, in.k, in.v, short_lse, 5, 2,
                                       4);
            }),
            "flash_attention_backward: lse has 19 elements, expected 20");
  EXPECT_EQ(message([&] {
              flash_attention_backward(dq, dk, dv, in.dout, out, in.q, in.k, in.v, lse, 0, 2, 4);
            }),
            "flash_attention_backward: seq_len must be >= 1, got 0");
}

}  // namespace
}  // namespace s3r::model
