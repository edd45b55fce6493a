#include "s3r/optim/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <vector>
#include <sstream>

#include "s3r/core/error.hpp"

namespace s3r::optim {

float LrSchedule::at(int64_t step) const {
  if (step < warmup) return max_lr * static_cast<float>(step + 1) / static_cast<float>(warmup);
  if (step >= total) return min_lr;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return static_cast<float>(min_lr + (max_lr - min_lr) * cosine);
}

std::vector<double> grad_sums_of_squares(std::span<const ParamRef> params) {
  std::vector<double> sums;
  for (const ParamRef& p : params) {
    const int64_t n = static_cast<int64_t>(p.grad.size());
    const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
    const size_t first = sums.size();
    sums.resize(first + static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      double ss = 0.0;
      for (int64_t i = c * kNormChunk; i < std::min(n, (c + 1) * kNormChunk); ++i) {
        ss += static_cast<double>(p.grad[i]) * p.grad[i];
      }
      sums[first + static_cast<size_t>(c)] = ss;
    }
  }
  return sums;
}

double global_grad_norm(std::span<const ParamRef> params) {
  double total = 0.0;
  for (double ss : grad_sums_of_squares(params)) total += ss;
  return std::sqrt(total);
}

AdamWScalars adamw_scalars(const AdamWConfig& c, float lr, int64_t t, double norm) {
  AdamWScalars s;
  s.lr = lr;
  s.clip = c.clip_norm > 0.0f && norm > c.clip_norm ? static_cast<float>(c.clip_norm / norm) : 1.0f;
  s.bias1 = 1.0f - static_cast<float>(std::pow(c.beta1, static_cast<double>(t)));
  s.bias2 = 1.0f - static_cast<float>(std::pow(c.beta2, static_cast<double>(t)));
  return s;
}

namespace {

// The update of one element, used by both passes (the same operations, so the check sees
// exactly the values the second pass writes).
inline void update(const ParamRef& p, int64_t i, const AdamWConfig& c, const AdamWScalars& s, float decay,
                   float& w, float& m, float& v) {
  const float g = p.grad[i] * s.clip;
  m = c.beta1 * p.m[i] + (1.0f - c.beta1) * g;
  v = c.beta2 * p.v[i] + (1.0f - c.beta2) * g * g;
  const float w0 = p.value[i];
  w = w0 - s.lr * (m / s.bias1) / (std::sqrt(v / s.bias2) + c.eps) - decay * w0;
}

}  // namespace

bool adamw_keeps_finite(std::span<const ParamRef> params, const AdamWConfig& c, const AdamWScalars& s) {
  for (const ParamRef& p : params) {
    const float decay = p.decay ? s.lr * c.weight_decay : 0.0f;
    const int64_t n = static_cast<int64_t>(p.value.size());
    // x * 0 is 0 for a finite x and NaN for Inf or NaN: the sum is 0 exactly when all are
    // finite, in any order (a branch-free loop that vectorizes).
    float poison = 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : poison)
    for (int64_t i = 0; i < n; ++i) {
      float w, m, v;
      update(p, i, c, s, decay, w, m, v);
      poison += w * 0.0f + m * 0.0f + v * 0.0f;
    }
    if (poison != 0.0f) return false;
  }
  return true;
}

void adamw_apply(std::span<const ParamRef> params, const AdamWConfig& c, const AdamWScalars& s) {
  for (const ParamRef& p : params) {
    const float decay = p.decay ? s.lr * c.weight_decay : 0.0f;
    const int64_t n = static_cast<int64_t>(p.value.size());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float w, m, v;
      update(p, i, c, s, decay, w, m, v);
      p.m[i] = m;
      p.v[i] = v;
      p.value[i] = w;
    }
  }
}

bool adamw_step(std::span<const ParamRef> params, const AdamWConfig& c, float lr, int64_t t,
                double* norm_out) {
  for (const ParamRef& p : params) {
    if (p.grad.size() != p.value.size() || p.m.size() != p.value.size() ||
        p.v.size() != p.value.size()) {
      std::ostringstream msg;
      msg << "adamw_step: parameter '" << p.name << "' has value/grad/m/v sizes " << p.value.size()
          << "/" << p.grad.size() << "/" << p.m.size() << "/" << p.v.size();
      throw Error(msg.str());
    }
  }
  if (t < 1) throw Error("adamw_step: step t must be >= 1, got " + std::to_string(t));
  if (!std::isfinite(lr)) throw Error("adamw_step: the learning rate is not finite (" + std::to_string(lr) + ")");
  const double norm = global_grad_norm(params);
  if (norm_out) *norm_out = norm;
  if (!std::isfinite(norm)) return false;
  const AdamWScalars s = adamw_scalars(c, lr, t, norm);
  // Pass 1: would every new weight and moment be finite? (A finite gradient can still overflow
  // them: a huge learning rate, or weights near FLT_MAX.) If not, the step is skipped whole.
  if (!adamw_keeps_finite(params, c, s)) return false;
  adamw_apply(params, c, s);  // pass 2
  return true;
}

}  // namespace s3r::optim
