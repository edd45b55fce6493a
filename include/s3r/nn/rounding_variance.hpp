#pragma once
// How much of AdamW's second moment the backward pass's rounding accounts for (`s3r diag
// second-moment`; the paper reports at most 0.094 late in training).
//
// For one gradient coordinate i, with g_exact the gradient of unquantized G through the same int8
// forward (BackwardProbe::exact_grad) and g_k the recipe's gradient under threshold key k:
//
//   r_i     = (1/K) sum_k (g_k,i - g_exact,i)^2          (SquaredDeviation: in double)
//   share_i = c^2 r_i / v_hat_i,   v_hat_i = v_i / (1 - beta2^t)
//
// r_i estimates the variance the rounding adds plus its squared bias (the bias alone for rtne,
// whose rounding is deterministic: one key gives it exactly); c = min(1, clip / ||g_exact||) is
// the clipping AdamW would apply to that gradient, and v_hat the bias-corrected second moment of
// the checkpoint's optimizer state after t steps. The share is summarized per group of
// coordinates (a layer, a projection kind) by quantiles and by the ratio of sums.
#include <cstdint>
#include <span>
#include <vector>
#include "s3r/core/aligned_vector.hpp"

namespace s3r::nn {

// Per-coordinate mean of (sample - reference)^2 over the samples added, in double.
class SquaredDeviation {
 public:
  explicit SquaredDeviation(std::span<const float> reference);
  // One key's gradient, the size of the reference (s3r::Error otherwise).
  void add(std::span<const float> sample);
  int64_t samples() const { return samples_; }
  // r_i over the samples so far (all 0 before the first).
  std::vector<double> mean() const;

 private:
  AlignedVector<float> reference_;
  std::vector<double> sum_;
  int64_t samples_ = 0;
};

// The share of the second moment over a group of coordinates. Coordinates whose v is 0 (never
// updated: no share is defined) are counted in zero_v and left out of every statistic.
struct ShareSummary {
  int64_t coordinates = 0;  // with v > 0
  int64_t zero_v = 0;
  double median = 0, q90 = 0, q99 = 0, max = 0;  // of share_i; quantile q: the sorted value at
                                                 // index floor(q (n - 1)) (0 when n = 0)
  double aggregate = 0;     // sum_i c^2 r_i / sum_i v_hat_i (0 when n = 0)
};

// Gathers the shares of the coordinates added (a layer, a projection kind over all layers).
class ShareAccumulator {
 public:
  // c2 = c^2 >= 0, bias2 = 1 - beta2^t in (0, 1] (s3r::Error otherwise).
  ShareAccumulator(double c2, double bias2);
  // r (SquaredDeviation::mean()) and v of the same coordinates (s3r::Error unless equal sizes).
  void add(std::span<const double> r, std::span<const float> v);
  ShareSummary summary() const;

 private:
  double c2_, bias2_;
  AlignedVector<float> shares_;  // share_i of the coordinates with v > 0, in the order added
  double numerator_ = 0, denominator_ = 0;
  int64_t zero_v_ = 0;
};

}  // namespace s3r::nn
