// AdamW, the learning-rate schedule and clipping against a double-precision reference.
#include "s3r/optim/adamw.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "s3r/core/error.hpp"

namespace s3r::optim {
namespace {

TEST(LrSchedule, WarmupThenCosine) {
  const LrSchedule s{1e-3f, 1e-4f, 10, 110};
  EXPECT_FLOAT_EQ(s.at(0), 1e-4f);
  EXPECT_FLOAT_EQ(s.at(9), 1e-3f);
  EXPECT_FLOAT_EQ(s.at(10), 1e-3f);
  EXPECT_NEAR(s.at(60), 0.5f * (1e-3f + 1e-4f), 1e-9);
  EXPECT_FLOAT_EQ(s.at(110), 1e-4f);
  EXPECT_FLOAT_EQ(s.at(500), 1e-4f);
  for (int64_t t = 10; t < 110; ++t) EXPECT_GE(s.at(t), s.at(t + 1)) << t;
}

struct Tensor {
  std::vector<float> w, g, m, v;
};

// Three steps against the formulas in double; the update's f32 rounding is a few ulps of w.
TEST(AdamW, MatchesDoubleReferenceWithClippingAndDecay) {
  std::mt19937 gen(1);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Tensor a{std::vector<float>(50), std::vector<float>(50), std::vector<float>(50, 0.0f),
           std::vector<float>(50, 0.0f)};
  Tensor b{std::vector<float>(7), std::vector<float>(7), std::vector<float>(7, 0.0f),
           std::vector<float>(7, 0.0f)};
  for (auto& x : a.w) x = n(gen);
  for (auto& x : b.w) x = n(gen);
  const AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f, 0.5f};
  std::vector<double> aw(a.w.begin(), a.w.end()), am(50, 0.0), av(50, 0.0);
  std::vector<double> bw(b.w.begin(), b.w.end()), bm(7, 0.0), bv(7, 0.0);
  for (int64_t t = 1; t <= 3; ++t) {
    for (auto& x : a.g) x = n(gen);
    for (auto& x : b.g) x = n(gen);
    std::vector<ParamRef> params = {{"a", a.w, a.g, a.m, a.v, true}, {"b", b.w, b.g, b.m, b.v, false}};
    double norm = 0.0;
    ASSERT_TRUE(adamw_step(params, cfg, 1e-2f, t, &norm));
    double ss = 0.0;
    for (float g : a.g) ss += double(g) * g;
    for (float g : b.g) ss += double(g) * g;
    EXPECT_NEAR(norm, std::sqrt(ss), 1e-9 * std::sqrt(ss));
    const double clip = std::min(1.0, 0.5 / std::sqrt(ss));
    auto ref = [&](std::vector<double>& w, std::vector<double>& m, std::vector<double>& v,
                   const std::vector<float>& g, bool decay) {
      for (size_t i = 0; i < w.size(); ++i) {
        const double gi = g[i] * clip;
        m[i] = 0.9 * m[i] + 0.1 * gi;
        v[i] = 0.95 * v[i] + 0.05 * gi * gi;
        const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.95, t));
        w[i] -= 1e-2 * mh / (std::sqrt(vh) + 1e-8) + (decay ? 1e-2 * 0.1 * w[i] : 0.0);
      }
    };
    ref(aw, am, av, a.g, true);
    ref(bw, bm, bv, b.g, false);
    for (size_t i = 0; i < aw.size(); ++i) ASSERT_NEAR(a.w[i], aw[i], 1e-5 * (std::fabs(aw[i]) + 1e-2)) << t << " a" << i;
    for (size_t i = 0; i < bw.size(); ++i) ASSERT_NEAR(b.w[i], bw[i], 1e-5 * (std::fabs(bw[i]) + 1e-2)) << t << " b" << i;
  }
}

TEST(AdamW, NonFiniteGradientSkipsTheStep) {
  Tensor a{{1.0f, 2.0f}, {0.5f, std::numeric_limits<float>::quiet_NaN()}, {0.1f, 0.2f}, {0.3f, 0.4f}};
  const Tensor before = a;
  std::vector<ParamRef> params = {{"a", a.w, a.g, a.m, a.v, true}};
  double norm = 0.0;
  EXPECT_FALSE(adamw_step(params, AdamWConfig{}, 1e-3f, 1, &norm));
  EXPECT_TRUE(std::isnan(norm));
  EXPECT_EQ(a.w, before.w);
  EXPECT_EQ(a.m, before.m);
  EXPECT_EQ(a.v, before.v);
}

// A finite gradient whose update overflows a weight (here one near FLT_MAX in the second tensor)
// skips the whole step: the first tensor, already checked and fine, is not touched either.
TEST(AdamW, UpdateThatOverflowsAWeightSkipsTheStep) {
  Tensor a{{1.0f, 2.0f}, {0.5f, -0.25f}, {0.1f, 0.2f}, {0.3f, 0.4f}};
  Tensor b{{-3.3e38f, 1.0f}, {0.5f, 0.5f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
  const Tensor a0 = a, b0 = b;
  std::vector<ParamRef> params = {{"a", a.w, a.g, a.m, a.v, true}, {"b", b.w, b.g, b.m, b.v, false}};
  double norm = 0.0;
  // The decoupled decay is off for b, so only the step of size ~lr overflows -3.3e38.
  EXPECT_FALSE(adamw_step(params, AdamWConfig{}, 1e38f, 1, &norm));
  EXPECT_TRUE(std::isfinite(norm));
  EXPECT_EQ(a.w, a0.w);
  EXPECT_EQ(a.m, a0.m);
  EXPECT_EQ(a.v, a0.v);
  EXPECT_EQ(b.w, b0.w);
  // The same step with a sane learning rate is applied.
  EXPECT_TRUE(adamw_step(params, AdamWConfig{}, 1e-3f, 1, &norm));
  EXPECT_NE(a.w, a0.w);
  EXPECT_THROW(adamw_step(params, AdamWConfig{}, std::nanf(""), 2, &norm), Error);
}

TEST(AdamW, MismatchedStateIsRejected) {
  Tensor a{{1.0f, 2.0f}, {0.5f}, {0.1f, 0.2f}, {0.3f, 0.4f}};
  std::vector<ParamRef> params = {{"blocks.0.w", a.w, a.g, a.m, a.v, true}};
  EXPECT_THROW(adamw_step(params, AdamWConfig{}, 1e-3f, 1, nullptr), Error);
}

}  // namespace
}  // namespace s3r::optim
