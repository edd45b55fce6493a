// The rounding's share of AdamW's second moment; see s3r/nn/rounding_variance.hpp.
#include "s3r/nn/rounding_variance.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"

namespace s3r::nn {

SquaredDeviation::SquaredDeviation(std::span<const float> reference)
    : reference_(reference.begin(), reference.end()), sum_(reference.size(), 0.0) {}

void SquaredDeviation::add(std::span<const float> sample) {
  if (sample.size() != reference_.size()) {
    throw Error("SquaredDeviation: a sample of " + std::to_string(sample.size()) +
                " values for a reference of " + std::to_string(reference_.size()));
  }
  for (size_t i = 0; i < sample.size(); ++i) {
    const double d = static_cast<double>(sample[i]) - reference_[i];
    sum_[i] += d * d;
  }
  ++samples_;
}

std::vector<double> SquaredDeviation::mean() const {
  std::vector<double> r(sum_.size(), 0.0);
  if (samples_ == 0) return r;
  for (size_t i = 0; i < r.size(); ++i) r[i] = sum_[i] / static_cast<double>(samples_);
  return r;
}

ShareAccumulator::ShareAccumulator(double c2, double bias2) : c2_(c2), bias2_(bias2) {
  if (!(c2 >= 0.0) || !std::isfinite(c2) || !(bias2 > 0.0 && bias2 <= 1.0)) {
    throw Error("ShareAccumulator: need c^2 >= 0 and 1 - beta2^t in (0, 1], got " +
                std::to_string(c2) + " and " + std::to_string(bias2));
  }
}

void ShareAccumulator::add(std::span<const double> r, std::span<const float> v) {
  if (r.size() != v.size()) {
    throw Error("ShareAccumulator: " + std::to_string(r.size()) + " deviations for " +
                std::to_string(v.size()) + " second moments");
  }
  for (size_t i = 0; i < r.size(); ++i) {
    if (!(v[i] > 0.0f)) {
      ++zero_v_;
      continue;
    }
    const double vhat = static_cast<double>(v[i]) / bias2_;
    numerator_ += c2_ * r[i];
    denominator_ += vhat;
    shares_.push_back(static_cast<float>(c2_ * r[i] / vhat));
  }
}

ShareSummary ShareAccumulator::summary() const {
  ShareSummary s;
  s.coordinates = static_cast<int64_t>(shares_.size());
  s.zero_v = zero_v_;
  if (shares_.empty()) return s;
  AlignedVector<float> sorted = shares_;
  std::sort(sorted.begin(), sorted.end());
  const auto at = [&](double q) {
    return static_cast<double>(sorted[static_cast<size_t>(std::floor(q * static_cast<double>(sorted.size() - 1)))]);
  };
  s.median = at(0.5), s.q90 = at(0.9), s.q99 = at(0.99), s.max = sorted.back();
  s.aggregate = numerator_ / denominator_;
  return s;
}

}  // namespace s3r::nn
