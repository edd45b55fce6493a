#pragma once
// Adds wall-clock time between laps to the phases of a PhaseTimes (no-op when it is null).
#include <chrono>

#include "s3r/nn/quant_linear.hpp"

namespace s3r::nn {

class PhaseClock {
 public:
  explicit PhaseClock(PhaseTimes* times) : times_(times), last_(std::chrono::steady_clock::now()) {}
  void lap(double PhaseTimes::*phase) {
    if (times_ == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    times_->*phase += std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
  }

 private:
  PhaseTimes* times_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace s3r::nn
