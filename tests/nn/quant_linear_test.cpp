// Tests of s3r::nn QuantLinear (SPEC sections 1-4, and properties 1 and 4 of section 5).
//
// (a) QuantLinearReference: every mode and correction against an independent double-precision
//     implementation of SPEC 1-4 (linear_reference.hpp). The bit-defined steps (scales and codes
//     of X, W and G', thresholds from the keys) are recomputed with the layer's f32 operations and
//     compared bit for bit; everything after them (int32 products, scales, the S3R-EC statistics,
//     Estr passed explicitly through both products) is done in double, and Y, dX, dW are compared
//     with tolerances derived from the f32 operations of the layer.
// (b) QuantLinearStats.MeanGradientIsUnbiased: over keys, dX and dW average to the unquantized
//     backward of the same forward operands, with exact variances of the threshold distributions.
// (c) QuantLinearResidual: the error reaching dX and dW is R Wq^T / sx and Xq^T R / sw with
//     R = E - Estr (E without correction), and R sums to zero along rows and columns.
// The variance story (measured dX and dW errors of sr, s3r, s3r-bcast and the corrections on a
// layer whose weight rows share a common component): quant_linear_variance_test.cpp.
//
// The problems, the bit-defined steps, the double reference with its error bounds (notation
// there) and the exact distribution of the rounding errors are a test library of their own:
// linear_problem.hpp, linear_reference.hpp and linear_rounding_model.hpp; this file holds the
// tests.
#include "s3r/nn/quant_linear.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "check_util.hpp"
#include "nn/layer_run.hpp"
#include "nn/linear_problem.hpp"
#include "nn/linear_reference.hpp"
#include "nn/linear_rounding_model.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/isa.hpp"
#include "s3r/nn/linear_mode.hpp"
#include "s3r/quant/grad_quant.hpp"
#include "s3r/rng/threefry.hpp"
#include "test_util.hpp"

namespace s3r::nn {
namespace {

using namespace s3r::nn::testing;  // the problems, the reference and the rounding model
using s3r::testing::bernstein_tolerance;
using s3r::testing::Checker;
using s3r::testing::kU64;
using s3r::testing::str;

constexpr LinearMode kAllModes[] = {LinearMode::kF32, LinearMode::kBf16, LinearMode::kRtne,
                                    LinearMode::kSr,  LinearMode::kS3r,  LinearMode::kS3rBcast};
constexpr LinearMode kInt8Modes[] = {LinearMode::kRtne, LinearMode::kSr, LinearMode::kS3r,
                                     LinearMode::kS3rBcast};
constexpr LinearMode kStochasticModes[] = {LinearMode::kSr, LinearMode::kS3r,
                                           LinearMode::kS3rBcast};
constexpr Correction kAllCorrections[] = {Correction::kNone, Correction::kDx, Correction::kTwoWay};

// ---------------------------------------------------------------------------------------------
// Running the layer (layer_run.hpp) and checking its results.

// A row-major (rows x cols) tensor against its expectation, element by element.
void check_tensor(Checker& chk, const char* name, const Expected& e, std::span<const float> got,
                  int64_t rows, int64_t cols, const char* row_letter, const char* col_letter) {
  if (got.size() != e.value.size()) {
    chk.expect(false, [&] {
      return str(name, " has ", got.size(), " elements, expected ", e.value.size());
    });
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      chk.near(e.value[i], got[i], e.tol[i],
               [&] { return str(name, "[", row_letter, "=", r, ", ", col_letter, "=", c, "]"); });
    }
  }
}

template <typename Expected, typename Got>
void check_bits(Checker& chk, const char* name, const Expected& expected, const Got& got, int64_t cols) {
  if (got.size() != expected.size()) {
    chk.expect(false, [&] {
      return str(name, " has ", got.size(), " elements, expected ", expected.size());
    });
    return;
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    const double e = static_cast<double>(expected[i]), a = static_cast<double>(got[i]);
    chk.near(e, a, 0.0, [&] { return str(name, "[", i / cols, ", ", i % cols, "] (bit-exact)"); });
  }
}

// Scales, codes and row sums of the prepared operands, bit for bit (SPEC 1).
void check_operands(Checker& chk, const LayerRun& run, const Operands& o, const Problem& p) {
  check_bits(chk, "Xq", o.xq, run.in.codes, p.K);
  check_bits(chk, "sx", o.sx, run.in.scales, 1);
  check_bits(chk, "Wq", o.wq, run.weight.codes, p.N);
  check_bits(chk, "sw", o.sw, run.weight.scales, 1);
  AlignedVector<float> rowsum;
  for (int64_t v : o.rowsum) rowsum.push_back(static_cast<float>(v));
  check_bits(chk, "rowsum(Wq)", rowsum, run.weight.code_row_sums, 1);
}

// D and the codes of G' that the layer used (its workspace), bit for bit (SPEC 1-3).
void check_grad_codes(Checker& chk, const LinearWorkspace& ws, const GradCodes& gc,
                      const Problem& p) {
  chk.near(gc.D, ws.grad.step, 0.0, [] { return std::string("step D (bit-exact)"); });
  chk.expect(ws.grad.count == gc.count,
             [&] { return str("quantization count ", ws.grad.count, ", expected ", gc.count); });
  for (int q = 0; q < std::min(gc.count, ws.grad.count); ++q) {
    check_bits(chk, q == 0 ? "Q (dX codes)" : "Q (dW codes)", gc.q[q], ws.grad.codes[q], p.N);
  }
}

enum class Variant { kPlain, kAccumulate, kNoDx };
const char* to_string(Variant v) {
  switch (v) {
    case Variant::kPlain:
      return "dX = ...";
    case Variant::kAccumulate:
      return "dX += ...";
    case Variant::kNoDx:
      return "no dX";
  }
  return "?";
}

// One backward pass of `mode` against the reference; the forward operands are prepared in `run`.
void check_backward(Checker& chk, LayerRun& run, const Problem& p, LinearMode mode,
                    Correction correction, Variant variant, Key key) {
  const int64_t T = p.T, K = p.K, N = p.N;
  AlignedVector<float> dx_old;
  if (variant == Variant::kAccumulate) {
    for (int64_t i = 0; i < T * K; ++i) dx_old.push_back(sym_uniform(key_from_seed(7), i));
  }
  AlignedVector<float> dx = variant == Variant::kNoDx ? AlignedVector<float>{}
                          : variant == Variant::kAccumulate
                              ? dx_old
                              : AlignedVector<float>(static_cast<size_t>(T * K), 12345.0f);
  AlignedVector<float> dw(static_cast<size_t>(K * N), 12345.0f);
  linear_backward(dx, dw, p.g, run.in, run.weight,
                  backward_config(p, correction, key, variant == Variant::kAccumulate), run.ws);
  ExpectedBackward e;
  if (is_int8(mode)) {
    const Operands o = forward_operands(p);
    const GradCodes gc = grad_codes(p, o, mode, key);
    check_grad_codes(chk, run.ws, gc, p);
    e = expected_backward_int8(p, o, gc, correction, dx_old);
  } else {
    e = expected_backward_float(p, mode, dx_old);
  }
  if (variant != Variant::kNoDx) check_tensor(chk, "dX", e.dx, dx, T, K, "t", "k");
  check_tensor(chk, "dW", e.dw, dw, K, N, "k", "n");
}

// (a) Every mode, correction and ISA, each example length S of `lengths`, three dX variants,
// with `threads` OpenMP threads (hundreds of tiny calls whose parallel regions crawl when the
// cores are shared, so most sweeps use one; results must not depend on it).
void run_reference_sweep(const Problem& base, int threads, const std::vector<int64_t>& lengths,
                         Checker& chk) {
  s3r::testing::ScopedThreads scoped_threads(threads);
  for (Isa isa : s3r::testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    for (int64_t S : lengths) {
      Problem p = base;
      p.S = S;
      for (LinearMode mode : kAllModes) {
        LayerRun run;
        prepare(run, p, mode);
        const std::string where =
            str(isa_name(isa), ", ", threads, " threads, ", p.shape(), ", mode ", to_string(mode));
        chk.set_context(where + ", forward");
        if (is_int8(mode)) check_operands(chk, run, forward_operands(p), p);
        AlignedVector<float> y(static_cast<size_t>(p.T * p.N), 12345.0f);
        linear_forward(y, run.in, run.weight);
        check_tensor(chk, "Y", expected_forward(p, mode, forward_operands(p)), y, p.T, p.N, "t",
                     "n");
        const std::vector<Correction> corrections =
            is_int8(mode)
                ? std::vector<Correction>(std::begin(kAllCorrections), std::end(kAllCorrections))
                : std::vector<Correction>{Correction::kNone};
        for (Correction correction : corrections) {
          for (Variant variant : {Variant::kPlain, Variant::kAccumulate, Variant::kNoDx}) {
            const Key key = make_layer_key(2024, static_cast<uint32_t>(S), 3);
            chk.set_context(
                str(where, ", correction ", to_string(correction), ", ", to_string(variant)));
            check_backward(chk, run, p, mode, correction, variant, key);
          }
        }
      }
    }
  }
}

TEST(QuantLinearReference, EveryModeCorrectionAndIsaMatchesDoubleReference) {
  Checker chk("");
  const Problem p = make_problem(12, 20, 17, 1, 11u, false);
  run_reference_sweep(p, 1, {1, p.T / 2, p.T}, chk);
  run_reference_sweep(p, 2, {p.T / 2}, chk);  // the threaded paths of every kernel
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
  EXPECT_GT(chk.checks(), 0);
}

// G == 0: D == 0, so dX = 0 (unchanged when accumulating) and dW = 0 exactly. The reference
// gives these values with tolerance 0 (every magnitude in the bounds is 0, and adding an exact 0
// to the old dX is exact).
TEST(QuantLinearReference, ZeroGradientGivesExactZeros) {
  Checker chk("");
  run_reference_sweep(make_problem(12, 20, 17, 1, 12u, true), 1, {1, 6, 12}, chk);
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
  EXPECT_GT(chk.checks(), 0);
}

// Odd sizes that cross the 16-lane and 64-column blocks of the kernels.
TEST(QuantLinearReference, LargerOddShapeMatchesDoubleReference) {
  Checker chk("");
  run_reference_sweep(make_problem(20, 67, 37, 1, 13u, false), 1, {1, 10, 20}, chk);
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
}

// ---------------------------------------------------------------------------------------------
// (b) Unbiasedness (SPEC 5.1, Lemma 1).

constexpr int kMeanDraws = 2000;

// Tolerance of the mean over kMeanDraws keys of one output element with exact moments `mo`:
// Bernstein (sampling), the bias bound sum |alpha beta| bias (7-bit: D/256 per element, SPEC 2),
// the f32 error of one draw (`fp`, the same for every draw), and the double sums of the test
// (kMeanDraws terms: kMeanDraws u64 relative to the largest possible term).
double mean_tolerance(const Moments& mo, double ref, double fp) {
  const double largest = std::fabs(ref) + std::fabs(mo.mean) + mo.dev + fp;
  return bernstein_tolerance(std::sqrt(mo.var), mo.dev, kMeanDraws) + mo.bias + fp +
         kMeanDraws * kU64 * largest;
}

// Checks the means of one output tensor; returns how many elements a biased rounding (rtne)
// would fail, to show that the tolerances have power.
int check_means(Checker& chk, const char* name, const std::vector<double>& sum,
                const std::vector<double>& ref, const std::vector<Moments>& mo,
                const std::vector<double>& fp, int64_t cols) {
  int detect = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double tol = mean_tolerance(mo[i], ref[i], fp[i]);
    chk.near(ref[i], sum[i] / kMeanDraws, tol, [&] {
      return str("mean of ", name, "[", i / cols, ", ", i % cols, "] over ", kMeanDraws,
                 " keys (sd of one draw ", std::sqrt(mo[i].var), ", bias bound ", mo[i].bias,
                 ", exact mean ", ref[i] + mo[i].mean, ")");
    });
    if (std::fabs(mo[i].rtne) > tol) ++detect;
  }
  return detect;
}

TEST(QuantLinearStats, MeanGradientIsUnbiased) {
  const Problem p = make_problem(16, 24, 20, 4, 21u, false);
  const Operands o = forward_operands(p);
  const Reference ref = unquantized_backward(p, o);
  // One thread: results do not depend on it (SPEC 3), and thousands of tiny parallel regions
  // crawl when the cores are shared.
  s3r::testing::ScopedThreads one_thread(1);
  Checker chk("");
  for (LinearMode mode : kStochasticModes) {
    const GradCodes gc = grad_codes(p, o, mode, Key{0, 0});  // D and x do not depend on the key
    const RoundingModel model = rounding_model(p, o, gc, mode);
    ASSERT_TRUE(model.two_valued) << to_string(mode);
    const Magnitudes worst = worst_magnitudes(p, gc, stat_eps(p, exact_folded(p, o), gc.D));
    LayerRun run;
    prepare(run, p, mode);
    std::vector<double> sum_dx[3], sum_dw[3];
    AlignedVector<float> dx(static_cast<size_t>(p.T * p.K)), dw(static_cast<size_t>(p.K * p.N));
    for (int c = 0; c < 3; ++c) sum_dx[c].assign(dx.size(), 0.0), sum_dw[c].assign(dw.size(), 0.0);
    for (int d = 0; d < kMeanDraws; ++d) {
      const Key key = make_layer_key(5150, static_cast<uint32_t>(d), 7);
      for (int c = 0; c < 3; ++c) {
        linear_backward(dx, dw, p.g, run.in, run.weight,
                        backward_config(p, kAllCorrections[c], key, false), run.ws);
        for (size_t i = 0; i < dx.size(); ++i) sum_dx[c][i] += dx[i];
        for (size_t i = 0; i < dw.size(); ++i) sum_dw[c][i] += dw[i];
      }
    }
    for (int c = 0; c < 3; ++c) {
      const Correction correction = kAllCorrections[c];
      const bool correct_dx = correction != Correction::kNone;
      const bool correct_dw = correction == Correction::kTwoWay;
      chk.set_context(
          str("mode ", to_string(mode), ", correction ", to_string(correction), ", ", p.shape()));
      const GradientMoments gm = gradient_moments(model, p, o, correct_dx, correct_dw);
      std::vector<double> fp_dx, fp_dw;
      for (int64_t t = 0; t < p.T; ++t) {
        for (int64_t k = 0; k < p.K; ++k) {
          fp_dx.push_back(dx_tolerance(p, o, worst, t, k, correct_dx, 0.0));
        }
      }
      for (int64_t k = 0; k < p.K; ++k) {
        for (int64_t n = 0; n < p.N; ++n) {
          fp_dw.push_back(dw_tolerance(p, o, worst, k, n, correct_dw));
        }
      }
      const int detect_dx = check_means(chk, "dX", sum_dx[c], ref.dx, gm.dx, fp_dx, p.K);
      const int detect_dw = check_means(chk, "dW", sum_dw[c], ref.dw, gm.dw, fp_dw, p.N);
      // Power: rtne's deterministic error in place of the mean would fail on many elements (about
      // half or more here; elements of channels with |x| << 1 have a tiny rtne error).
      chk.expect(4 * detect_dx > static_cast<int>(ref.dx.size()), [&] {
        return str("rtne's bias exceeds the dX tolerance on only ", detect_dx, " of ",
                   ref.dx.size(), " elements");
      });
      chk.expect(4 * detect_dw > static_cast<int>(ref.dw.size()), [&] {
        return str("rtne's bias exceeds the dW tolerance on only ", detect_dw, " of ",
                   ref.dw.size(), " elements");
      });
    }
  }
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
}

// ---------------------------------------------------------------------------------------------
// (c) The error that reaches dX and dW is that of R = E - Estr (E without correction).

// |sum of R over a row or column| in double: c, a, m, each R element and the sum take at most
// 2 max(S, N) + 10 roundings of relative 2^-53 on any term of the sum of |E| + |a| + |c| + |m|.
double residual_sum_tolerance(double abs_sum, int64_t S, int64_t N) {
  return static_cast<double>(2 * std::max(S, N) + 10) * kU64 * abs_sum;
}

// R (T, N) of one code tensor: E - Estr when `corrected`, else E. Checks the zero row and
// column sums per example of a corrected R.
std::vector<double> residual(Checker& chk, const Problem& p, const std::vector<double>& gp,
                             std::span<const int8_t> q, double D, bool corrected,
                             const char* name) {
  const int64_t T = p.T, N = p.N, S = p.S;
  const ErrorStatsD st = error_stats(p, gp, q, D);
  std::vector<double> r(st.e), mag(st.e.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t b = t / S, i = t * N + n;
      if (corrected) r[i] -= estr(st, t, n, S, N);
      mag[i] =
          std::fabs(st.e[i]) + std::fabs(st.a[b * N + n]) + std::fabs(st.c[t]) + std::fabs(st.m[b]);
    }
  }
  if (!corrected) return r;
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0.0, abs_sum = 0.0;
    for (int64_t n = 0; n < N; ++n) sum += r[t * N + n], abs_sum += mag[t * N + n];
    chk.near(0.0, sum, residual_sum_tolerance(abs_sum, S, N),
             [&] { return str(name, ": row sum of R = E - Estr at t=", t); });
  }
  for (int64_t b = 0; b < p.B(); ++b) {
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t t = b * S; t < (b + 1) * S; ++t) sum += r[t * N + n], abs_sum += mag[t * N + n];
      chk.near(0.0, sum, residual_sum_tolerance(abs_sum, S, N),
               [&] { return str(name, ": column sum of R = E - Estr at b=", b, ", n=", n); });
    }
  }
  return r;
}

TEST(QuantLinearResidual, GradientErrorIsResidualThroughBothProducts) {
  const Problem p = make_problem(16, 20, 17, 4, 31u, false);
  const Operands o = forward_operands(p);
  const Reference ref = unquantized_backward(p, o);
  const std::vector<double> gp = exact_folded(p, o);
  s3r::testing::ScopedThreads one_thread(1);  // as in (a)
  Checker chk("");
  for (Isa isa : s3r::testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    for (LinearMode mode : kInt8Modes) {
      LayerRun run;
      prepare(run, p, mode);
      for (Correction correction : kAllCorrections) {
        chk.set_context(str(isa_name(isa), ", mode ", to_string(mode), ", correction ",
                            to_string(correction), ", ", p.shape()));
        AlignedVector<float> dx(static_cast<size_t>(p.T * p.K)), dw(static_cast<size_t>(p.K * p.N));
        const Key key = make_layer_key(77, 1, static_cast<uint32_t>(correction));
        linear_backward(dx, dw, p.g, run.in, run.weight, backward_config(p, correction, key, false),
                        run.ws);
        // R from the codes the layer used and G' (double).
        const QuantizedGrad& qg = run.ws.grad;
        const double D = qg.step;
        const bool correct_dx = correction != Correction::kNone;
        const bool correct_dw = correction == Correction::kTwoWay;
        const std::vector<double> r_dx =
            residual(chk, p, gp, qg.codes_for_dx(), D, correct_dx, "dX");
        const std::vector<double> r_dw =
            residual(chk, p, gp, qg.codes_for_dw(), D, correct_dw, "dW");
        // f32 tolerances of the layer (as in (a)) with the magnitudes of these codes.
        const StatEps eps = stat_eps(p, gp, D);
        const Magnitudes mg_dx =
            magnitudes(p, qg.codes_for_dx(), error_stats(p, gp, qg.codes_for_dx(), D), eps, D);
        const Magnitudes mg_dw =
            magnitudes(p, qg.codes_for_dw(), error_stats(p, gp, qg.codes_for_dw(), D), eps, D);
        for (int64_t t = 0; t < p.T; ++t) {
          for (int64_t k = 0; k < p.K; ++k) {
            double err = 0.0, abs_sum = 0.0;  // (1/sx) (R Wq^T)[t, k]
            for (int64_t n = 0; n < p.N; ++n) {
              const double w = o.wq[k * p.N + n];
              err += r_dx[t * p.N + n] * w;
              abs_sum += (std::fabs(r_dx[t * p.N + n]) + std::fabs(gp[t * p.N + n])) * std::fabs(w);
            }
            err /= o.sx[t];
            const size_t i = static_cast<size_t>(t * p.K + k);
            // The layer's f32 error, and the double rounding of dX_ref and R Wq^T / sx.
            const double tol =
                dx_tolerance(p, o, mg_dx, t, k, correct_dx, 0.0) + ref_slack(p, abs_sum / o.sx[t]);
            chk.near(err, dx[i] - ref.dx[i], tol,
                     [&] { return str("dX - dX_ref vs R Wq^T / sx at [t=", t, ", k=", k, "]"); });
          }
        }
        for (int64_t k = 0; k < p.K; ++k) {
          for (int64_t n = 0; n < p.N; ++n) {
            double err = 0.0, abs_sum = 0.0;  // (1/sw) (Xq^T R)[k, n]
            for (int64_t t = 0; t < p.T; ++t) {
              const double xv = o.xq[t * p.K + k];
              err += xv * r_dw[t * p.N + n];
              abs_sum +=
                  std::fabs(xv) * (std::fabs(r_dw[t * p.N + n]) + std::fabs(gp[t * p.N + n]));
            }
            err /= o.sw[n];
            const size_t i = static_cast<size_t>(k * p.N + n);
            const double tol =
                dw_tolerance(p, o, mg_dw, k, n, correct_dw) + ref_slack(p, abs_sum / o.sw[n]);
            chk.near(err, dw[i] - ref.dw[i], tol,
                     [&] { return str("dW - dW_ref vs Xq^T R / sw at [k=", k, ", n=", n, "]"); });
          }
        }
      }
    }
  }
  EXPECT_EQ(chk.failures(), 0) << chk.summary();
  EXPECT_GT(chk.checks(), 0);
}

// ---------------------------------------------------------------------------------------------
// Errors (SPEC 1): a non-finite X or W is an error naming the tensor; a non-finite G is reported
// as NonFiniteGradient; operands prepared for different modes do not mix.

TEST(QuantLinearErrors, NonFiniteOperandsAndMismatchedModesThrow) {
  const Problem p = make_problem(12, 20, 17, 4, 41u, false);
  for (LinearMode mode : kInt8Modes) {
    SCOPED_TRACE(str("mode ", to_string(mode)));
    Problem bad = p;
    bad.x[3 * p.K + 2] = std::numeric_limits<float>::quiet_NaN();
    bad.w[4 * p.N + 1] = std::numeric_limits<float>::infinity();
    LinearInput in;
    LinearWeight weight;
    try {
      prepare_input(in, bad.x, p.T, p.K, mode, "blocks.0.test.X");
      ADD_FAILURE() << "NaN in X was quantized silently";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("blocks.0.test.X"), std::string::npos) << e.what();
    }
    try {
      prepare_weight(weight, bad.w, p.K, p.N, mode, "blocks.0.test.W");
      ADD_FAILURE() << "Inf in W was quantized silently";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("blocks.0.test.W"), std::string::npos) << e.what();
    }
    LayerRun run;
    prepare(run, p, mode);
    AlignedVector<float> g = p.g, dx(static_cast<size_t>(p.T * p.K)),
                       dw(static_cast<size_t>(p.K * p.N));
    g[5 * p.N + 6] = -std::numeric_limits<float>::infinity();
    const LinearBackwardConfig config = backward_config(p, Correction::kTwoWay, Key{1, 2}, false);
    EXPECT_THROW(linear_backward(dx, dw, g, run.in, run.weight, config, run.ws), NonFiniteGradient);
    LayerRun other;
    prepare(other, p, mode == LinearMode::kS3r ? LinearMode::kSr : LinearMode::kS3r);
    EXPECT_THROW(linear_backward(dx, dw, p.g, run.in, other.weight, config, run.ws), Error);
    AlignedVector<float> y(static_cast<size_t>(p.T * p.N));
    EXPECT_THROW(linear_forward(y, run.in, other.weight), Error);
  }
}

}  // namespace
}  // namespace s3r::nn
