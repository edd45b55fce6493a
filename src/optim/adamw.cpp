#include "s3r/optim/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
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

// The pieces of a pass over every parameter, in one parallel loop. A region per parameter left
// a thread idle on each small tensor (a norm gain is one chunk), 57 times a pass at `small`: one
// loop made the optimizer phase 13-14 ms instead of 16 there (Emerald Rapids VM, 2 threads).
struct Piece {
  size_t param;
  int64_t begin, end;  // chunks (the norm) or elements (the update) of that parameter
};

// [0, count(p)) of every parameter cut into pieces of `size`, parameters in order.
template <class Count>
std::vector<Piece> pieces_of(std::span<const ParamRef> params, int64_t size, Count count) {
  std::vector<Piece> pieces;
  for (size_t p = 0; p < params.size(); ++p) {
    const int64_t n = count(params[p]);
    for (int64_t i = 0; i < n; i += size) pieces.push_back({p, i, std::min(n, i + size)});
  }
  return pieces;
}

}  // namespace

std::vector<double> grad_sums_of_squares(std::span<const ParamRef> params) {
  const auto chunks = [](const ParamRef& p) {
    return (static_cast<int64_t>(p.grad.size()) + kNormChunk - 1) / kNormChunk;
  };
  std::vector<size_t> first(params.size() + 1, 0);  // the parameter's first term in `sums`
  for (size_t p = 0; p < params.size(); ++p) {
    first[p + 1] = first[p] + static_cast<size_t>(chunks(params[p]));
    work::add_floats(static_cast<uint64_t>(params[p].grad.size()));
  }
  std::vector<double> sums(first.back(), 0.0);
  const std::vector<Piece> pieces = pieces_of(params, kNormLanes, chunks);
  parallel_blocks_dynamic(static_cast<int64_t>(pieces.size()), 1, [&](int64_t t, int64_t) {
    const Piece& c = pieces[static_cast<size_t>(t)];
    const std::span<const float> g = params[c.param].grad;
    chunk_sums(sums.data() + first[c.param] + c.begin, g.data(), static_cast<int64_t>(g.size()), c.begin, c.end);
  });
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
  std::vector<kernels::AdamWElements> elements;
  elements.reserve(params.size());
  for (const ParamRef& p : params) {
    kernels::AdamWElements& e = elements.emplace_back();
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
    // w, m, v, g read; w, m, v written
    work::add_floats(static_cast<uint64_t>(p.value.size()) * (write ? 7 : 4));
  }
  const std::vector<Piece> pieces =
      pieces_of(params, kUpdateBlock, [](const ParamRef& p) { return static_cast<int64_t>(p.value.size()); });
  return parallel_blocks_all(static_cast<int64_t>(pieces.size()), 1, [&](int64_t t, int64_t) {
    const Piece& piece = pieces[static_cast<size_t>(t)];
    return update(elements[piece.param], piece.begin, piece.end, write);
  });
}

}  // namespace

bool adamw_keeps_finite(std::span<const ParamRef> params, const AdamWConfig& c,
                        const AdamWScalars& s) {
  return update_pass(params, c, s, false);
}

void adamw_apply(std::span<const ParamRef> params, const AdamWConfig& c, const AdamWScalars& s) {
  update_pass(params, c, s, true);
}

namespace {

// Far below FLT_MAX (3.4e38): a value bounded by it stays finite through any rounding below.
constexpr double kFiniteCeiling = 1e37;
// Each bound below is multiplied by this after every operation it covers: far more than the
// relative error of the few correctly rounded f32 operations (2^-24 each) it stands for.
constexpr double kMargin = 1.0 + 1e-6;

// max of the |x| bits of [x, x + n) as uint32 (a finite |x| orders like its bits; a NaN or an
// Inf has all exponent bits set, so the maximum is >= 0x7F800000 then). Integer operations: the
// compiler vectorizes them, and the result is exact.
uint32_t abs_bits_max(const float* x, int64_t n) {
  uint32_t mx = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, sizeof(b));
    mx = std::max(mx, b & 0x7FFFFFFFu);
  }
  return mx;
}

// abs_bits_max of v, and whether some v < 0 (its bits above those of -0; a NaN with its sign
// set counts too, and makes the maximum infinite anyway): one pass for both.
uint32_t abs_bits_max_nonnegative(const float* v, int64_t n, bool* negative) {
  uint32_t mx = 0;
  bool neg = false;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, v + i, sizeof(b));
    neg = neg || b > 0x80000000u;
    mx = std::max(mx, b & 0x7FFFFFFFu);
  }
  *negative = neg;
  return mx;
}

double bits_to_bound(uint32_t bits) {
  if (bits >= 0x7F800000u) return std::numeric_limits<double>::infinity();
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace

bool adamw_proves_finite(const AdamWConfig& c, const AdamWScalars& s, float decay, double w_max,
                         double g_max, const AdamWBounds& b, AdamWBounds* next) {
  const double beta1 = c.beta1, beta2 = c.beta2;
  const double one_minus_beta1 = 1.0f - c.beta1, one_minus_beta2 = 1.0f - c.beta2;
  // kernels.hpp: g' = g clip; m' = beta1 m + (1 - beta1) g'; v' = beta2 v + ((1 - beta2) g') g'
  const double a = g_max * std::fabs(static_cast<double>(s.clip)) * kMargin;  // |g'|
  const double m1 = (beta1 * b.m + one_minus_beta1 * a) * kMargin;
  const double v1 = (beta2 * b.v + one_minus_beta2 * a * a) * kMargin;
  *next = AdamWBounds{b.valid && std::isfinite(m1) && std::isfinite(v1), m1, v1};
  const bool betas = beta1 >= 0.0 && beta2 >= 0.0 && one_minus_beta1 >= 0.0 && one_minus_beta2 >= 0.0;
  if (!b.valid || !betas || !(c.eps > 0.0f) || !(s.bias1 > 0.0f) || !(s.bias2 > 0.0f)) return false;
  // w' = (w - (lr (m' / bias1)) / (sqrt(v' / bias2) + eps)) - decay w: the denominator is at
  // least eps (v' >= 0), so the step is at most lr m1 / (bias1 eps).
  const double x = std::fabs(static_cast<double>(s.lr)) * (m1 / s.bias1) * kMargin;
  const double step = x / c.eps * kMargin;
  const double shrink = std::fabs(static_cast<double>(decay)) * w_max * kMargin;
  const double w1 = (w_max + step + shrink) * kMargin;
  for (const double bound : {a, a * a, m1, v1, m1 / s.bias1, v1 / s.bias2, x, step, shrink, w1}) {
    if (!(bound < kFiniteCeiling)) return false;  // a NaN too
  }
  return true;
}

double weight_abs_max(std::span<const ParamRef> params) {
  const std::vector<Piece> pieces =
      pieces_of(params, kUpdateBlock, [](const ParamRef& p) { return static_cast<int64_t>(p.value.size()); });
  std::vector<uint32_t> piece_max(pieces.size(), 0);
  size_t weights = 0;
  for (const ParamRef& p : params) weights += p.value.size();
  work::add_bytes(static_cast<uint64_t>(weights * sizeof(float)));
  parallel_blocks(static_cast<int64_t>(pieces.size()), 1, [&](int64_t t, int64_t) {
    const Piece& c = pieces[static_cast<size_t>(t)];
    piece_max[static_cast<size_t>(t)] = abs_bits_max(params[c.param].value.data() + c.begin, c.end - c.begin);
  });
  return bits_to_bound(pieces.empty() ? 0u : *std::max_element(piece_max.begin(), piece_max.end()));
}

AdamWBounds moment_bounds(std::span<const ParamRef> params) {
  AdamWBounds b{true, 0.0, 0.0};
  for (const ParamRef& p : params) {
    b.m = std::max(b.m, bits_to_bound(abs_bits_max(p.m.data(), static_cast<int64_t>(p.m.size()))));
    bool negative = false;  // -0 is fine: sqrt(-0) + eps > 0
    b.v = std::max(b.v, bits_to_bound(abs_bits_max_nonnegative(p.v.data(), static_cast<int64_t>(p.v.size()), &negative)));
    b.valid = b.valid && !negative;
  }
  b.valid = b.valid && std::isfinite(b.m) && std::isfinite(b.v);
  return b;
}

bool adamw_update_is_finite(std::span<const ParamRef> params, const AdamWConfig& c,
                            const AdamWScalars& s, double norm, AdamWBounds* bounds) {
  if (bounds == nullptr) return adamw_keeps_finite(params, c, s);
  if (!bounds->valid) *bounds = moment_bounds(params);
  // The kernels' decay: lr * weight_decay on the parameters that decay, 0 on the others.
  const bool decays = std::any_of(params.begin(), params.end(), [](const ParamRef& p) { return p.decay; });
  const float decay = decays ? std::fabs(s.lr * c.weight_decay) : 0.0f;
  // max |g| <= ||g||; the computed norm (a sum of exact squares in double, then sqrt) is short of
  // the exact one by far less than the margin.
  AdamWBounds next;
  const bool proved = adamw_proves_finite(c, s, decay, weight_abs_max(params), norm * kMargin, *bounds, &next);
  const bool finite = proved || adamw_keeps_finite(params, c, s);
  if (finite) *bounds = next;  // the bounds for after the update the caller now applies
  return finite;
}

bool adamw_step(std::span<const ParamRef> params, const AdamWConfig& c, float lr, int64_t t,
                double* norm_out, AdamWBounds* bounds) {
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
  // With bounds, usually proved from them and max |w| instead.
  if (!adamw_update_is_finite(params, c, s, norm, bounds)) return false;
  adamw_apply(params, c, s);  // pass 2
  return true;
}

}  // namespace s3r::optim
