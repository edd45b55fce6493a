// Elementwise and row kernels (SwiGLU, softmax cross-entropy, RMSNorm): the polynomial exp
// against std::exp, and reference vs every vectorized tier bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/ref/numerics.hpp"
#include "s3r/core/isa.hpp"
#include "test_util.hpp"

namespace s3r::kernels {
namespace {

// Cephes' expf is accurate to about 1 ulp; we hold it to 2^-21 (8 ulps) relative, over the whole
// clamped range, on a fine grid.
TEST(Elementwise, PolynomialExpIsAccurate) {
  double worst = 0.0;
  for (double x = -87.0; x <= 88.0; x += 1.0 / 1024.0) {
    const double got = ref::exp_poly(static_cast<float>(x));
    const double want = std::exp(static_cast<double>(static_cast<float>(x)));
    worst = std::max(worst, std::fabs(got - want) / want);
  }
  EXPECT_LE(worst, 0x1p-21) << "worst relative error of exp_poly";
  EXPECT_EQ(ref::exp_poly(1000.0f), ref::exp_poly(88.0f));  // clamped, finite
  EXPECT_TRUE(std::isfinite(ref::exp_poly(1000.0f)));
  EXPECT_GT(ref::exp_poly(-1000.0f), 0.0f);
  EXPECT_EQ(ref::sigmoid_poly(0.0f), 0.5f);
}

std::vector<float> test_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(gen);
  // Extremes and special points, including both ends of the clamp and a subnormal.
  const float special[] = {0.0f, -0.0f, 1e-40f, 87.5f, -87.5f, 100.0f, -100.0f, 88.0f, -87.0f};
  for (size_t i = 0; i < sizeof(special) / sizeof(special[0]) && i < n; ++i) v[i * 7 % n] = special[i];
  return v;
}

TEST(Elementwise, SwigluKernelsAreBitExact) {
  const auto tiers = testing::vector_isas();
  S3R_SKIP_WITHOUT_VECTOR_TIERS(tiers);
  for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 1000}) {
    const auto h1 = test_values(n, 1), h3 = test_values(n, 2), dh = test_values(n, 3);
    std::vector<float> a(n), a1(n), a3(n);
    ref::swiglu_forward_ew(a.data(), h1.data(), h3.data(), 0, n);
    ref::swiglu_backward_ew(a1.data(), a3.data(), dh.data(), h1.data(), h3.data(), 0, n);
    for (Isa isa : tiers) {
      // One guard element past the end catches a kernel that writes beyond its range.
      std::vector<float> b(n + 1, -7.0f), b1(n + 1, -7.0f), b3(n + 1, -7.0f);
      const KernelTable& k = kernels_for(isa);
      k.swiglu_forward_ew(b.data(), h1.data(), h3.data(), 0, n);
      k.swiglu_backward_ew(b1.data(), b3.data(), dh.data(), h1.data(), h3.data(), 0, n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(a[i], b[i]) << isa_name(isa) << " forward n=" << n << " i=" << i << " h1=" << h1[i];
        ASSERT_EQ(a1[i], b1[i]) << isa_name(isa) << " dh1 n=" << n << " i=" << i << " h1=" << h1[i];
        ASSERT_EQ(a3[i], b3[i]) << isa_name(isa) << " dh3 n=" << n << " i=" << i << " h1=" << h1[i];
      }
      ASSERT_EQ(b[n], -7.0f) << isa_name(isa) << ": forward wrote past the end, n=" << n;
      ASSERT_EQ(b1[n], -7.0f) << isa_name(isa) << ": dh1 written past the end, n=" << n;
      ASSERT_EQ(b3[n], -7.0f) << isa_name(isa) << ": dh3 written past the end, n=" << n;
    }
  }
}

// The fused softmax cross-entropy: losses and gradients bit for bit between the reference and
// every vector tier, at vocabulary sizes around the vector widths, with peaked rows and the
// non-finite check.
TEST(Elementwise, SoftmaxCrossEntropyKernelIsBitExact) {
  const auto tiers = testing::vector_isas();
  S3R_SKIP_WITHOUT_VECTOR_TIERS(tiers);
  for (int64_t V : {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 4096}) {
    const int64_t rows = 3;
    auto z = test_values(rows * V, 4);
    for (int64_t i = 0; i < V; ++i) z[V + i] *= 10.0f;  // row 1 peaked
    const std::vector<int32_t> y = {0, static_cast<int32_t>(V / 2), static_cast<int32_t>(V - 1)};
    std::vector<float> a = z;
    std::vector<double> la(rows);
    ASSERT_TRUE(ref::softmax_xent_rows(a.data(), la.data(), y.data(), 0, rows, V, 0.25f));
    for (Isa isa : tiers) {
      std::vector<float> b = z;
      b.push_back(-7.0f);  // guard
      std::vector<double> lb(rows);
      ASSERT_TRUE(kernels_for(isa).softmax_xent_rows(b.data(), lb.data(), y.data(), 0, rows, V, 0.25f));
      for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(la[r], lb[r]) << isa_name(isa) << " loss V=" << V << " r=" << r;
      for (int64_t i = 0; i < rows * V; ++i) ASSERT_EQ(a[i], b[i]) << isa_name(isa) << " V=" << V << " i=" << i;
      ASSERT_EQ(b[rows * V], -7.0f) << isa_name(isa) << ": wrote past the end, V=" << V;
      for (float bad : {NAN, INFINITY, -INFINITY}) {
        std::vector<float> c = z;
        c[2 * V + V / 3] = bad;
        EXPECT_FALSE(kernels_for(isa).softmax_xent_rows(c.data(), lb.data(), y.data(), 0, rows, V, 0.25f))
            << isa_name(isa) << " V=" << V << " missed " << bad;
      }
    }
    for (float bad : {NAN, INFINITY}) {
      std::vector<float> c = z;
      c[2 * V + V / 3] = bad;
      EXPECT_FALSE(ref::softmax_xent_rows(c.data(), la.data(), y.data(), 0, rows, V, 0.25f)) << "reference V=" << V;
    }
  }
}

// RMSNorm's row kernels: rstd, outputs and input gradients bit for bit between the reference and
// every vector tier, at widths around the vector sizes (dx accumulates: it starts non-zero).
TEST(Elementwise, RmsnormKernelsAreBitExact) {
  const auto tiers = testing::vector_isas();
  S3R_SKIP_WITHOUT_VECTOR_TIERS(tiers);
  for (int64_t C : {1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 256}) {
    const int64_t rows = 5;
    const auto x = test_values(rows * C, 7), w = test_values(C, 8), dy = test_values(rows * C, 9);
    const auto dx0 = test_values(rows * C, 10);
    std::vector<float> out(rows * C), rstd(rows), dx = dx0;
    ref::rmsnorm_rows(out.data(), rstd.data(), x.data(), w.data(), 1, rows, C, 1e-5f);
    ref::rmsnorm_backward_rows(dx.data(), dy.data(), x.data(), w.data(), rstd.data(), 1, rows, C);
    for (Isa isa : tiers) {
      std::vector<float> out2(rows * C + 1, 0.0f), rstd2(rows + 1, 0.0f), dx2 = dx0;
      out2[rows * C] = rstd2[rows] = -7.0f;
      dx2.push_back(-7.0f);
      const KernelTable& k = kernels_for(isa);
      k.rmsnorm_rows(out2.data(), rstd2.data(), x.data(), w.data(), 1, rows, C, 1e-5f);
      k.rmsnorm_backward_rows(dx2.data(), dy.data(), x.data(), w.data(), rstd.data(), 1, rows, C);
      for (int64_t r = 1; r < rows; ++r) ASSERT_EQ(rstd[r], rstd2[r]) << isa_name(isa) << " C=" << C << " r=" << r;
      for (int64_t i = 0; i < rows * C; ++i) {
        ASSERT_EQ(out[i], out2[i]) << isa_name(isa) << " out C=" << C << " i=" << i;
        ASSERT_EQ(dx[i], dx2[i]) << isa_name(isa) << " dx C=" << C << " i=" << i;
      }
      ASSERT_EQ(out2[rows * C], -7.0f) << isa_name(isa) << ": wrote past the end, C=" << C;
      ASSERT_EQ(dx2[rows * C], -7.0f) << isa_name(isa) << ": dx written past the end, C=" << C;
      ASSERT_EQ(rstd2[0], 0.0f) << isa_name(isa) << ": row 0 is outside [r0, r1)";
    }
  }
}

}  // namespace
}  // namespace s3r::kernels
