// The double-precision reference of the quantized linear layer (SPEC 1-4) and the f32 error
// bounds of the layer (contracts and notation in linear_reference.hpp).
#include "nn/linear_reference.hpp"

#include <algorithm>
#include <cmath>

#include "check_util.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/bf16.hpp"

namespace s3r::nn::testing {

using s3r::testing::kU32;
using s3r::testing::kU64;

double gamma32(double n) { return n * kU32 / (1.0 - n * kU32); }

std::vector<double> exact_folded(const Problem& p, const Operands& o) {
  std::vector<double> gp(static_cast<size_t>(p.T * p.N));
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t n = 0; n < p.N; ++n) {
      gp[t * p.N + n] = static_cast<double>(o.sx[t]) * p.g[t * p.N + n] * o.sw[n];
    }
  }
  return gp;
}

ErrorStatsD error_stats(const Problem& p, const std::vector<double>& gp,
                        std::span<const int8_t> q, double D) {
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

Magnitudes magnitudes(const Problem& p, std::span<const int8_t> q, const ErrorStatsD& st,
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

namespace {

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

}  // namespace

double ref_slack(const Problem& p, double abs_value) {
  return static_cast<double>(p.T + p.N + p.K + 10) * kU64 * abs_value;
}

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

ExpectedBackward expected_backward_float(const Problem& p, LinearMode mode,
                                         const AlignedVector<float>& dx_old) {
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

ExpectedBackward expected_backward_int8(const Problem& p, const Operands& o, const GradCodes& gc,
                                        Correction correction, const AlignedVector<float>& dx_old) {
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

}  // namespace s3r::nn::testing
