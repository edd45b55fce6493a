#pragma once
// Shared by the numerical and statistical tests: rounding units, Bernstein tolerances, and a
// Checker that counts violations and reports the first few with their context.
#include <gtest/gtest.h>

#include <cmath>
#include <iomanip>
#include <sstream>
#include <string>
#include <utility>

namespace s3r::testing {

// Whether error r replaces `worst` in a running maximum where a NaN is the worst there is and
// stays: std::max(worst, NaN) skips the NaN, and `!(r <= worst)` alone lets the next finite r
// replace it. Usage: if (worse_than(r, worst)) worst = r, at = i;
inline bool worse_than(double r, double worst) { return !std::isnan(worst) && !(r <= worst); }

constexpr double kU32 = 0x1p-24;  // unit roundoff of f32 (round to nearest)
constexpr double kU64 = 0x1p-53;  // unit roundoff of f64

// Statistical tolerances come from Bernstein's inequality for the mean of M i.i.d. terms with
// standard deviation sigma and |term - mean| <= b:
//   P(|mean_M - mean| >= sqrt(2 L sigma^2 / M) + 2 L b / (3 M)) <= 2 exp(-L).
// With L = 15 the first part is 5.5 standard errors and a check fails by chance with probability
// <= 6e-7 (a normal variable beyond 5 SE: 5.7e-7); the second part covers what the normal
// approximation misses when an outcome is rare (a few events, or none, in M draws). sigma is
// the exact model value (a standard error estimated from the samples misses rare joint events).
constexpr double kBernsteinL = 15.0;

inline double bernstein_tolerance(double sigma, double b, int draws) {
  return std::sqrt(2.0 * kBernsteinL * sigma * sigma / draws) +
         2.0 * kBernsteinL * b / (3.0 * draws);
}

template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream s;
  s << std::setprecision(10);
  (s << ... << args);
  return s.str();
}

// Counts violations (NaN fails) and reports the first few, each with its context, index,
// expected, actual and tolerance, so that a broken property cannot flood the log. `what` is a
// callable returning the element's description; it runs only on failure.
class Checker {
 public:
  explicit Checker(std::string context) : context_(std::move(context)) {}
  void set_context(std::string context) { context_ = std::move(context); }

  template <typename What>
  void near(double expected, double actual, double tol, const What& what) {
    ++checks_;
    if (std::fabs(actual - expected) <= tol) return;
    report([&] {
      return str(what(), ": expected ", expected, ", actual ", actual, ", |diff| ",
                 std::fabs(actual - expected), " > tolerance ", tol);
    });
  }
  template <typename What>
  void at_least(double actual, double bound, const What& what) {
    ++checks_;
    if (actual >= bound) return;
    report([&] { return str(what(), ": expected >= ", bound, ", actual ", actual); });
  }
  template <typename What>
  void at_most(double actual, double bound, const What& what) {
    ++checks_;
    if (actual <= bound) return;
    report([&] { return str(what(), ": expected <= ", bound, ", actual ", actual); });
  }
  template <typename What>
  void expect(bool ok, const What& what) {
    ++checks_;
    if (!ok) report(what);
  }
  int failures() const { return failures_; }
  int checks() const { return checks_; }
  std::string summary() const {
    return str(context_, ": ", failures_, " of ", checks_, " checks failed");
  }

 private:
  template <typename Message>
  void report(const Message& message) {
    if (failures_++ < kMaxReports) ADD_FAILURE() << context_ << ": " << message();
  }
  static constexpr int kMaxReports = 10;
  std::string context_;
  int failures_ = 0;
  int checks_ = 0;
};

}  // namespace s3r::testing
