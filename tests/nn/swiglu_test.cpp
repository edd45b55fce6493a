// SwiGLU block: the f32 path's gradients against central finite differences of a double-precision
// forward, and every mode's forward/backward close to the f32 one.
#include "s3r/nn/swiglu.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "test_util.hpp"

namespace s3r::nn {
namespace {

struct Block {
  int64_t T, C, F;
  AlignedVector<float> x, w1, w3, w2, r;  // r: the upstream gradient dL/dY of L = sum(Y * r)
  GatedActivation act = GatedActivation::kSilu;
};

Block make_block(int64_t T, int64_t C, int64_t F, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Block b{T, C, F, {}, {}, {}, {}, {}};
  auto fill = [&](AlignedVector<float>& v, size_t size, float scale) {
    v.resize(size);
    for (auto& e : v) e = scale * n(gen);
  };
  fill(b.x, T * C, 1.0f);
  fill(b.w1, C * F, 1.0f / std::sqrt(static_cast<float>(C)));
  fill(b.w3, C * F, 1.0f / std::sqrt(static_cast<float>(C)));
  fill(b.w2, F * C, 1.0f / std::sqrt(static_cast<float>(F)));
  fill(b.r, T * C, 1.0f);
  return b;
}

// L = sum_{t,c} Y[t,c] r[t,c] with Y = (act(X W1) * (X W3)) W2, all in double; act = silu, or
// GELU's tanh form written as its definition, 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))).
double loss_double(const Block& b, const std::vector<double>& x, const std::vector<double>& w1,
                   const std::vector<double>& w3, const std::vector<double>& w2) {
  double loss = 0.0;
  std::vector<double> hidden(b.F);
  for (int64_t t = 0; t < b.T; ++t) {
    for (int64_t f = 0; f < b.F; ++f) {
      double h1 = 0.0, h3 = 0.0;
      for (int64_t c = 0; c < b.C; ++c) {
        h1 += x[t * b.C + c] * w1[c * b.F + f];
        h3 += x[t * b.C + c] * w3[c * b.F + f];
      }
      const double u = std::sqrt(2.0 / std::acos(-1.0)) * (h1 + 0.044715 * h1 * h1 * h1);
      hidden[f] = (b.act == GatedActivation::kSilu ? h1 / (1.0 + std::exp(-h1)) : 0.5 * h1 * (1.0 + std::tanh(u))) * h3;
    }
    for (int64_t c = 0; c < b.C; ++c) {
      double y = 0.0;
      for (int64_t f = 0; f < b.F; ++f) y += hidden[f] * w2[f * b.C + c];
      loss += y * b.r[t * b.C + c];
    }
  }
  return loss;
}

std::vector<double> to_double(const AlignedVector<float>& v) { return {v.begin(), v.end()}; }

struct Result {
  AlignedVector<float> y, dx, dw1, dw3, dw2;
};

Result run_block(const Block& b, LinearMode mode, Correction corr = Correction::kNone,
                 int64_t S = 0) {
  Result r{AlignedVector<float>(b.T * b.C), AlignedVector<float>(b.T * b.C),
           AlignedVector<float>(b.C * b.F), AlignedVector<float>(b.C * b.F),
           AlignedVector<float>(b.F * b.C)};
  SwigluState st;
  SwigluScratch scratch;
  swiglu_forward(r.y, b.x, {b.w1, b.w3, b.w2}, b.T, b.C, b.F, mode, st, scratch, b.act);
  swiglu_backward(r.dx, {r.dw1, r.dw3, r.dw2}, b.r, corr, S ? S : b.T,
                  fold_in(key_from_seed(5), 0), 0, st, scratch);
  return r;
}

// Parameters in double: X, W1, W3, W2.
struct Params {
  std::vector<double> v[4];
  double loss(const Block& b) const { return loss_double(b, v[0], v[1], v[2], v[3]); }
};

// Central differences with step h = 1e-4 (|v| + 1) in double: truncation error O(h^2 |L'''|) and
// rounding O(1e-16 |L| / h), both below 1e-7 relative here. The f32 analytic gradient carries
// f32 rounding of sums of about C*F terms: we allow 1e-3 of the gradient's RMS plus 1e-4
// relative, far above f32's ~1e-6 and far below any error in a derivative formula (a wrong
// factor or term changes entries by O(RMS)).
void check_gradient(const char* name, const Block& b, Params& p, int which,
                    const AlignedVector<float>& analytic) {
  double rms = 0.0;
  for (float g : analytic) rms += static_cast<double>(g) * g;
  rms = std::sqrt(rms / static_cast<double>(analytic.size()));
  ASSERT_GT(rms, 0.0) << name;
  std::vector<double>& param = p.v[which];
  ASSERT_EQ(param.size(), analytic.size()) << name;
  std::mt19937 gen(17 + which);
  std::uniform_int_distribution<size_t> pick(0, param.size() - 1);
  for (int trial = 0; trial < 16; ++trial) {
    const size_t i = pick(gen);
    const double v = param[i];
    const double h = 1e-4 * (std::fabs(v) + 1.0);
    param[i] = v + h;
    const double lp = p.loss(b);
    param[i] = v - h;
    const double lm = p.loss(b);
    param[i] = v;
    const double fd = (lp - lm) / (2.0 * h);
    EXPECT_NEAR(analytic[i], fd, 1e-3 * rms + 1e-4 * std::fabs(fd)) << name << "[" << i << "]";
  }
}

class GatedF32 : public ::testing::TestWithParam<GatedActivation> {};

TEST_P(GatedF32, GradientsMatchFiniteDifferences) {
  Block b = make_block(6, 8, 12, 1);
  b.act = GetParam();
  const Result r = run_block(b, LinearMode::kF32);
  Params p{{to_double(b.x), to_double(b.w1), to_double(b.w3), to_double(b.w2)}};
  // The forward itself: L of the f32 block equals the double loss to f32 accuracy.
  double loss = 0.0;
  for (size_t i = 0; i < r.y.size(); ++i) loss += static_cast<double>(r.y[i]) * b.r[i];
  EXPECT_NEAR(loss, p.loss(b), 1e-4 * (std::fabs(loss) + 1.0));
  check_gradient("dX", b, p, 0, r.dx);
  check_gradient("dW1", b, p, 1, r.dw1);
  check_gradient("dW3", b, p, 2, r.dw3);
  check_gradient("dW2", b, p, 3, r.dw2);
}

INSTANTIATE_TEST_SUITE_P(Swiglu, GatedF32, ::testing::Values(GatedActivation::kSilu, GatedActivation::kGeluTanh),
                         [](const auto& info) { return info.param == GatedActivation::kSilu ? "Silu" : "GeluTanh"; });

double relative_error(const AlignedVector<float>& got, const AlignedVector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

// Every mode computes the same function: its outputs and gradients stay close to f32's. These
// are loose sanity bounds (int8 codes carry ~1% relative error per operand; the gradient of a
// 3-product chain with a stochastic int8 gradient a few %); the exact numerics of each mode are
// tested in quant_linear_test.cpp.
TEST(Swiglu, EveryModeTracksTheF32Block) {
  const Block b = make_block(64, 48, 96, 2);
  const Result ref = run_block(b, LinearMode::kF32);
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    for (LinearMode mode : {LinearMode::kBf16, LinearMode::kRtne, LinearMode::kSr, LinearMode::kS3r,
                            LinearMode::kS3rBcast}) {
      for (Correction corr : {Correction::kNone, Correction::kDx, Correction::kTwoWay}) {
        if (!is_int8(mode) && corr != Correction::kNone) continue;
        const Result r = run_block(b, mode, corr, 16);
        const std::string ctx = std::string(to_string(mode)) + " + " + std::string(to_string(corr));
        const double bound_y = mode == LinearMode::kBf16 ? 0.02 : 0.05;
        const double bound_g = mode == LinearMode::kBf16 ? 0.03 : 0.25;
        EXPECT_LT(relative_error(r.y, ref.y), bound_y) << ctx;
        EXPECT_LT(relative_error(r.dx, ref.dx), bound_g) << ctx << " dX";
        EXPECT_LT(relative_error(r.dw1, ref.dw1), bound_g) << ctx << " dW1";
        EXPECT_LT(relative_error(r.dw3, ref.dw3), bound_g) << ctx << " dW3";
        EXPECT_LT(relative_error(r.dw2, ref.dw2), bound_g) << ctx << " dW2";
      }
    }
  }
}

// "" when got and want hold the same bits, else the first index where they differ and both values.
std::string first_difference(const AlignedVector<float>& got, const AlignedVector<float>& want) {
  if (got.size() != want.size()) {
    return "size " + std::to_string(got.size()) + " instead of " + std::to_string(want.size());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i])) {
      return "[" + std::to_string(i) + "] = " + std::to_string(got[i]) + " instead of " +
             std::to_string(want[i]);
    }
  }
  return "";
}

// The model runs every block's SwiGLU on one SwigluScratch: forward of block 0, then block 1, then
// the backward of block 1, then block 0. Nothing a block's backward reads may live in the
// scratch, so each block's results must be bit for bit those of a block with a scratch of its
// own; a block whose backward read the scratch's hidden or d_hidden (written last by the other
// block) would differ. S = 16: two examples, so the int8 corrections have more than one mean.
TEST(Swiglu, OneScratchServesEveryBlockBitForBit) {
  const Block b0 = make_block(32, 16, 40, 11), b1 = make_block(32, 16, 40, 12);
  for (LinearMode mode : {LinearMode::kF32, LinearMode::kBf16, LinearMode::kSr, LinearMode::kS3r}) {
    const Correction corr = is_int8(mode) ? Correction::kTwoWay : Correction::kNone;
    const Result alone0 = run_block(b0, mode, corr, 16), alone1 = run_block(b1, mode, corr, 16);
    // Sized like them and filled with garbage, not copied from them: an output the shared-scratch
    // run fails to write must not pass for the alone run's value.
    Result r0 = alone0, r1 = alone1;
    for (Result* r : {&r0, &r1}) {
      for (AlignedVector<float>* v : {&r->y, &r->dx, &r->dw1, &r->dw3, &r->dw2}) {
        std::fill(v->begin(), v->end(), std::nanf(""));
      }
    }
    SwigluState st0, st1;
    SwigluScratch shared;
    swiglu_forward(r0.y, b0.x, {b0.w1, b0.w3, b0.w2}, 32, 16, 40, mode, st0, shared);
    swiglu_forward(r1.y, b1.x, {b1.w1, b1.w3, b1.w2}, 32, 16, 40, mode, st1, shared);
    const Key key = fold_in(key_from_seed(5), 0);
    swiglu_backward(r1.dx, {r1.dw1, r1.dw3, r1.dw2}, b1.r, corr, 16, key, 0, st1, shared);
    swiglu_backward(r0.dx, {r0.dw1, r0.dw3, r0.dw2}, b0.r, corr, 16, key, 0, st0, shared);
    for (int block = 0; block < 2; ++block) {
      const Result& got = block == 0 ? r0 : r1;
      const Result& want = block == 0 ? alone0 : alone1;
      const std::string ctx = std::string(to_string(mode)) + " block " + std::to_string(block);
      EXPECT_EQ(first_difference(got.y, want.y), "") << ctx << " Y";
      EXPECT_EQ(first_difference(got.dx, want.dx), "") << ctx << " dX";
      EXPECT_EQ(first_difference(got.dw1, want.dw1), "") << ctx << " dW1";
      EXPECT_EQ(first_difference(got.dw3, want.dw3), "") << ctx << " dW3";
      EXPECT_EQ(first_difference(got.dw2, want.dw2), "") << ctx << " dW2";
    }
  }
}

// The int8 backward takes the gate's and the up projection's gradient maxima while it writes
// dh1 and dh3, so that their quantizers read them once. Its dW1, dW3 and dX must be the bits of
// the same layers' backward given dh1 and dh3 without those maxima (quantize_gradient's own pass);
// a maximum taken with the other projection's scales, or over part of the rows, would differ.
// T = 40: blocks of 16 rows and a partial one; F = 20: a partial vector per row.
TEST(Swiglu, MaximaTakenWithTheActivationsGradientChangeNoBit) {
  const Block b = make_block(40, 16, 20, 21);
  for (Isa isa : testing::runnable_isas()) {
    ScopedIsa scoped(isa);
    for (LinearMode mode : {LinearMode::kRtne, LinearMode::kSr, LinearMode::kS3r, LinearMode::kS3rBcast}) {
      for (Correction corr : {Correction::kNone, Correction::kTwoWay}) {
        const std::string ctx = std::string(isa_name(isa)) + " " + std::string(to_string(mode)) + " + " +
                                std::string(to_string(corr));
        Result r{AlignedVector<float>(b.T * b.C), AlignedVector<float>(b.T * b.C),
                 AlignedVector<float>(b.C * b.F), AlignedVector<float>(b.C * b.F),
                 AlignedVector<float>(b.F * b.C)};
        SwigluState st;
        SwigluScratch scratch;
        swiglu_forward(r.y, b.x, {b.w1, b.w3, b.w2}, b.T, b.C, b.F, mode, st, scratch);
        const Key key = fold_in(key_from_seed(5), 0);
        swiglu_backward(r.dx, {r.dw1, r.dw3, r.dw2}, b.r, corr, 8, key, 0, st, scratch);
        // The gate and up layers again, from the block's own dh1 and dh3 (in its scratch), as
        // swiglu_backward calls them but with the quantizers taking their own maxima.
        AlignedVector<float> dx(b.T * b.C), dw1(b.C * b.F), dw3(b.C * b.F);
        LinearWorkspace ws;
        LinearBackwardConfig cfg{corr, 8, fold_in(key, 0), false, 0};
        linear_backward(dx, dw1, scratch.dh1, st.x_in, st.gate_w, cfg, ws);
        cfg.layer_key = fold_in(key, 1);
        cfg.layer_index = 1;
        cfg.accumulate_dx = true;
        linear_backward(dx, dw3, scratch.dh3, st.x_in, st.up_w, cfg, ws);
        EXPECT_EQ(first_difference(r.dw1, dw1), "") << ctx << " dW1";
        EXPECT_EQ(first_difference(r.dw3, dw3), "") << ctx << " dW3";
        EXPECT_EQ(first_difference(r.dx, dx), "") << ctx << " dX";
      }
    }
  }
}

TEST(Swiglu, BadInputIsRejected) {
  const Block b = make_block(4, 8, 12, 3);
  AlignedVector<float> y(4 * 8);
  SwigluState st;
  SwigluScratch scratch;
  EXPECT_THROW(swiglu_forward(y, b.x, {b.w1, b.w3, b.w2}, 4, 8, 13, LinearMode::kS3r, st, scratch),
               Error);
  AlignedVector<float> x_bad = b.x;
  x_bad[5] = std::nanf("");
  try {
    swiglu_forward(y, x_bad, {b.w1, b.w3, b.w2}, 4, 8, 12, LinearMode::kS3r, st, scratch);
    FAIL() << "expected an error for NaN in X";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ffn.X"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace s3r::nn
