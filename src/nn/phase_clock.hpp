#pragma once
// Wall-clock time per phase: the phases are double members (milliseconds) of a PhaseTimes, or of
// any struct of such phases such as model::StepBreakdown; a null struct makes both no-ops.
// PhaseZone adds the time of its scope to one phase (the way to time a piece of a layer list);
// PhaseClock adds the time between laps (for a sequence of phases inside one kernel call).
#include <chrono>

#include "s3r/nn/quant_linear.hpp"

namespace s3r::nn {

template <class Times>
class PhaseZone {
 public:
  PhaseZone(Times* times, double Times::*phase)
      : times_(times), phase_(phase),
        start_(times != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{}) {}
  ~PhaseZone() {
    if (times_ == nullptr) return;
    times_->*phase_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  }
  PhaseZone(const PhaseZone&) = delete;
  PhaseZone& operator=(const PhaseZone&) = delete;

 private:
  Times* times_;
  double Times::*phase_;
  std::chrono::steady_clock::time_point start_;
};

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
