// Decoder layers: every hand-written backward against central finite differences of a
// double-precision forward written here from the definitions.
#include "s3r/model/layers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "test_util.hpp"

namespace s3r::model {
namespace {

using Vec = std::vector<double>;

AlignedVector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  AlignedVector<float> v(n);
  for (auto& x : v) x = normal(gen);
  return v;
}

Vec to_double(const AlignedVector<float>& v) { return {v.begin(), v.end()}; }

// Checks analytic[i] against (L(x + h e_i) - L(x - h e_i)) / 2h for a few i, where L is a double
// function of x. h = 1e-5 (|x_i| + 1): truncation O(h^2) and rounding O(1e-16 / h) stay below
// 1e-8 relative; the f32 analytic gradient is accurate to ~1e-6 relative to its scale, so we
// allow 1e-4 of the gradient's RMS (a wrong term or factor changes entries by O(RMS)).
void check(const char* name, Vec x, const std::function<double(const Vec&)>& loss,
           const AlignedVector<float>& analytic, int samples = 24) {
  ASSERT_EQ(x.size(), analytic.size()) << name;
  double rms = 0.0;
  for (float g : analytic) rms += static_cast<double>(g) * g;
  rms = std::sqrt(rms / analytic.size());
  ASSERT_GT(rms, 0.0) << name << ": gradient is identically zero";
  std::mt19937 gen(99);
  std::uniform_int_distribution<size_t> pick(0, x.size() - 1);
  for (int s = 0; s < samples; ++s) {
    const size_t i = pick(gen);
    const double v = x[i], h = 1e-5 * (std::fabs(v) + 1.0);
    x[i] = v + h;
    const double lp = loss(x);
    x[i] = v - h;
    const double lm = loss(x);
    x[i] = v;
    EXPECT_NEAR(analytic[i], (lp - lm) / (2 * h), 1e-4 * rms) << name << "[" << i << "]";
  }
}

TEST(Layers, RmsnormBackwardMatchesFiniteDifferences) {
  const int64_t T = 5, C = 12;
  const float eps = 1e-5f;
  const auto x = random_vec(T * C, 1), w = random_vec(C, 2), r = random_vec(T * C, 3);
  AlignedVector<float> out(T * C), rstd(T), dx(T * C, 0.0f), dw(C, 0.0f);
  rmsnorm_forward(out, rstd, x, w, C, eps);
  rmsnorm_backward(dx, dw, r, x, w, rstd, C);
  auto loss = [&](const Vec& xv, const Vec& wv) {
    double L = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0.0;
      for (int64_t c = 0; c < C; ++c) ss += xv[t * C + c] * xv[t * C + c];
      const double rs = 1.0 / std::sqrt(ss / C + eps);
      for (int64_t c = 0; c < C; ++c) L += xv[t * C + c] * rs * wv[c] * r[t * C + c];
    }
    return L;
  };
  const Vec xd = to_double(x), wd = to_double(w);
  check("rmsnorm dx", xd, [&](const Vec& v) { return loss(v, wd); }, dx);
  check("rmsnorm dw", wd, [&](const Vec& v) { return loss(xd, v); }, dw);
}

// The gains' gradient is SPEC's sum, exactly: per column, over t in order, in double,
// double(dy) * x * rstd, rounded to f32 once. Widths of several 64-column groups (the last one
// partial) are cut into blocks by the thread count: a block that skipped, repeated or shifted
// columns at some thread count shows here as a wrong column.
TEST(Layers, RmsnormGainGradientIsTheOrderedDoubleSumOnAnyThreadCount) {
  for (const int64_t C : {200, 64, 12}) {
    const int64_t T = 37;
    const auto x = random_vec(T * C, 11), w = random_vec(C, 12), dy = random_vec(T * C, 13);
    AlignedVector<float> out(T * C), rstd(T);
    rmsnorm_forward(out, rstd, x, w, C, 1e-5f);
    std::vector<float> want(C);
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0.0;
      for (int64_t t = 0; t < T; ++t) acc += static_cast<double>(dy[t * C + c]) * x[t * C + c] * rstd[t];
      want[c] = static_cast<float>(acc);
    }
    for (int threads : {1, 2, 3, 5}) {
      testing::ScopedThreads scoped(threads);
      AlignedVector<float> dx(T * C), dw(C, 0.0f);
      rmsnorm_backward(dx, dw, dy, x, w, rstd, C);
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(dw[c], want[c]) << "C " << C << ", column " << c << ", " << threads << " threads";
    }
  }
}

TEST(Layers, RopeIsARotationAndItsBackwardItsTranspose) {
  const int64_t S = 7, B = 2, H = 3, HD = 8, C = H * HD;
  const auto x = random_vec(B * S * C, 4), r = random_vec(B * S * C, 5);
  AlignedVector<float> y = x;
  rope_forward(y, S, H, HD, 10000.0f);
  AlignedVector<float> g = r;
  rope_backward(g, S, H, HD, 10000.0f);  // dL/dx for L = sum y * r
  auto loss = [&](const Vec& xv) {
    double L = 0.0;
    for (int64_t t = 0; t < B * S; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < HD / 2; ++i) {
          const double ang = static_cast<double>(t % S) * std::pow(10000.0, -2.0 * i / HD);
          const int64_t o = t * C + h * HD + 2 * i;
          const double a = xv[o], b = xv[o + 1];
          L += (a * std::cos(ang) - b * std::sin(ang)) * r[o] + (a * std::sin(ang) + b * std::cos(ang)) * r[o + 1];
        }
      }
    }
    return L;
  };
  check("rope dx", to_double(x), loss, g);
  // The forward itself, element by element: y starts as a copy of x (RoPE works in place), so
  // only a comparison with the rotation computed here catches positions it failed to rotate.
  // cos and sin are rounded to float (u each), then two products and a sum round (u each): an
  // error below 5u (|a| + |b|), u = 2^-24; we allow 8u. A skipped rotation is off by O(|a| + |b|).
  for (int64_t t = 0; t < B * S; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < HD / 2; ++i) {
        const double ang = static_cast<double>(t % S) * std::pow(10000.0, -2.0 * i / HD);
        const int64_t o = t * C + h * HD + 2 * i;
        const double a = x[o], b = x[o + 1], tol = 8.0 * 0x1p-24 * (std::fabs(a) + std::fabs(b));
        ASSERT_NEAR(y[o], a * std::cos(ang) - b * std::sin(ang), tol) << "rope y[" << o << "]";
        ASSERT_NEAR(y[o + 1], a * std::sin(ang) + b * std::cos(ang), tol) << "rope y[" << o + 1 << "]";
      }
    }
  }
  // Position 0 is the identity; norms are preserved.
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(y[c], x[c]);
  double nx = 0, ny = 0;
  for (size_t i = 0; i < x.size(); ++i) nx += x[i] * x[i], ny += y[i] * y[i];
  EXPECT_NEAR(ny, nx, 1e-5 * nx);
}

TEST(Layers, AttentionBackwardMatchesFiniteDifferences) {
  const int64_t S = 5, B = 2, H = 2, HD = 4, C = H * HD, T = B * S;
  const auto q = random_vec(T * C, 6), k = random_vec(T * C, 7), v = random_vec(T * C, 8),
             r = random_vec(T * C, 9);
  AlignedVector<float> out(T * C), probs(B * H * S * S), dq(T * C), dk(T * C), dv(T * C);
  attention_forward(out, probs, q, k, v, S, H, HD);
  attention_backward(dq, dk, dv, r, q, k, v, probs, S, H, HD);
  auto loss = [&](const Vec& qv, const Vec& kv, const Vec& vv) {
    double L = 0.0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < S; ++i) {
          std::vector<double> s(i + 1);
          double mx = -1e300, sum = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            double d = 0.0;
            for (int64_t e = 0; e < HD; ++e) d += qv[(b * S + i) * C + h * HD + e] * kv[(b * S + j) * C + h * HD + e];
            s[j] = d / std::sqrt(static_cast<double>(HD));
            mx = std::max(mx, s[j]);
          }
          for (auto& x : s) sum += (x = std::exp(x - mx));
          for (int64_t e = 0; e < HD; ++e) {
            double o = 0.0;
            for (int64_t j = 0; j <= i; ++j) o += s[j] / sum * vv[(b * S + j) * C + h * HD + e];
            L += o * r[(b * S + i) * C + h * HD + e];
          }
        }
      }
    }
    return L;
  };
  const Vec qd = to_double(q), kd = to_double(k), vd = to_double(v);
  check("attention dq", qd, [&](const Vec& x) { return loss(x, kd, vd); }, dq);
  check("attention dk", kd, [&](const Vec& x) { return loss(qd, x, vd); }, dk);
  check("attention dv", vd, [&](const Vec& x) { return loss(qd, kd, x); }, dv);
  // Causality: the first token of each example attends only to itself.
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) EXPECT_FLOAT_EQ(probs[((b * H + h) * S) * S], 1.0f);
  }
}

// The definition: mean over tokens of log sum_i exp(z_i) - z_y, in double with the max shift.
double mean_cross_entropy(const Vec& z, const std::vector<int32_t>& y, int64_t V) {
  const int64_t T = static_cast<int64_t>(y.size());
  double total = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    double mx = -1e300, sum = 0.0;
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, z[t * V + i]);
    for (int64_t i = 0; i < V; ++i) sum += std::exp(z[t * V + i] - mx);
    total += std::log(sum) + mx - z[t * V + y[t]];
  }
  return total / T;
}

TEST(Layers, CrossEntropyBackwardMatchesFiniteDifferences) {
  const int64_t T = 4, V = 11;
  const auto z = random_vec(T * V, 10, 2.0f);
  const std::vector<int32_t> y = {3, 0, 10, 3};
  AlignedVector<float> probs(T * V), dz(T * V);
  const double L = cross_entropy_forward(probs, z, y, V);
  cross_entropy_backward(dz, probs, y, V);
  auto loss = [&](const Vec& zv) { return mean_cross_entropy(zv, y, V); };
  EXPECT_NEAR(L, loss(to_double(z)), 1e-6);
  check("cross-entropy dlogits", to_double(z), loss, dz);
  std::vector<int32_t> bad = {3, 0, 11, 3};
  EXPECT_THROW(cross_entropy_forward(probs, z, bad, V), Error);
}

// The fused loss + gradient (the model's) against the double definition and finite differences,
// with V not a multiple of any vector width and rows of very different scales. A missing 1/T, a
// one-hot on the wrong column or a softmax without its max shift fails these by far more than
// the tolerance (the polynomial exp is accurate to 2^-21; the loss is summed in double).
TEST(Layers, FusedCrossEntropyMatchesDefinitionAndFiniteDifferences) {
  for (int64_t V : {11, 16, 37, 4099}) {
    const int64_t T = 5;
    auto z = random_vec(T * V, 11 + V, 2.0f);
    for (int64_t i = 0; i < V; ++i) z[3 * V + i] *= 40.0f;  // a peaked row: exp underflows for most
    const std::vector<int32_t> y = {3, 0, static_cast<int32_t>(V - 1), 7, 3};
    auto loss = [&](const Vec& zv) { return mean_cross_entropy(zv, y, V); };
    AlignedVector<float> dz = z;
    const double L = cross_entropy_fused(dz, y, V);
    EXPECT_NEAR(L, loss(to_double(z)), 1e-6 * std::max(1.0, std::fabs(L))) << "V=" << V;
    check(("fused cross-entropy V=" + std::to_string(V)).c_str(), to_double(z), loss, dz, 40);
    // Against the double reference pair, element by element (absolute: gradients are <= 1/T).
    AlignedVector<float> probs(T * V), dref(T * V);
    EXPECT_NEAR(cross_entropy_forward(probs, z, y, V), L, 1e-6 * std::max(1.0, std::fabs(L)));
    cross_entropy_backward(dref, probs, y, V);
    for (int64_t i = 0; i < T * V; ++i) ASSERT_NEAR(dz[i], dref[i], 1e-6 / T) << "V=" << V << " i=" << i;
  }
}

TEST(Layers, FusedCrossEntropyOfANonFiniteRowIsNaN) {
  const int64_t T = 20, V = 33;
  auto z = random_vec(T * V, 5);
  z[13 * V + 4] = INFINITY;
  const std::vector<int32_t> y(T, 1);
  EXPECT_TRUE(std::isnan(cross_entropy_fused(z, y, V)));
  EXPECT_TRUE(std::isnan(z[13 * V + 0]));  // the bad row's gradient is NaN, the others finite
  EXPECT_TRUE(std::isfinite(z[0]));
  std::vector<int32_t> bad(T, 1);
  bad[19] = V;
  auto z2 = random_vec(T * V, 6);
  EXPECT_THROW(cross_entropy_fused(z2, bad, V), Error);
}

// With reduction leaves the table gradient is a tree over per-leaf scatters (layers.hpp). The
// expected value is built here the plain way: every leaf's whole (V, C) partial from +0 in token
// order, the tree ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) over whole partials, then added into
// the table. Bit for bit, with tokens repeated within and across leaves, rows no token names,
// -0 and +0 among the gradients and a table that starts non-zero (the += contract).
TEST(Layers, EmbeddingLeavesSumEachLeafsScatterInTheTree) {
  const int64_t V = 37, C = 20, leaves = 8, T = 8 * 12, per_leaf = T / leaves;
  std::mt19937 gen(3);
  std::uniform_int_distribution<int32_t> tok(0, 29);  // rows 30..36 are never named
  std::vector<int32_t> tokens(T);
  for (auto& t : tokens) t = tok(gen);
  auto dout = random_vec(T * C, 21);
  for (int64_t i = 0; i < T * C; i += 7) dout[i] = (i % 2) ? -0.0f : 0.0f;
  const auto start = random_vec(V * C, 22);

  std::vector<AlignedVector<float>> partial(leaves, AlignedVector<float>(V * C, 0.0f));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) partial[t / per_leaf][tokens[t] * C + c] += dout[t * C + c];
  }
  AlignedVector<float> tree(V * C), want = start;
  for (int64_t i = 0; i < V * C; ++i) {
    const auto& p = partial;
    const float left = (p[0][i] + p[1][i]) + (p[2][i] + p[3][i]);
    const float right = (p[4][i] + p[5][i]) + (p[6][i] + p[7][i]);
    tree[i] = left + right;
    want[i] += tree[i];
  }
  AlignedVector<float> got = start;
  LeafScratch scratch;
  embedding_backward(got, dout, tokens, C, leaves, &scratch);
  for (int64_t i = 0; i < V * C; ++i) {
    ASSERT_EQ(std::signbit(got[i]), std::signbit(want[i])) << "element " << i;
    ASSERT_EQ(got[i], want[i]) << "row " << i / C << " column " << i % C;
  }
  // The scratch is reused: a second call adds the same tree again.
  embedding_backward(got, dout, tokens, C, leaves, &scratch);
  for (int64_t i = 0; i < V * C; ++i) ASSERT_EQ(got[i], want[i] + tree[i]) << "second call, element " << i;

  std::vector<int32_t> bad = tokens;
  bad[50] = static_cast<int32_t>(V);
  try {
    embedding_backward(got, dout, bad, C, leaves, &scratch);
    FAIL() << "expected an error for a token outside the table";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 50"), std::string::npos) << e.what();
  }
}

TEST(Layers, EmbeddingGathersAndScattersGradients) {
  const int64_t V = 6, C = 3;
  const auto table = random_vec(V * C, 11);
  const std::vector<int32_t> tokens = {2, 5, 2, 0};
  AlignedVector<float> out(tokens.size() * C);
  embedding_forward(out, tokens, table, V, C);
  for (size_t t = 0; t < tokens.size(); ++t) {
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out[t * C + c], table[tokens[t] * C + c]);
  }
  const auto r = random_vec(out.size(), 12);
  AlignedVector<float> dtable(V * C, 0.0f);
  embedding_backward(dtable, r, tokens, C);
  check("embedding dtable", to_double(table),
        [&](const Vec& tv) {
          double L = 0.0;
          for (size_t t = 0; t < tokens.size(); ++t) {
            for (int64_t c = 0; c < C; ++c) L += tv[tokens[t] * C + c] * r[t * C + c];
          }
          return L;
        },
        dtable, 12);
  const std::vector<int32_t> bad = {6};
  AlignedVector<float> one(C);
  EXPECT_THROW(embedding_forward(one, bad, table, V, C), Error);
}

}  // namespace
}  // namespace s3r::model
