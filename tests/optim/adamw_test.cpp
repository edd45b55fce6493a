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
    params.push_back({"t" + std::to_string(k), t.w, t.g, t.m, t.v, k % 2 == 0});
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

}  // namespace
}  // namespace s3r::optim
