#include "s3r/optim/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <vector>
#include <sstream>

#include "core/parallel_blocks.hpp"
#include "kernels/dispatch.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/work.hpp"

namespace s3r::optim {

float LrSchedule::at(int64_t step) const {
  if (step < warmup) return max_lr * static_cast<float>(step + 1) / static_cast<float>(warmup);
  if (step >= total) return min_lr;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return static_cast<float>(min_lr + (max_lr - min_lr) * cosine);
}

namespace {

// Chunks summed side by side (kNormLanes independent chains keep the adder busy; one chain at a
// time waits on each addition's latency).
constexpr int64_t kNormLanes = 8;

// sums[c - c0] for chunks [c0, c1) of g (n elements): each chunk's squares added in order from
// 0.0, as grad_sums_of_squares promises, whether chunks are summed side by side or alone.
void chunk_sums(double* sums, const float* g, int64_t n, int64_t c0, int64_t c1) {
  if (c1 - c0 == kNormLanes && c1 * kNormChunk <= n) {  // whole chunks, side by side
    double ss[kNormLanes] = {};
    const float* first = g + c0 * kNormChunk;
    for (int64_t i = 0; i < kNormChunk; ++i) {
      for (int64_t lane = 0; lane < kNormLanes; ++lane) {
        const double x = first[lane * kNormChunk + i];
        ss[lane] += x * x;
      }
    }
    for (int64_t lane = 0; lane < kNormLanes; ++lane) sums[lane] = ss[lane];
    return;
  }
  for (int64_t c = c0; c < c1; ++c) {
    double ss = 0.0;
    for (int64_t i = c * kNormChunk; i < std::min(n, (c + 1) * kNormChunk); ++i) {
      ss += static_cast<double>(g[i]) * g[i];
    }
    sums[c - c0] = ss;
  }
}

}  // namespace

std::vector<double> grad_sums_of_squares(std::span<const ParamRef> params) {
  std::vector<double> sums;
  for (const ParamRef& p : params) {
    const int64_t n = static_cast<int64_t>(p.grad.size());
    const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
    const size_t first = sums.size();
    work::add_floats(static_cast<uint64_t>(n));
    sums.resize(first + static_cast<size_t>(chunks), 0.0);
    parallel_blocks(chunks, kNormLanes, [&](int64_t c0, int64_t c1) {
      chunk_sums(sums.data() + first + c0, p.grad.data(), n, c0, c1);
    });
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

// Elements per task of the update passes (each element on its own: any split, the same bits).
constexpr int64_t kUpdateBlock = int64_t{1} << 14;

// One pass of the update over every parameter (kernels adamw_update); whether all new weights
// and moments are finite. Writes them only when `write`.
bool update_pass(std::span<const ParamRef> params, const AdamWConfig& c, const AdamWScalars& s,
                 bool write) {
  const auto update = kernels::active_kernels().adamw_update;
  bool finite = true;
  for (const ParamRef& p : params) {
    kernels::AdamWElements e;
    e.w = p.value.data();
    e.m = p.m.data();
    e.v = p.v.data();
    e.g = p.grad.data();
    e.clip = s.clip;
    e.beta1 = c.beta1;
    e.one_minus_beta1 = 1.0f - c.beta1;
    e.beta2 = c.beta2;
    e.one_minus_beta2 = 1.0f - c.beta2;
    e.lr = s.lr;
    e.bias1 = s.bias1;
    e.bias2 = s.bias2;
    e.eps = c.eps;
    e.decay = p.decay ? s.lr * c.weight_decay : 0.0f;
    const int64_t n = static_cast<int64_t>(p.value.size());
    work::add_floats(static_cast<uint64_t>(n) * (write ? 7 : 4));  // w, m, v, g read; w, m, v written
    finite = parallel_blocks_all(n, kUpdateBlock, [&](int64_t i0, int64_t i1) {
      return update(e, i0, i1, write);
    }) && finite;
  }
  return finite;
}

}  // namespace

bool adamw_keeps_finite(std::span<const ParamRef> params, const AdamWConfig& c,
                        const AdamWScalars& s) {
  return update_pass(params, c, s, false);
}

void adamw_apply(std::span<const ParamRef> params, const AdamWConfig& c, const AdamWScalars& s) {
  update_pass(params, c, s, true);
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
