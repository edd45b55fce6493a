#pragma once
// Wall-clock time and work (s3r/core/work.hpp) per phase: the phases are work::Phase members of a
// PhaseTimes, or of any struct of such phases such as model::StepBreakdown; a null struct makes
// it a no-op. PhaseZone adds the time and work of its scope to one phase (the way to time a
// piece of a layer list); a zone inside another adds to both phases.
#include <chrono>

#include "s3r/core/work.hpp"
#include "s3r/nn/quant_linear.hpp"

namespace s3r::nn {

template <class Times>
class PhaseZone {
 public:
  PhaseZone(Times* times, work::Phase Times::*phase)
      : times_(times), phase_(phase),
        start_(times != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{}),
        work_(times != nullptr ? work::snapshot() : work::Counts{}) {}
  ~PhaseZone() {
    if (times_ == nullptr) return;
    work::Phase& p = times_->*phase_;
    p.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
    p.work += work::snapshot() - work_;
  }
  PhaseZone(const PhaseZone&) = delete;
  PhaseZone& operator=(const PhaseZone&) = delete;

 private:
  Times* times_;
  work::Phase Times::*phase_;
  std::chrono::steady_clock::time_point start_;
  work::Counts work_;
};

}  // namespace s3r::nn
