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

double global_grad_norm(std::span<const ParamRef> params) {
  // Partial sums over fixed chunks, added in order: the same bits for any thread count.
  constexpr int64_t kChunk = 1 << 14;
  double total = 0.0;
  std::vector<double> partial;
  for (const ParamRef& p : params) {
    const int64_t n = static_cast<int64_t>(p.grad.size());
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    partial.assign(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      double ss = 0.0;
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
        ss += static_cast<double>(p.grad[i]) * p.grad[i];
      }
      partial[c] = ss;
    }
    for (double ss : partial) total += ss;
  }
  return std::sqrt(total);
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
  const float clip = c.clip_norm > 0.0f && norm > c.clip_norm ? static_cast<float>(c.clip_norm / norm) : 1.0f;
  const float bc1 = 1.0f - static_cast<float>(std::pow(c.beta1, static_cast<double>(t)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(c.beta2, static_cast<double>(t)));
  // The update of one element, used by both passes below (the same operations, so the check
  // sees exactly the values the second pass writes).
  const auto update = [&](const ParamRef& p, int64_t i, float decay, float& w, float& m, float& v) {
    const float g = p.grad[i] * clip;
    m = c.beta1 * p.m[i] + (1.0f - c.beta1) * g;
    v = c.beta2 * p.v[i] + (1.0f - c.beta2) * g * g;
    const float w0 = p.value[i];
    w = w0 - lr * (m / bc1) / (std::sqrt(v / bc2) + c.eps) - decay * w0;
  };
  // Pass 1: would every new weight and moment be finite? (A finite gradient can still overflow
  // them: a huge learning rate, or weights near FLT_MAX.) If not, the step is skipped whole.
  for (const ParamRef& p : params) {
    const float decay = p.decay ? lr * c.weight_decay : 0.0f;
    const int64_t n = static_cast<int64_t>(p.value.size());
    // x * 0 is 0 for a finite x and NaN for Inf or NaN: the sum is 0 exactly when all are
    // finite, in any order (a branch-free loop that vectorizes).
    float poison = 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : poison)
    for (int64_t i = 0; i < n; ++i) {
      float w, m, v;
      update(p, i, decay, w, m, v);
      poison += w * 0.0f + m * 0.0f + v * 0.0f;
    }
    if (poison != 0.0f) return false;
  }
  // Pass 2: apply.
  for (const ParamRef& p : params) {
    const float decay = p.decay ? lr * c.weight_decay : 0.0f;
    const int64_t n = static_cast<int64_t>(p.value.size());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float w, m, v;
      update(p, i, decay, w, m, v);
      p.m[i] = m;
      p.v[i] = v;
      p.value[i] = w;
    }
  }
  return true;
}

}  // namespace s3r::optim
