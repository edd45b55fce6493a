// The exact distribution of the rounding errors of the quantized linear layer over its
// thresholds (contracts and the model in linear_rounding_model.hpp).
#include "nn/linear_rounding_model.hpp"

#include <algorithm>
#include <cmath>

#include "check_util.hpp"

namespace s3r::nn::testing {

using s3r::testing::kU32;

namespace {

double ulp32(double v) {  // ulp of an f32 number in the binade of v >= 1
  int e = 0;
  std::frexp(v, &e);
  return std::ldexp(1.0, e - 24);
}

}  // namespace

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

}  // namespace s3r::nn::testing
