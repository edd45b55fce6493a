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

// One update at 1-based step `t` with learning rate `lr`. Returns false (and changes nothing)
// when the gradient norm is not finite or the update would leave a non-finite weight or
// moment; *norm receives the norm before clipping. Throws s3r::Error on a non-finite `lr`.
bool adamw_step(std::span<const ParamRef> params, const AdamWConfig& config, float lr, int64_t t,
                double* norm);

}  // namespace s3r::optim
