#include "s3r/nn/linear_mode.hpp"

#include <string>

#include "s3r/core/error.hpp"

namespace s3r::nn {

namespace {
constexpr LinearMode kModes[] = {LinearMode::kF32, LinearMode::kBf16, LinearMode::kRtne,
                                 LinearMode::kSr, LinearMode::kS3r, LinearMode::kS3rBcast};
constexpr Correction kCorrections[] = {Correction::kNone, Correction::kDx, Correction::kTwoWay};
}  // namespace

std::string_view to_string(LinearMode mode) {
  if (mode == LinearMode::kF32) return "f32";
  if (mode == LinearMode::kBf16) return "bf16";
  return s3r::to_string(grad_rounding(mode));  // an int8 mode is named by its gradient rounding
}

LinearMode parse_linear_mode(std::string_view name) {
  std::string names;
  for (LinearMode m : kModes) {
    if (name == to_string(m)) return m;
    names += (names.empty() ? "" : ", ") + std::string(to_string(m));
  }
  throw Error("unknown mode '" + std::string(name) + "'; expected one of: " + names);
}

std::string_view to_string(Correction correction) {
  switch (correction) {
    case Correction::kNone: return "none";
    case Correction::kDx: return "dx";
    case Correction::kTwoWay: return "two-way";
  }
  return "?";
}

Correction parse_correction(std::string_view name) {
  for (Correction c : kCorrections) {
    if (name == to_string(c)) return c;
  }
  throw Error("unknown correction '" + std::string(name) + "'; expected one of: none, dx, two-way");
}

GradRounding grad_rounding(LinearMode mode) {
  switch (mode) {
    case LinearMode::kRtne: return GradRounding::kRtne;
    case LinearMode::kSr: return GradRounding::kSr;
    case LinearMode::kS3r: return GradRounding::kS3r;
    case LinearMode::kS3rBcast: return GradRounding::kS3rBcast;
    default: break;
  }
  throw Error("mode '" + std::string(to_string(mode)) + "' has no int8 gradient rounding");
}

}  // namespace s3r::nn
