// The mixture-of-experts block (s3r/nn/moe.hpp): its forward against a direct computation in
// double, its backward (experts, router, losses) against finite differences, and its int8
// backward the same bits in every tier and thread count.
#include "s3r/nn/moe.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/isa.hpp"
#include "test_util.hpp"

namespace s3r::nn {
namespace {

struct Layer {
  MoeShape shape;
  AlignedVector<float> x, router, gate, up, down;
  MoeWeights weights() const { return {router, gate, up, down}; }
};

Layer make_layer(int64_t T, int64_t C, int64_t F, int64_t E, int64_t k, int64_t S, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Layer l{{T, C, F, E, k, S}, {}, {}, {}, {}, {}};
  const auto fill = [&](AlignedVector<float>& v, int64_t n, float scale) {
    v.resize(static_cast<size_t>(n));
    for (float& a : v) a = scale * normal(gen);
  };
  fill(l.x, T * C, 1.0f);
  fill(l.router, C * E, 0.5f);
  fill(l.gate, E * C * F, 0.3f);
  fill(l.up, E * C * F, 0.3f);
  fill(l.down, E * F * C, 0.3f);
  return l;
}

// Y by its definition, in double: softmax, the top k (ties: the lower expert), renormalized
// weights, SwiGLU experts.
std::vector<double> direct_forward(const Layer& l) {
  const auto& s = l.shape;
  const int64_t C = s.width, F = s.expert_width, E = s.experts;
  std::vector<double> y(static_cast<size_t>(s.tokens * C), 0.0);
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::vector<double> z(E, 0.0), p(E);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t c = 0; c < C; ++c) z[e] += double(l.x[t * C + c]) * l.router[c * E + e];
    }
    const double m = *std::max_element(z.begin(), z.end());
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(z[e] - m);
    std::vector<int64_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double chosen = 0.0;
    for (int64_t j = 0; j < s.top_k; ++j) chosen += p[order[j]];
    for (int64_t j = 0; j < s.top_k; ++j) {
      const int64_t e = order[j];
      for (int64_t c = 0; c < C; ++c) {
        double out = 0.0;
        for (int64_t f = 0; f < F; ++f) {
          double h1 = 0.0, h3 = 0.0;
          for (int64_t i = 0; i < C; ++i) {
            h1 += double(l.x[t * C + i]) * l.gate[(e * C + i) * F + f];
            h3 += double(l.x[t * C + i]) * l.up[(e * C + i) * F + f];
          }
          out += h1 / (1.0 + std::exp(-h1)) * h3 * l.down[(e * F + f) * C + c];
        }
        y[t * C + c] += p[e] / chosen * out;
      }
    }
  }
  return y;
}

TEST(Moe, ForwardIsTheWeightedSumOfTheChosenExperts) {
  const Layer l = make_layer(12, 8, 6, 5, 2, 4, 1);
  MoeState st;
  MoeScratch scratch;
  AlignedVector<float> y(l.x.size());
  moe_forward(y, l.x, l.weights(), l.shape, LinearMode::kF32, 0, st, scratch);
  const std::vector<double> want = direct_forward(l);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], want[i], 1e-5 * (1.0 + std::fabs(want[i]))) << i;
  int64_t rows = 0;
  for (int64_t e = 0; e < l.shape.experts; ++e) rows += st.rows_of(e);
  EXPECT_EQ(rows, l.shape.tokens * l.shape.top_k);
}

// J = sum R * Y + aux (its mean over examples) + z (its mean over tokens), each with its
// coefficient; loss_scale 1/T.
double objective(Layer& l, const AlignedVector<float>& r, const MoeLossWeights& lw) {
  MoeState st;
  MoeScratch scratch;
  AlignedVector<float> y(l.x.size());
  moe_forward(y, l.x, l.weights(), l.shape, LinearMode::kF32, 0, st, scratch);
  double j = 0.0;
  for (size_t i = 0; i < y.size(); ++i) j += double(r[i]) * y[i];
  const double B = double(l.shape.tokens / l.shape.tokens_per_example);
  return j + lw.aux * st.aux_loss / B + lw.z_loss * st.z_loss / double(l.shape.tokens);
}

TEST(Moe, GradientsMatchFiniteDifferences) {
  Layer l = make_layer(16, 8, 6, 4, 2, 8, 3);
  AlignedVector<float> r(l.x.size());
  std::mt19937 gen(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : r) v = normal(gen);
  const MoeLossWeights lw{0.5f, 0.3f};  // large, so that their gradients are visible
  MoeState st;
  MoeScratch scratch;
  AlignedVector<float> y(l.x.size()), dx(l.x.size());
  AlignedVector<float> dr(l.router.size()), dg(l.gate.size()), du(l.up.size()), dd(l.down.size());
  moe_forward(y, l.x, l.weights(), l.shape, LinearMode::kF32, 0, st, scratch);
  moe_backward(dx, {dr, dg, du, dd}, r, Correction::kNone, key_from_seed(1), 4, lw,
               1.0f / float(l.shape.tokens), st, scratch, BatchPlacement{});
  const auto check = [&](AlignedVector<float>& param, const AlignedVector<float>& grad, const char* name) {
    for (size_t i = 0; i < param.size(); i += std::max<size_t>(1, param.size() / 23)) {
      const float keep = param[i];
      const float h = 1e-2f * std::max(1.0f, std::fabs(keep));
      param[i] = keep + h;
      const double up = objective(l, r, lw);
      param[i] = keep - h;
      const double down = objective(l, r, lw);
      param[i] = keep;
      const double fd = (up - down) / (2.0 * h);
      EXPECT_NEAR(grad[i], fd, 2e-3 + 2e-2 * std::fabs(fd)) << name << "[" << i << "]";
    }
  };
  check(l.x, dx, "x");
  check(l.router, dr, "router");
  check(l.gate, dg, "gate");
  check(l.up, du, "up");
  check(l.down, dd, "down");
}

// The losses' gradients alone (R = 0): the router's, checked the same way, catches a wrong
// coefficient of the load-balancing or the z-loss.
TEST(Moe, RoutingLossGradientsMatchFiniteDifferences) {
  Layer l = make_layer(16, 8, 6, 4, 2, 8, 5);
  const AlignedVector<float> r(l.x.size(), 0.0f);
  for (const MoeLossWeights lw : {MoeLossWeights{1.0f, 0.0f}, MoeLossWeights{0.0f, 1.0f}}) {
    MoeState st;
    MoeScratch scratch;
    AlignedVector<float> y(l.x.size()), dx(l.x.size());
    AlignedVector<float> dr(l.router.size()), dg(l.gate.size()), du(l.up.size()), dd(l.down.size());
    moe_forward(y, l.x, l.weights(), l.shape, LinearMode::kF32, 0, st, scratch);
    moe_backward(dx, {dr, dg, du, dd}, r, Correction::kNone, key_from_seed(1), 4, lw,
                 1.0f / float(l.shape.tokens), st, scratch, BatchPlacement{});
    double norm = 0.0;
    for (size_t i = 0; i < l.router.size(); ++i) {
      const float keep = l.router[i], h = 1e-2f;
      l.router[i] = keep + h;
      const double up = objective(l, r, lw);
      l.router[i] = keep - h;
      const double down = objective(l, r, lw);
      l.router[i] = keep;
      const double fd = (up - down) / (2.0 * h);
      norm += fd * fd;
      EXPECT_NEAR(dr[i], fd, 1e-4 + 2e-2 * std::fabs(fd)) << "router[" << i << "] aux " << lw.aux;
    }
    EXPECT_GT(norm, 1e-8) << "the check needs a loss whose gradient is not zero";
  }
}

struct Result {
  AlignedVector<float> y, dx, dr, dg, du, dd;
  bool operator==(const Result&) const = default;
};

Result run_int8(const Layer& l, LinearMode mode, Correction c) {
  MoeState st;
  MoeScratch scratch;
  Result out{AlignedVector<float>(l.x.size()), AlignedVector<float>(l.x.size()), AlignedVector<float>(l.router.size()),
             AlignedVector<float>(l.gate.size()), AlignedVector<float>(l.up.size()),
             AlignedVector<float>(l.down.size())};
  moe_forward(out.y, l.x, l.weights(), l.shape, mode, 64, st, scratch);
  AlignedVector<float> dy(l.x.size());
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = std::sin(0.37f * float(i)) * 1e-3f;
  moe_backward(out.dx, {out.dr, out.dg, out.du, out.dd}, dy, c, key_from_seed(7), 11, {0.01f, 0.001f},
               1.0f / float(l.shape.tokens), st, scratch, BatchPlacement{nullptr, 64, 2});
  return out;
}

float max_abs_diff(const AlignedVector<float>& a, const AlignedVector<float>& b, float* scale) {
  float d = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(a[i] - b[i]));
    *scale = std::max(*scale, std::fabs(b[i]));
  }
  return d;
}

// Every int8 recipe gives the same bits for 1 and 2 threads in every tier, and the reference's
// bits in every tier without the correction; with it, the tiers' f32 statistics and Wq a_b
// (SPEC A.4, A.5) agree with the reference's to f32 rounding.
TEST(Moe, Int8BackwardIsTheSameBitsForAnyThreadCountAndTier) {
  const Layer l = make_layer(64, 32, 24, 6, 2, 16, 11);
  for (LinearMode mode : {LinearMode::kSr, LinearMode::kS3r}) {
    for (Correction c : {Correction::kNone, Correction::kDx, Correction::kTwoWay}) {
      Result ref;
      {
        ScopedIsa isa(Isa::kReference);
        testing::ScopedThreads threads(1);
        ref = run_int8(l, mode, c);
      }
      for (Isa isa : testing::runnable_isas()) {
        ScopedIsa scoped(isa);
        const std::string ctx = std::string(to_string(mode)) + " correction " + std::to_string(int(c)) + " " +
                                std::string(isa_name(isa));
        Result one;
        {
          testing::ScopedThreads st(1);
          one = run_int8(l, mode, c);
        }
        testing::ScopedThreads st(2);
        EXPECT_TRUE(run_int8(l, mode, c) == one) << ctx << ": 1 and 2 threads differ";
        EXPECT_EQ(one.y, ref.y) << ctx;
        if (c == Correction::kNone) {
          EXPECT_TRUE(one == ref) << ctx;
          continue;
        }
        for (auto [got, want] : {std::pair{&one.dx, &ref.dx}, std::pair{&one.dg, &ref.dg}, std::pair{&one.dd, &ref.dd}}) {
          float scale = 0.0f;
          const float d = max_abs_diff(*got, *want, &scale);
          EXPECT_LE(d, 1e-5f * scale) << ctx;
        }
      }
    }
  }
}

TEST(Moe, BadShapesAreRejected) {
  Layer l = make_layer(8, 4, 4, 3, 2, 4, 1);
  MoeState st;
  MoeScratch scratch;
  AlignedVector<float> y(l.x.size());
  for (const auto& [E, k] : {std::pair{3, 4}, std::pair{3, 0}, std::pair{0, 1}}) {
    MoeShape s = l.shape;
    s.experts = E;
    s.top_k = k;
    EXPECT_THROW(moe_forward(y, l.x, l.weights(), s, LinearMode::kF32, 0, st, scratch), Error) << E << " " << k;
  }
}

}  // namespace
}  // namespace s3r::nn
