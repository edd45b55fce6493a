// Elementwise activation kernels: the polynomial exp against std::exp, and reference vs AVX-512
// bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/kernels.hpp"
#include "kernels/ref/numerics.hpp"
#include "s3r/core/isa.hpp"

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
  if (!cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU: nothing to compare";
  for (int64_t n : {1, 3, 15, 16, 17, 63, 64, 65, 127, 1000}) {
    const auto h1 = test_values(n, 1), h3 = test_values(n, 2), dh = test_values(n, 3);
    std::vector<float> a(n), b(n), a1(n), a3(n), b1(n), b3(n);
    ref::swiglu_forward_ew(a.data(), h1.data(), h3.data(), 0, n);
    avx512::swiglu_forward_ew(b.data(), h1.data(), h3.data(), 0, n);
    ref::swiglu_backward_ew(a1.data(), a3.data(), dh.data(), h1.data(), h3.data(), 0, n);
    avx512::swiglu_backward_ew(b1.data(), b3.data(), dh.data(), h1.data(), h3.data(), 0, n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(a[i], b[i]) << "forward n=" << n << " i=" << i << " h1=" << h1[i];
      ASSERT_EQ(a1[i], b1[i]) << "dh1 n=" << n << " i=" << i << " h1=" << h1[i];
      ASSERT_EQ(a3[i], b3[i]) << "dh3 n=" << n << " i=" << i << " h1=" << h1[i];
    }
  }
}

}  // namespace
}  // namespace s3r::kernels
