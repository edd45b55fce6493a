#pragma once
// Adds wall-clock time between laps to the phases (double members) of a PhaseTimes, or of any
// struct of such phases such as model::StepBreakdown (no-op when it is null).
#include <chrono>

#include "s3r/nn/quant_linear.hpp"

namespace s3r::nn {

template <class Times>
class PhaseClock {
 public:
  explicit PhaseClock(Times* times) : times_(times), last_(std::chrono::steady_clock::now()) {}
  void lap(double Times::*phase) {
    if (times_ == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    times_->*phase += std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
  }

 private:
  Times* times_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace s3r::nn
