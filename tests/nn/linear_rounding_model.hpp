#pragma once
// Test library of the quantized linear layer, part 3 of 3: the exact distribution, over the
// thresholds, of the rounding errors E = D Q - G' of the stochastic modes (sr, s3r, s3r-bcast)
// and of the errors they leave in dX and dW, for statistical tests (means, variances) with
// tolerances from exact moments instead of estimated ones. Everything is in double.
//
// For fixed x the code clamp(floor(fl(x + r))) is nondecreasing in r (f32 addition, floor and
// the clamp are monotone) and, for r in [0, 1), takes at most two adjacent values (rounding_model
// checks this: RoundingModel::two_valued). So E[t,n] = e_lo + jump * U with jump = D (hi - lo) and
// U = 1 iff the threshold index is >= first_up: a 7-bit index k of 128 equally likely values, or
// sr's index j of 2^23. Tokens are independent (s3r: distinct threshold bytes; sr: distinct
// words), and so are examples under s3r-bcast; under sr so are all elements, and the two code
// tensors.
#include <cstdint>
#include <vector>

#include "nn/linear_problem.hpp"
#include "nn/linear_reference.hpp"
#include "s3r/nn/linear_mode.hpp"

namespace s3r::nn::testing {

constexpr int kLevels7 = 128;             // 7-bit thresholds
constexpr uint32_t kLevels23 = 1u << 23;  // sr's 23-bit thresholds

struct RoundingModel {
  LinearMode mode = LinearMode::kS3r;
  int64_t T = 0, N = 0, S = 0;
  double D = 0.0;
  std::vector<double> e_lo;    // (T, N) D lo - G'
  std::vector<double> jump;    // (T, N) D (hi - lo), 0 or D
  std::vector<int> first_up;   // (T, N) 7-bit: first k with code hi (kLevels7: never)
  std::vector<double> p_up;    // (T, N) P(code = hi)
  std::vector<double> bias;    // (T, N) bound on |E[E]| (see rounding_model)
  std::vector<double> e_rtne;  // (T, N) D rne(x) - G': the error of a biased rounding
  bool two_valued = true;      // the assumption above held for every element
};

// The model of every element of `mode` (a stochastic mode) from D and x of gc (grad_codes; any
// key) and G' = exact_folded(p, o), by trying the thresholds: all 128 7-bit ones, or a binary
// search over sr's 2^23. bias bounds |E[D Q] - G'| <= |E[D Q] - D x| + |D x - G'|: D/256 +
// D ulp(|x| + 1)/2 for the 7-bit thresholds (SPEC 2), D (ulp(|x| + 1) + 2^-22) for sr, plus
// 3.01 u |G'| (stat_eps).
RoundingModel rounding_model(const Problem& p, const Operands& o, const GradCodes& gc,
                             LinearMode mode);

// Mean, variance and the largest deviation from the mean of a random quantity, and two
// deterministic companions: a bound on its bias and its value under rtne.
struct Moments {
  double mean = 0.0, var = 0.0, dev = 0.0, bias = 0.0, rtne = 0.0;
};

// Per token s, the distribution of h_s = sum_n beta[n] E[s, n] over that token's thresholds.
struct TokenMoments {
  std::vector<Moments> token;  // (T); bias = sum_n |beta| bias
  std::vector<double> values;  // (T, 128) h_s at each 7-bit threshold index (s3r, s3r-bcast)
};

// The moments of h_s for every token s, beta of size N: under the 7-bit modes exactly from
// its 128 values; under sr from the independent elements (means and variances add, dev bounds
// add).
TokenMoments token_moments(const RoundingModel& m, const std::vector<double>& beta);

// Moments of sum_j alpha[j] h_{t0 + j} for tokens [t0, t0 + alpha.size()) of one example.
// sr and s3r: independent tokens, so means, variances and deviation bounds add. s3r-bcast: one
// threshold for the example, so the sum is evaluated at each of the 128 thresholds.
Moments combine(const RoundingModel& m, const TokenMoments& tm, int64_t t0,
                const std::vector<double>& alpha);

// total += part, for independent parts (every field adds).
void add_to(Moments& total, const Moments& part);

// Output errors as linear functionals of E, per example b: sum_{s in b, n} alpha_s beta_n E[s,n].
// From dX = (1/sx) (G' + E - [corr] Estr) Wq^T and E - Estr = P_S E_b P_N per example
// (P_L = I - 1 1^T / L, SPEC 4):
//   dX[t,k] - dX_ref:  beta = Wq[k,:] (none) or Wq[k,:] - rowsum[k]/N (corrected),
//                      alpha_s = [s = t]/sx[t] (none) or ([s = t] - 1/S)/sx[t]
//   dW[k,n] - dW_ref:  beta = e_n (none) or e_n - 1/N (two-way),
//                      alpha_s = Xq[s,k]/sw[n] (none) or (Xq[s,k] - mean_{s' in b} Xq[s',k])/sw[n]
// beta has N entries; alpha has S, one per token of the example (of t, or b).
std::vector<double> dx_beta(const Problem& p, const Operands& o, int64_t k, bool corrected);
std::vector<double> dw_beta(const Problem& p, int64_t n, bool corrected);
std::vector<double> dx_alpha(const Problem& p, const Operands& o, int64_t t, bool corrected);
std::vector<double> dw_alpha(const Problem& p, const Operands& o, int64_t b, int64_t k, int64_t n,
                             bool corrected);

// The exact distribution of every element of dX - dX_ref (T, K) and dW - dW_ref (K, N), with
// dX_ref, dW_ref = unquantized_backward: dX's moments from its example's tokens, dW's summed over
// the (independent) examples.
struct GradientMoments {
  std::vector<Moments> dx, dw;
};

GradientMoments gradient_moments(const RoundingModel& m, const Problem& p, const Operands& o,
                                 bool correct_dx, bool correct_dw);

}  // namespace s3r::nn::testing
