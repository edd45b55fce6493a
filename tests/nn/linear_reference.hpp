#pragma once
// Test library of the quantized linear layer, part 2 of 3: an independent double-precision
// implementation of docs/SPEC.md sections 1-4 after the bit-defined steps (int32 products,
// scales, the S3R-EC statistics, Estr passed explicitly through both products), and bounds on
// how far the layer's f32 operations may fall from it, element by element. A test compares the
// layer's Y, dX and dW with value +- tol of an Expected.
//
// Notation: u = 2^-24 (f32 unit roundoff), gamma_n = n u / (1 - n u); a value computed by a
// sequence of operations in which every term passes through at most n f32 roundings is within
// gamma_n * (the same expression with every term replaced by its absolute value) of the exact one
// (Higham, Accuracy and Stability of Numerical Algorithms, section 3.1). The reference's own
// double arithmetic adds ref_slack. G' = sx G sw (SPEC 1), E = D Q - G' (SPEC 4).
#include <cstdint>
#include <span>
#include <vector>

#include "nn/linear_problem.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/nn/linear_mode.hpp"

namespace s3r::nn::testing {

// gamma_n of f32: n u / (1 - n u), u = 2^-24.
double gamma32(double n);

// G'[t,n] = sx[t] G[t,n] sw[n] in double (one rounding, relative 2^-53): (T, N).
std::vector<double> exact_folded(const Problem& p, const Operands& o);

// E = D*Q - G' and its S3R-EC statistics (SPEC 4), in double.
struct ErrorStatsD {
  std::vector<double> e;  // (T, N)
  std::vector<double> c;  // (T)    token means
  std::vector<double> a;  // (B, N) channel means
  std::vector<double> m;  // (B)    grand means
};

// The statistics of the codes q (T, N) with step D against gp = exact_folded: c over each
// token's N channels, a over each example's S tokens, m over the example's S N elements.
ErrorStatsD error_stats(const Problem& p, const std::vector<double>& gp,
                        std::span<const int8_t> q, double D);

// Estr[t, n] = a[b, n] + c[t] - m[b] with b = t / S (SPEC 4).
double estr(const ErrorStatsD& st, int64_t t, int64_t n, int64_t S, int64_t N);

// Bounds on |statistic of the layer - exact statistic of E = D*Q - G'| (SPEC 4).
// - The layer forms E as D * fl(Q - x) with x = fl(G'f / D), G'f = fl(fl(sx G) sw): G'f is
//   within (2u + u^2)|G'| of G', and D x within u |G'f| <= u (1 + 3u)|G'| of G'f, so each
//   element of its E is within 3.01 u |G'| of the exact one; a mean of such elements, within
//   3.01 u times the mean of |G'|.
// - The rest is the rounding of the statistics themselves, bounded in units of D by
//   tests/quant/grad_stats_problem.hpp (stat_bounds): (ceil(N/16) + 6) u for c and m (16-lane
//   f32 row sums), (min(S, 32) + 2) u for a (f32 block column sums).
struct StatEps {
  std::vector<double> c, a, m;  // (T), (B, N), (B)
};

// The bounds above for step D and gp = exact_folded; they hold for any codes.
StatEps stat_eps(const Problem& p, const std::vector<double>& gp, double D);

// Magnitudes that the f32 error bounds of one int8 backward pass need (bounds, not values).
struct Magnitudes {
  double D = 0.0;
  std::vector<double> q;       // (T, N) |Q|
  std::vector<double> a;       // (B, N) |a| of the layer: |a_exact| + eps_a
  std::vector<double> cm;      // (T)    |c - m| of the layer: |c - m|_exact + eps_c + eps_m
  std::vector<double> eps_a;   // (B, N)
  std::vector<double> eps_cm;  // (T) eps_c + eps_m
};

// The magnitudes of the codes q (T, N) actually drawn, with st = error_stats of the same codes.
Magnitudes magnitudes(const Problem& p, std::span<const int8_t> q, const ErrorStatsD& st,
                      const StatEps& eps, double D);

// A bound valid for every draw: |Q| <= |x| + 1, |E| <= D(1 + 4u) so |a| <= D(1 + 4u) and
// |c - m| <= 2 D (1 + 4u).
Magnitudes worst_magnitudes(const Problem& p, const GradCodes& gc, const StatEps& eps);

// The reference's own double arithmetic: at most T + N + K + 10 roundings of relative 2^-53 on
// any term of a reference value (products and sums of at most T, N or K terms, a few scalings):
// (T + N + K + 10) 2^-53 abs_value, abs_value the sum of the absolute terms.
double ref_slack(const Problem& p, double abs_value);

// f32 error bound of dX[t, k] (int8 mode): gamma_L (|D acc| + |correction|)/sx + gamma_L |old|
// + the statistics' error propagated through the correction, + ref_slack; L = ceil(N/16) + 9,
// the rounding depth of the layer's dX (derived in linear_reference.cpp). `correct`: the dX
// correction is on; old_abs: |dX| before an accumulating backward (0 otherwise), counted only
// when the new term is nonzero (old + exact 0 is exact: a zero G leaves dX unchanged, bit for
// bit, and then the bound is 0).
double dx_tolerance(const Problem& p, const Operands& o, const Magnitudes& mg, int64_t t, int64_t k,
                    bool correct, double old_abs);

// f32 error bound of dW[k, n] (int8 mode), likewise with u_b[k] = sum_{s in b} Xq[s, k] and
// L = T + B + 4; `correct`: the dW correction (two-way) is on.
double dw_tolerance(const Problem& p, const Operands& o, const Magnitudes& mg, int64_t k, int64_t n,
                    bool correct);

// Expected values of one output tensor and their tolerances (row-major, same size).
struct Expected {
  std::vector<double> value, tol;
};

// Y (T, N) of every mode. int8: sx sw sum_k Xq Wq; the layer computes fl(sx fl(sw acc)) (acc
// exact in f32 for 127^2 K < 2^24): 2 roundings of a product, gamma_2 |Y|. f32 and bf16: sum_k
// X W of the (bf16-rounded) operands, f32 accumulation of K terms (bf16 products are exact):
// gamma_K sum_k |X W|. Each tolerance adds ref_slack. `o` is used in int8 modes only.
Expected expected_forward(const Problem& p, LinearMode mode, const Operands& o);

struct ExpectedBackward {
  Expected dx, dw;  // (T, K), (K, N)
};

// Float modes: dX = G W^T (+ old), dW = X^T G of the (bf16-rounded) operands; f32 accumulation
// of N (dX, plus the accumulation into old: N + 1) and T (dW) terms with exact bf16 products.
// dx_old: dX before an accumulating backward, or empty.
ExpectedBackward expected_backward_float(const Problem& p, LinearMode mode,
                                         const AlignedVector<float>& dx_old);

// Int8 modes (SPEC 1, 2, 4), with the codes gc (grad_codes): dX (T, K) from the dX codes,
//   dX[t,k] = old + (1/sx[t]) sum_n (D Q[t,n] - [correct_dx] Estr[t,n]) Wq[k,n]
// and dW (K, N) from the dW codes (sr: the second quantization),
//   dW[k,n] = (1/sw[n]) sum_t Xq[t,k] (D Q[t,n] - [two-way] Estr[t,n])
// with Estr formed explicitly from c, a, m of E = D*Q - G' (double); integer products exact.
// Tolerances: dx_tolerance and dw_tolerance with the magnitudes of these codes.
ExpectedBackward expected_backward_int8(const Problem& p, const Operands& o, const GradCodes& gc,
                                        Correction correction, const AlignedVector<float>& dx_old);

// The unquantized backward of the quantized forward operands, in double:
// dX_ref = G (Wq sw)^T = G' Wq^T / sx and dW_ref = (sx Xq)^T G = Xq^T G' / sw.
struct Reference {
  std::vector<double> dx, dw;  // (T, K), (K, N)
};

// Computed as sum_n (G sw) Wq and sum_t (sx Xq) G in double: the inner products are exact,
// each term is rounded once (relative 2^-53), then N or T additions (covered by ref_slack).
Reference unquantized_backward(const Problem& p, const Operands& o);

}  // namespace s3r::nn::testing
