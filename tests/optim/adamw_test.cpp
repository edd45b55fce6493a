// AdamW, the learning-rate schedule and clipping against a double-precision reference.
#include "s3r/optim/adamw.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dispatch.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/isa.hpp"
#include "test_util.hpp"

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
  AlignedVector<float> w, g, m, v;
};

// Three steps against the formulas in double; the update's f32 rounding is a few ulps of w.
TEST(AdamW, MatchesDoubleReferenceWithClippingAndDecay) {
  std::mt19937 gen(1);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Tensor a{AlignedVector<float>(50), AlignedVector<float>(50), AlignedVector<float>(50, 0.0f),
           AlignedVector<float>(50, 0.0f)};
  Tensor b{AlignedVector<float>(7), AlignedVector<float>(7), AlignedVector<float>(7, 0.0f),
           AlignedVector<float>(7, 0.0f)};
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
                   const AlignedVector<float>& g, bool decay) {
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

// The norm's partial sums: each chunk of kNormChunk elements (the last one of a tensor shorter)
// is its squares added in order from 0.0 in double, however the chunks are grouped for speed;
// sizes around whole groups of eight chunks, against a plain loop per chunk.
TEST(AdamW, GradSumsOfSquaresAreEachChunkSummedInOrder) {
  std::mt19937 gen(5);
  std::lognormal_distribution<float> magnitude(0.0f, 3.0f);
  for (int64_t n : {int64_t{3}, 8 * kNormChunk, 8 * kNormChunk + 5, 17 * kNormChunk - 1,
                    17 * kNormChunk}) {
    Tensor t{AlignedVector<float>(n, 0.0f), AlignedVector<float>(n), AlignedVector<float>(n, 0.0f),
             AlignedVector<float>(n, 0.0f)};
    for (size_t i = 0; i < t.g.size(); ++i) t.g[i] = (i % 2 ? -1.0f : 1.0f) * magnitude(gen);
    Tensor small{{1.0f}, {0.5f}, {0.0f}, {0.0f}};
    const std::vector<ParamRef> params = {{"t", t.w, t.g, t.m, t.v, true},
                                          {"small", small.w, small.g, small.m, small.v, true}};
    const std::vector<double> sums = grad_sums_of_squares(params);
    const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
    ASSERT_EQ(static_cast<int64_t>(sums.size()), chunks + 1) << "n = " << n;
    for (int64_t c = 0; c < chunks; ++c) {
      double want = 0.0;
      for (int64_t i = c * kNormChunk; i < std::min(n, (c + 1) * kNormChunk); ++i) {
        want += static_cast<double>(t.g[i]) * static_cast<double>(t.g[i]);
      }
      ASSERT_EQ(sums[c], want) << "n = " << n << ", chunk " << c;
    }
    EXPECT_EQ(sums[chunks], 0.25) << "the second tensor's one chunk";
  }
}

// Both passes run as one parallel loop over pieces of every tensor: each element must still be
// updated with its own tensor's state and decay. Tensors of one element, of ten update pieces
// (16384 elements each; the norm's chunks are as long, eight to a piece) with a short last one,
// and of exactly one piece, decay alternating, against the reference kernel applied to each
// tensor alone; then the norm's chunks, each tensor's in order.
TEST(AdamW, OneStepOverManyTensorsUpdatesEachWithItsOwnState) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<int64_t> sizes = {1, 9 * 16384 + 3, 7, 16384, 2};
  std::vector<Tensor> tensors;
  for (int64_t n : sizes) {
    Tensor t{AlignedVector<float>(n), AlignedVector<float>(n), AlignedVector<float>(n), AlignedVector<float>(n)};
    for (int64_t i = 0; i < n; ++i) {
      t.w[i] = normal(gen), t.g[i] = normal(gen), t.m[i] = 0.1f * normal(gen);
      t.v[i] = 0.01f * std::abs(normal(gen));
    }
    tensors.push_back(t);
  }
  const std::vector<Tensor> before = tensors;
  std::vector<ParamRef> params;
  for (size_t k = 0; k < tensors.size(); ++k) {
    Tensor& t = tensors[k];
    std::string name = "t";  // appended, not "t" + ...: GCC 12 warns falsely (-Wrestrict) there
    name += std::to_string(k);
    params.push_back({name, t.w, t.g, t.m, t.v, k % 2 == 0});
  }
  AdamWConfig c;
  c.clip_norm = 0.0f;  // no clipping: the scalars do not depend on the norm
  c.weight_decay = 0.1f;
  ASSERT_TRUE(adamw_step(params, c, 1e-3f, 3, nullptr));
  const AdamWScalars s = adamw_scalars(c, 1e-3f, 3, 1.0);
  for (size_t k = 0; k < tensors.size(); ++k) {
    Tensor want = before[k];
    kernels::AdamWElements e;
    e.w = want.w.data(), e.m = want.m.data(), e.v = want.v.data(), e.g = want.g.data();
    e.clip = s.clip, e.beta1 = c.beta1, e.one_minus_beta1 = 1.0f - c.beta1, e.beta2 = c.beta2;
    e.one_minus_beta2 = 1.0f - c.beta2, e.lr = s.lr, e.bias1 = s.bias1, e.bias2 = s.bias2, e.eps = c.eps;
    e.decay = k % 2 == 0 ? s.lr * c.weight_decay : 0.0f;
    ASSERT_TRUE(kernels::ref::adamw_update(e, 0, sizes[k], true));
    EXPECT_EQ(tensors[k].w, want.w) << "tensor " << k;
    EXPECT_EQ(tensors[k].m, want.m) << "tensor " << k;
    EXPECT_EQ(tensors[k].v, want.v) << "tensor " << k;
  }
  // The norm's chunks: the terms of each tensor in order, one per chunk of kNormChunk.
  const std::vector<double> sums = grad_sums_of_squares(params);
  size_t term = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const AlignedVector<float>& g = tensors[k].g;
    for (size_t c0 = 0; c0 < g.size(); c0 += kNormChunk) {
      double want = 0.0;
      for (size_t i = c0; i < std::min(g.size(), c0 + kNormChunk); ++i) {
        want += static_cast<double>(g[i]) * g[i];
      }
      ASSERT_LT(term, sums.size());
      EXPECT_EQ(sums[term++], want) << "tensor " << k << ", chunk at " << c0;
    }
  }
  EXPECT_EQ(term, sums.size());
}

// The update kernel of every vector tier against the reference, bit for bit: lengths around the
// vector widths (8, 16) and their tails, both passes, state from tiny to huge (some updates
// overflow), with and without decay and clipping.
TEST(AdamWKernels, EveryTierMatchesTheReferenceBitForBit) {
  const auto tiers = testing::vector_isas();
  S3R_SKIP_WITHOUT_VECTOR_TIERS(tiers);
  std::mt19937 gen(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::lognormal_distribution<float> magnitude(0.0f, 4.0f);
  int overflowing = 0, finite = 0;
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 33, 100}) {
    for (int trial = 0; trial < 6; ++trial) {
      Tensor t{AlignedVector<float>(n), AlignedVector<float>(n), AlignedVector<float>(n),
               AlignedVector<float>(n)};
      for (int64_t i = 0; i < n; ++i) {
        t.w[i] = normal(gen) * (trial == 5 ? 1e37f : 1.0f);
        t.g[i] = normal(gen) * magnitude(gen);
        t.m[i] = 0.1f * normal(gen);
        t.v[i] = 0.01f * magnitude(gen);
      }
      kernels::AdamWElements e;
      e.g = t.g.data();
      e.clip = trial % 2 ? 0.37f : 1.0f;
      e.beta1 = 0.9f, e.one_minus_beta1 = 1.0f - 0.9f, e.beta2 = 0.95f;
      e.one_minus_beta2 = 1.0f - 0.95f;
      e.lr = trial == 4 ? 3e38f : 3e-4f, e.bias1 = 0.19f, e.bias2 = 0.0975f, e.eps = 1e-8f;
      e.decay = trial % 3 ? 3e-5f : 0.0f;
      for (bool write : {false, true}) {
        Tensor want = t;
        e.w = want.w.data(), e.m = want.m.data(), e.v = want.v.data();
        const bool want_finite = kernels::ref::adamw_update(e, 0, n, write);
        (want_finite ? finite : overflowing) += 1;
        if (!write) {
          ASSERT_EQ(want.w, t.w) << "the check pass wrote";
        }
        for (Isa isa : tiers) {
          Tensor got = t;
          e.w = got.w.data(), e.m = got.m.data(), e.v = got.v.data();
          ASSERT_EQ(kernels::kernels_for(isa).adamw_update(e, 0, n, write), want_finite)
              << isa_name(isa) << " n=" << n << " trial " << trial;
          for (int64_t i = 0; i < n; ++i) {
            // Bit patterns: NaN != NaN, and +0 == -0, would hide a difference.
            ASSERT_EQ(std::bit_cast<uint32_t>(got.w[i]), std::bit_cast<uint32_t>(want.w[i]))
                << isa_name(isa) << " w[" << i << "] n=" << n << " trial " << trial;
            ASSERT_EQ(std::bit_cast<uint32_t>(got.m[i]), std::bit_cast<uint32_t>(want.m[i]))
                << isa_name(isa) << " m[" << i << "] n=" << n << " trial " << trial;
            ASSERT_EQ(std::bit_cast<uint32_t>(got.v[i]), std::bit_cast<uint32_t>(want.v[i]))
                << isa_name(isa) << " v[" << i << "] n=" << n << " trial " << trial;
          }
        }
      }
    }
  }
  // Both outcomes were exercised (the huge learning rate and the huge weights overflow).
  EXPECT_GT(overflowing, 0);
  EXPECT_GT(finite, 0);
}

// A state of n elements: weights of magnitude `w`, gradients `g`, first moments `m` (random
// signs) and second moments `v` (>= 0), one element of each set to exactly that magnitude.
Tensor scaled_state(int64_t n, uint32_t seed, float w, float g, float m, float v) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor t{AlignedVector<float>(n), AlignedVector<float>(n), AlignedVector<float>(n), AlignedVector<float>(n)};
  for (int64_t i = 0; i < n; ++i) {
    t.w[i] = w * u(gen), t.g[i] = g * u(gen), t.m[i] = m * u(gen), t.v[i] = v * std::abs(u(gen));
  }
  t.w[0] = w, t.g[1 % n] = g, t.m[2 % n] = -m, t.v[3 % n] = v;
  return t;
}

// The moments' bounds are valid only for v >= 0 (the proof's denominator sqrt(v' / bias2) + eps
// needs it): -0 is fine, any v below 0 is not, nor a v or m that is not finite.
TEST(AdamWBounds, MomentBoundsRefuseANegativeSecondMoment) {
  Tensor t = scaled_state(19, 7, 1.0f, 1.0f, 0.5f, 0.25f);
  const std::vector<ParamRef> params = {{"t", t.w, t.g, t.m, t.v, true}};
  AdamWBounds b = moment_bounds(params);
  EXPECT_TRUE(b.valid);
  EXPECT_EQ(b.m, 0.5);
  EXPECT_EQ(b.v, 0.25);
  t.v[11] = -0.0f;
  EXPECT_TRUE(moment_bounds(params).valid);
  t.v[11] = -1e-30f;
  EXPECT_FALSE(moment_bounds(params).valid);
  t.v[11] = 0.0f;
  t.m[5] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(moment_bounds(params).valid);
}

// The proof is sound: wherever adamw_proves_finite says an update stays finite, the pass that
// checks every element agrees, over states from ordinary to near FLT_MAX; and it proves the
// ordinary ones (else adamw_step would never skip its check pass).
TEST(AdamWBounds, ProofHoldsOnlyWhereTheCheckingPassAgrees) {
  const float mags[] = {1e-3f, 1.0f, 1e10f, 1e18f, 1e30f, 3e36f, 3.3e38f};
  int proved = 0, refused = 0;
  uint32_t seed = 0;
  for (float w : mags) {
    for (float g : {1.0f, 1e18f, 1e20f}) {
      for (float mv : {0.0f, 1.0f, 1e30f}) {
        for (float lr : {1e-3f, 1e30f, 3e38f}) {
          Tensor t = scaled_state(37, ++seed, w, g, mv, mv * mv > 3e38f ? 3e38f : mv * mv);
          const std::vector<ParamRef> params = {{"t", t.w, t.g, t.m, t.v, true}};
          const AdamWConfig c;
          const double norm = global_grad_norm(params);
          if (!std::isfinite(norm)) continue;
          const AdamWScalars s = adamw_scalars(c, lr, 2, norm);
          AdamWBounds next;
          const bool proof = adamw_proves_finite(c, s, s.lr * c.weight_decay, weight_abs_max(params), norm * 1.000001,
                                                 moment_bounds(params), &next);
          const bool finite = adamw_keeps_finite(params, c, s);
          (proof ? proved : refused) += 1;
          EXPECT_TRUE(!proof || finite) << "proved finite, overflows: w " << w << " g " << g << " m " << mv << " lr " << lr;
        }
      }
    }
  }
  // Updates that only the weights themselves overflow, with steps far below the bound's
  // ceiling (a proof that left out max |w| would pass them): a weight that is already +Inf, and
  // a weight near FLT_MAX grown by a negative weight decay.
  const AdamWConfig c;
  AdamWBounds next;
  for (const float wd : {0.1f, -0.01f}) {
    Tensor t = scaled_state(5, 99, 1.0f, 1.0f, 1.0f, 1.0f);
    t.w[0] = wd > 0.0f ? std::numeric_limits<float>::infinity() : 3.4e38f;
    const std::vector<ParamRef> params = {{"t", t.w, t.g, t.m, t.v, true}};
    AdamWConfig cw = c;
    cw.weight_decay = wd;
    const double norm = global_grad_norm(params);
    const AdamWScalars s = adamw_scalars(cw, 1.0f, 2, norm);
    EXPECT_FALSE(adamw_keeps_finite(params, cw, s)) << wd;
    EXPECT_FALSE(adamw_proves_finite(cw, s, std::fabs(s.lr * wd), weight_abs_max(params), norm * 1.000001,
                                     moment_bounds(params), &next)) << wd;
  }
  EXPECT_GT(proved, 10);
  EXPECT_GT(refused, 10);
  // Ordinary training states are proved (the fast path is taken).
  Tensor o = scaled_state(100, 7, 1.0f, 1.0f, 0.1f, 0.01f);
  const std::vector<ParamRef> op = {{"o", o.w, o.g, o.m, o.v, true}};
  const AdamWScalars os = adamw_scalars(c, 3e-4f, 10, global_grad_norm(op));
  EXPECT_TRUE(adamw_proves_finite(c, os, os.lr * c.weight_decay, weight_abs_max(op), 10.0, moment_bounds(op), &next));
  EXPECT_TRUE(next.valid);
}

// adamw_step with bounds kept across steps gives the same bits and the same decisions as
// without, through ordinary steps, a learning rate that overflows (skipped), one too large for
// the proof that does not overflow (checked element by element, applied), and moments written
// from outside (bounds dropped).
TEST(AdamWBounds, StepsWithBoundsAreTheStepsWithout) {
  Tensor a = scaled_state(20000, 3, 1.0f, 1.0f, 0.0f, 0.0f), b = scaled_state(9, 4, 0.5f, 2.0f, 0.0f, 0.0f);
  Tensor a2 = a, b2 = b;
  const std::vector<ParamRef> with = {{"a", a.w, a.g, a.m, a.v, true}, {"b", b.w, b.g, b.m, b.v, false}};
  const std::vector<ParamRef> without = {{"a", a2.w, a2.g, a2.m, a2.v, true}, {"b", b2.w, b2.g, b2.m, b2.v, false}};
  AdamWBounds bounds;
  const AdamWConfig c;
  const float lrs[] = {1e-3f, 1e-2f, 3e38f, 1e30f, 1e-3f, 1e-3f, 1e-3f};
  int skipped = 0;
  for (int64_t t = 1; t <= 7; ++t) {
    if (t == 6) {
      a.m[5] = a2.m[5] = 1e30f;  // written from outside: the owner drops the bounds
      bounds.valid = false;
    }
    double n1 = 0.0, n2 = 0.0;
    const bool s1 = adamw_step(with, c, lrs[t - 1], t, &n1, &bounds);
    const bool s2 = adamw_step(without, c, lrs[t - 1], t, &n2);
    ASSERT_EQ(s1, s2) << "step " << t;
    skipped += s1 ? 0 : 1;
    for (auto [x, y] : {std::pair{&a, &a2}, std::pair{&b, &b2}}) {
      ASSERT_EQ(x->w, y->w) << "step " << t;
      ASSERT_EQ(x->m, y->m) << "step " << t;
      ASSERT_EQ(x->v, y->v) << "step " << t;
    }
    for (size_t i = 0; i < a.g.size(); ++i) a.g[i] = a2.g[i] = a.g[i] * -0.5f;
  }
  EXPECT_GE(skipped, 1);  // the learning rate of 3e38
  EXPECT_LT(skipped, 7);
}

// The bounds carried from step to step hold the moments, and tightly where they can: one
// element with a gradient of constant sign reaches them up to their margin.
TEST(AdamWBounds, CarriedBoundsHoldTheMoments) {
  Tensor t{AlignedVector<float>(1, 0.5f), AlignedVector<float>(1, 0.25f), AlignedVector<float>(1, 0.0f),
           AlignedVector<float>(1, 0.0f)};
  const std::vector<ParamRef> params = {{"t", t.w, t.g, t.m, t.v, true}};
  AdamWConfig c;
  c.clip_norm = 0.0f;
  AdamWBounds bounds;
  for (int64_t step = 1; step <= 6; ++step) {
    ASSERT_TRUE(adamw_step(params, c, 1e-3f, step, nullptr, &bounds));
    ASSERT_TRUE(bounds.valid);
    EXPECT_LE(std::fabs(double(t.m[0])), bounds.m) << "step " << step;
    EXPECT_LE(double(t.v[0]), bounds.v) << "step " << step;
    EXPECT_GE(std::fabs(double(t.m[0])), bounds.m / 1.0001) << "step " << step;  // tight
    t.g[0] *= 1.5f;
  }
}

}  // namespace
}  // namespace s3r::optim
