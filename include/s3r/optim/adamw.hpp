#pragma once
// AdamW with decoupled weight decay, fp32 master weights and moments, a linear warm-up then cosine
// decay, and global gradient-norm clipping.
//
//   g' = g * min(1, clip / ||g||)                 (||g|| over all parameters, in double)
//   m  = b1 m + (1 - b1) g',   v = b2 v + (1 - b2) g'^2
//   w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + lr * wd * w   (wd where decay)
// A non-finite gradient norm, or an update that would make any weight or moment non-finite (a
// huge learning rate, weights near FLT_MAX), skips the step: nothing changes and adamw_step
// returns false. So the optimizer never turns a finite state into a non-finite one.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace s3r::optim {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float clip_norm = 1.0f;  // <= 0: no clipping
};

// One parameter tensor and its optimizer state (all of one size).
struct ParamRef {
  std::string name;
  std::span<float> value, grad, m, v;
  bool decay = true;  // weight decay applies (matrices); norms' gains usually do not
};

// Linear warm-up from max_lr / warmup to max_lr over `warmup` steps, then cosine decay to
// min_lr at `total` steps (and min_lr after). Steps count from 0.
struct LrSchedule {
  float max_lr = 3e-4f;
  float min_lr = 3e-5f;
  int64_t warmup = 100;
  int64_t total = 1000;
  float at(int64_t step) const;
};

// sqrt(sum of squared gradients) over all parameters, in double; NaN or Inf if any is. The sum
// is formed as grad_sums_of_squares below, its terms added in order: the same bits for any
// thread count.
double global_grad_norm(std::span<const ParamRef> params);

// The elements of each tensor, cut into chunks of kNormChunk from its start (the last one
// shorter); the norm's partial sums are per chunk.
inline constexpr int64_t kNormChunk = int64_t{1} << 14;
// Sum of squared gradients of every chunk, in double: tensors in order, chunks in order. A
// caller holding a share of the parameters (ParamRefs that start at chunk boundaries of their
// tensors) gets exactly its chunks' terms of the whole list.
std::vector<double> grad_sums_of_squares(std::span<const ParamRef> params);

// The per-step scalars of adamw_step, from the gradient norm: the clipping factor and the bias
// corrections at step t.
struct AdamWScalars {
  float lr = 0.0f, clip = 1.0f, bias1 = 1.0f, bias2 = 1.0f;
};
AdamWScalars adamw_scalars(const AdamWConfig& config, float lr, int64_t t, double norm);
// The two passes of adamw_step over `params` (each element on its own: any share of the
// parameters gives the same bits as the whole): whether every new weight and moment would be
// finite, and the update itself.
bool adamw_keeps_finite(std::span<const ParamRef> params, const AdamWConfig& config, const AdamWScalars& s);
void adamw_apply(std::span<const ParamRef> params, const AdamWConfig& config, const AdamWScalars& s);

// Bounds on the moments between steps: max |m| <= m and 0 <= v <= this v for every element,
// while `valid`. Whoever owns the moments keeps them across adamw_step calls and sets valid =
// false whenever anything else writes the moments (a checkpoint load). They let adamw_step
// prove that an update stays finite without the pass that checks every element (a third of the
// optimizer's memory traffic), at the cost of a pass over the weights for max |w|.
struct AdamWBounds {
  bool valid = false;
  double m = 0.0, v = 0.0;
};

// The proof: whether an update with these scalars keeps every new weight and moment finite
// whenever max |w| <= w_max, max |g| <= g_max and the moments are within `b`: every
// intermediate of kernels.hpp's adamw_update, bounded with a margin for its roundings, stays
// below 1e37 (FLT_MAX is 3.4e38). false also when a precondition fails (b not valid, eps <= 0,
// a bias correction <= 0, a beta outside [0, 1], a bound not finite). `decay` is the largest
// |lr * weight_decay| of the parameters. *next receives the moments' bounds after the update
// (valid when finite), proved or not.
bool adamw_proves_finite(const AdamWConfig& config, const AdamWScalars& s, float decay, double w_max,
                         double g_max, const AdamWBounds& b, AdamWBounds* next);

// max |w| over every weight of `params`; +Inf if any weight is not finite. Exact, so the same
// for any thread count.
double weight_abs_max(std::span<const ParamRef> params);
// Bounds of the moments as they are (a pass over m and v): valid when every m and v is finite
// and every v >= 0.
AdamWBounds moment_bounds(std::span<const ParamRef> params);

// The check of adamw_step on this share of the parameters: adamw_proves_finite with `bounds`
// (made valid first by moment_bounds where needed) when given, else, or when it cannot prove it,
// adamw_keeps_finite. On return *bounds holds the bounds for after the update (if it is applied).
bool adamw_update_is_finite(std::span<const ParamRef> params, const AdamWConfig& config,
                            const AdamWScalars& s, double norm, AdamWBounds* bounds);

// One update at 1-based step `t` with learning rate `lr`. Returns false (and changes nothing)
// when the gradient norm is not finite or the update would leave a non-finite weight or
// moment; *norm receives the norm before clipping. Throws s3r::Error on a non-finite `lr`.
// With `bounds` (kept by the caller across steps, see AdamWBounds) the same results, usually
// without the checking pass.
bool adamw_step(std::span<const ParamRef> params, const AdamWConfig& config, float lr, int64_t t,
                double* norm, AdamWBounds* bounds = nullptr);

}  // namespace s3r::optim
