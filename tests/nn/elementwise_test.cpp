// Elementwise and row kernels (SwiGLU, GeGLU, softmax cross-entropy, RMSNorm, bf16 rounding): the
// polynomial exp against std::exp, and reference vs every vectorized tier bit for bit, over whole
// ranges and over pieces of them that start mid-range.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "check_util.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/ref/numerics.hpp"
#include "s3r/core/aligned_vector.hpp"
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
    const double r = std::fabs(got - want) / want;
    if (testing::worse_than(r, worst)) worst = r;  // a NaN is the worst, and stays
  }
  EXPECT_LE(worst, 0x1p-21) << "worst relative error of exp_poly";
  EXPECT_EQ(ref::exp_poly(1000.0f), ref::exp_poly(88.0f));  // clamped, finite
  EXPECT_TRUE(std::isfinite(ref::exp_poly(1000.0f)));
  EXPECT_GT(ref::exp_poly(-1000.0f), 0.0f);
  EXPECT_EQ(ref::sigmoid_poly(0.0f), 0.5f);
}

AlignedVector<float> test_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  AlignedVector<float> v(n);
  for (auto& x : v) x = normal(gen);
  // Extremes and special points, including both ends of the clamp and a subnormal.
  const float special[] = {0.0f, -0.0f, 1e-40f, 87.5f, -87.5f, 100.0f, -100.0f, 88.0f, -87.0f};
  for (size_t i = 0; i < sizeof(special) / sizeof(special[0]) && i < n; ++i) v[i * 7 % n] = special[i];
  return v;
}

constexpr float kGuard = -7.0f;

// got[i] for i < want.size(): the bits of want[i] inside the piece [i0, i1), kGuard outside it
// (and past the end); "" when so, else the first index that is not and both values.
std::string piece_mismatch(const AlignedVector<float>& got, const AlignedVector<float>& want,
                           int64_t i0, int64_t i1) {
  for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {
    const bool inside = i >= i0 && i < i1;
    const float expected = inside ? want[i] : kGuard;
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(expected)) {
      return "at " + std::to_string(i) + (inside ? "" : " (outside the piece)") + ": " +
             std::to_string(got[i]) + " instead of " + std::to_string(expected);
    }
  }
  return "";
}

// The gated activations' kernel pairs (forward, backward), SwiGLU's and GeGLU's.
struct GatedKernels {
  const char* name;
  decltype(&ref::swiglu_forward_ew) KernelTable::*forward;
  decltype(&ref::swiglu_backward_ew) KernelTable::*backward;
};
constexpr GatedKernels kGated[] = {
    {"swiglu", &KernelTable::swiglu_forward_ew, &KernelTable::swiglu_backward_ew},
    {"geglu", &KernelTable::geglu_forward_ew, &KernelTable::geglu_backward_ew},
};

TEST(Elementwise, GatedKernelsAreBitExact) {
  const auto tiers = testing::vector_isas();
  S3R_SKIP_WITHOUT_VECTOR_TIERS(tiers);
  const KernelTable& r = kernels_for(Isa::kReference);
  for (const GatedKernels& g : kGated) {
    for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 1000}) {
      const auto h1 = test_values(n, 1), h3 = test_values(n, 2), dh = test_values(n, 3);
      AlignedVector<float> a(n), a1(n), a3(n);
      (r.*g.forward)(a.data(), h1.data(), h3.data(), 0, n);
      (r.*g.backward)(a1.data(), a3.data(), dh.data(), h1.data(), h3.data(), 0, n);
      for (Isa isa : tiers) {
        // One guard element past the end catches a kernel that writes beyond its range.
        AlignedVector<float> b(n + 1, -7.0f), b1(n + 1, -7.0f), b3(n + 1, -7.0f);
        const KernelTable& k = kernels_for(isa);
        (k.*g.forward)(b.data(), h1.data(), h3.data(), 0, n);
        (k.*g.backward)(b1.data(), b3.data(), dh.data(), h1.data(), h3.data(), 0, n);
        const std::string ctx = std::string(g.name) + " " + std::string(isa_name(isa)) + " n=" + std::to_string(n);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(a[i], b[i]) << ctx << " forward i=" << i << " h1=" << h1[i];
          ASSERT_EQ(a1[i], b1[i]) << ctx << " dh1 i=" << i << " h1=" << h1[i];
          ASSERT_EQ(a3[i], b3[i]) << ctx << " dh3 i=" << i << " h1=" << h1[i];
        }
        ASSERT_EQ(b[n], -7.0f) << ctx << ": forward wrote past the end";
        ASSERT_EQ(b1[n], -7.0f) << ctx << ": dh1 written past the end";
        ASSERT_EQ(b3[n], -7.0f) << ctx << ": dh3 written past the end";
      }
    }
  }
}

// Production runs these kernels on blocks [i0, i1) of a buffer (parallel_blocks): a piece that
// starts mid-range, off the 8- and 16-lane grid, and ends before the buffer does gives the
// reference's whole-range values at its positions and writes nothing outside it (every tier,
// the reference included).
TEST(Elementwise, GatedKernelsOnPiecesStartingMidRange) {
  const int64_t n = 100;
  const auto h1 = test_values(n, 1), h3 = test_values(n, 2), dh = test_values(n, 3);
  const KernelTable& r = kernels_for(Isa::kReference);
  for (const GatedKernels& g : kGated) {
    AlignedVector<float> a(n), a1(n), a3(n);
    (r.*g.forward)(a.data(), h1.data(), h3.data(), 0, n);
    (r.*g.backward)(a1.data(), a3.data(), dh.data(), h1.data(), h3.data(), 0, n);
    for (Isa isa : testing::runnable_isas()) {
      const KernelTable& k = kernels_for(isa);
      for (int64_t i0 : {1, 3, 5, 9, 13, 17, 33}) {
        for (int64_t i1 : {i0 + 1, i0 + 7, i0 + 8, i0 + 9, i0 + 23, n - 1, n}) {
          AlignedVector<float> b(n + 1, kGuard), b1(n + 1, kGuard), b3(n + 1, kGuard);
          (k.*g.forward)(b.data(), h1.data(), h3.data(), i0, i1);
          (k.*g.backward)(b1.data(), b3.data(), dh.data(), h1.data(), h3.data(), i0, i1);
          const std::string ctx = std::string(g.name) + " " + std::string(isa_name(isa)) + " piece [" + std::to_string(i0) +
                                  ", " + std::to_string(i1) + ")";
          ASSERT_EQ(piece_mismatch(b, a, i0, i1), "") << ctx << " forward";
          ASSERT_EQ(piece_mismatch(b1, a1, i0, i1), "") << ctx << " dh1";
          ASSERT_EQ(piece_mismatch(b3, a3, i0, i1), "") << ctx << " dh3";
        }
      }
    }
  }
}

// GeGLU's reference against the tanh form in double, 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715
// z^3))), and its derivative against that form's analytic derivative: the sigmoid rewriting,
// the clamp and the polynomial exp cost at most a few f32 ulps of the larger of |z| and 1e-3
// (the tails' absolute values are below f32's resolution of z there). A derivative with a wrong
// constant (3a) or a missing term is off by far more.
TEST(Elementwise, GeluTanhMatchesItsDefinition) {
  const double k = std::sqrt(2.0 / std::acos(-1.0)), a = 0.044715;
  double worst_value = 0.0, worst_slope = 0.0;
  for (double z = -30.0; z <= 30.0; z += 1.0 / 512.0) {
    const float zf = static_cast<float>(z);
    const double zd = zf, u = k * (zd + a * zd * zd * zd), t = std::tanh(u);
    const double want = 0.5 * zd * (1.0 + t);
    const double want_slope = 0.5 * (1.0 + t) + 0.5 * zd * (1.0 - t * t) * k * (1.0 + 3.0 * a * zd * zd);
    float hidden = 0.0f, dh1 = 0.0f, dh3 = 0.0f;
    const float one = 1.0f;
    ref::geglu_forward_ew(&hidden, &zf, &one, 0, 1);
    ref::geglu_backward_ew(&dh1, &dh3, &one, &zf, &one, 0, 1);
    const double err = std::fabs(hidden - want) / std::max(std::fabs(zd), 1e-3);
    if (testing::worse_than(err, worst_value)) worst_value = err;
    ASSERT_EQ(dh3, hidden) << "dh3 = dh gelu(h1) at z=" << z;
    const double serr = std::fabs(dh1 - want_slope);
    if (testing::worse_than(serr, worst_slope)) worst_slope = serr;
  }
  EXPECT_LE(worst_value, 4e-7) << "worst error of gelu(z), relative to max(|z|, 1e-3)";
  EXPECT_LE(worst_slope, 2e-6) << "worst absolute error of gelu'(z)";
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
    AlignedVector<float> a = z;
    std::vector<double> la(rows);
    ASSERT_TRUE(ref::softmax_xent_rows(a.data(), la.data(), y.data(), 0, rows, V, 0.25f));
    for (Isa isa : tiers) {
      AlignedVector<float> b = z;
      b.push_back(-7.0f);  // guard
      std::vector<double> lb(rows);
      ASSERT_TRUE(kernels_for(isa).softmax_xent_rows(b.data(), lb.data(), y.data(), 0, rows, V, 0.25f));
      for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(la[r], lb[r]) << isa_name(isa) << " loss V=" << V << " r=" << r;
      for (int64_t i = 0; i < rows * V; ++i) ASSERT_EQ(a[i], b[i]) << isa_name(isa) << " V=" << V << " i=" << i;
      ASSERT_EQ(b[rows * V], -7.0f) << isa_name(isa) << ": wrote past the end, V=" << V;
      for (float bad : {NAN, INFINITY, -INFINITY}) {
        AlignedVector<float> c = z;
        c[2 * V + V / 3] = bad;
        EXPECT_FALSE(kernels_for(isa).softmax_xent_rows(c.data(), lb.data(), y.data(), 0, rows, V, 0.25f))
            << isa_name(isa) << " V=" << V << " missed " << bad;
      }
    }
    for (float bad : {NAN, INFINITY}) {
      AlignedVector<float> c = z;
      c[2 * V + V / 3] = bad;
      EXPECT_FALSE(ref::softmax_xent_rows(c.data(), la.data(), y.data(), 0, rows, V, 0.25f)) << "reference V=" << V;
    }
  }
}

// Rows [r0, r1) of a larger batch, as the blocks of the model's loss: the rows of the piece get
// the whole-batch call's logits gradient and loss, every other row (and loss) stays as it was.
// V odd: the rows start off the vector grid.
TEST(Elementwise, SoftmaxCrossEntropyOnRowsStartingMidBatch) {
  const int64_t rows = 6;
  for (int64_t V : {7, 17, 33}) {
    const auto z = test_values(rows * V, 5);
    std::vector<int32_t> y(rows);
    for (int64_t r = 0; r < rows; ++r) y[r] = static_cast<int32_t>((r * 5) % V);
    AlignedVector<float> a = z;
    std::vector<double> la(rows);
    ASSERT_TRUE(ref::softmax_xent_rows(a.data(), la.data(), y.data(), 0, rows, V, 0.25f));
    for (Isa isa : testing::runnable_isas()) {
      for (auto [r0, r1] : {std::pair<int64_t, int64_t>{1, rows}, {1, 2}, {2, 5}, {3, 4}}) {
        AlignedVector<float> b = z;
        b.push_back(kGuard);
        std::vector<double> lb(rows + 1, -7.0);
        ASSERT_TRUE(kernels_for(isa).softmax_xent_rows(b.data(), lb.data(), y.data(), r0, r1, V, 0.25f));
        const std::string ctx = std::string(isa_name(isa)) + " V=" + std::to_string(V) + " rows [" +
                                std::to_string(r0) + ", " + std::to_string(r1) + ")";
        for (int64_t r = 0; r <= rows; ++r) {
          const bool inside = r >= r0 && r < r1;
          ASSERT_EQ(lb[r], inside ? la[r] : -7.0) << ctx << " loss of row " << r;
        }
        for (int64_t i = 0; i < rows * V; ++i) {
          const bool inside = i >= r0 * V && i < r1 * V;
          ASSERT_EQ(std::bit_cast<uint32_t>(b[i]), std::bit_cast<uint32_t>(inside ? a[i] : z[i]))
              << ctx << " at [" << i / V << ", " << i % V << "]" << (inside ? "" : " (outside the rows)");
        }
        ASSERT_EQ(b[rows * V], kGuard) << ctx << ": wrote past the end";
      }
    }
  }
}

// RMSNorm's row kernels: rstd, outputs and input gradients bit for bit between the reference and
// every vector tier, at widths around the vector sizes (dx accumulates: it starts non-zero). The
// whole batch, and rows [1, rows - 1) of it as a block of the production loop: rows outside the
// block (first and last) and a guard past each buffer's end keep their values.
TEST(Elementwise, RmsnormKernelsAreBitExact) {
  const auto tiers = testing::vector_isas();
  S3R_SKIP_WITHOUT_VECTOR_TIERS(tiers);
  for (int64_t C : {1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 256}) {
    const int64_t rows = 5;
    const auto x = test_values(rows * C, 7), w = test_values(C, 8), dy = test_values(rows * C, 9);
    const auto dx0 = test_values(rows * C, 10);
    AlignedVector<float> out(rows * C), rstd(rows), dx = dx0;
    ref::rmsnorm_rows(out.data(), rstd.data(), x.data(), w.data(), 0, rows, C, 1e-5f);
    ref::rmsnorm_backward_rows(dx.data(), dy.data(), x.data(), w.data(), rstd.data(), 0, rows, C);
    for (Isa isa : tiers) {
      for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, rows}, {1, rows - 1}}) {
        AlignedVector<float> out2(rows * C + 1, kGuard), rstd2(rows + 1, kGuard), dx2 = dx0;
        dx2.push_back(kGuard);
        const KernelTable& k = kernels_for(isa);
        k.rmsnorm_rows(out2.data(), rstd2.data(), x.data(), w.data(), r0, r1, C, 1e-5f);
        k.rmsnorm_backward_rows(dx2.data(), dy.data(), x.data(), w.data(), rstd.data(), r0, r1, C);
        const std::string ctx = std::string(isa_name(isa)) + " C=" + std::to_string(C) + " rows [" +
                                std::to_string(r0) + ", " + std::to_string(r1) + ")";
        for (int64_t r = 0; r <= rows; ++r) {
          const bool inside = r >= r0 && r < r1;
          ASSERT_EQ(rstd2[r], inside ? rstd[r] : kGuard) << ctx << " rstd of row " << r
                                                         << (inside ? "" : " (outside the rows)");
        }
        for (int64_t i = 0; i <= rows * C; ++i) {
          const bool inside = i >= r0 * C && i < r1 * C;
          const std::string at = " at [" + std::to_string(i / C) + ", " + std::to_string(i % C) + "]" +
                                 (inside ? "" : " (outside the rows)");
          ASSERT_EQ(out2[i], inside ? out[i] : kGuard) << ctx << " out" << at;
          const float dx_outside = i < rows * C ? dx0[i] : kGuard;
          ASSERT_EQ(dx2[i], inside ? dx[i] : dx_outside) << ctx << " dx" << at;
        }
      }
    }
  }
}

// bf16 rounding: known answers (ties to even, the carry into the exponent and into Inf,
// subnormals, NaNs made quiet with their sign), then every tier against the reference on random
// bit patterns (NaNs, infinities and subnormals among them), whole and in pieces starting
// mid-range, to bf16 and to the widened f32, with the guards outside the piece untouched.
TEST(Elementwise, Bf16RoundingOfEveryTierMatchesTheReference) {
  const std::pair<uint32_t, uint16_t> known[] = {
      {0x3F800000u, 0x3F80u},  // 1
      {0x3F808000u, 0x3F80u},  // a tie, even below: down
      {0x3F818000u, 0x3F82u},  // a tie, odd below: up
      {0x3F80FFFFu, 0x3F81u},  // above the tie: up
      {0x7F7FFFFFu, 0x7F80u},  // the largest float rounds to Inf
      {0x80000000u, 0x8000u},  // -0
      {0x00008000u, 0x0000u},  // a subnormal tie, even below
      {0x00018000u, 0x0002u},  // a subnormal tie, odd below
      {0x7F800000u, 0x7F80u},  // Inf
      {0x7F800001u, 0x7FC0u},  // a signaling NaN becomes quiet
      {0xFF800001u, 0xFFC0u},  // with its sign
      {0x7FFFFFFFu, 0x7FFFu},  // a quiet NaN keeps its top bits
  };
  std::mt19937 gen(11);
  AlignedVector<float> x(1000);
  for (auto& v : x) v = std::bit_cast<float>(static_cast<uint32_t>(gen()));
  for (size_t i = 0; i < std::size(known); ++i) x[3 + 17 * i] = std::bit_cast<float>(known[i].first);
  std::vector<bf16> want(x.size());
  AlignedVector<float> want_wide(x.size());
  ref::round_bf16(want.data(), want_wide.data(), x.data(), 0, static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < std::size(known); ++i) {
    ASSERT_EQ(want[3 + 17 * i].bits, known[i].second) << std::hex << known[i].first;
    ASSERT_EQ(std::bit_cast<uint32_t>(want_wide[3 + 17 * i]), uint32_t{known[i].second} << 16);
  }
  const int64_t n = static_cast<int64_t>(x.size());
  for (Isa isa : testing::runnable_isas()) {
    for (auto [i0, i1] : {std::pair<int64_t, int64_t>{0, n}, {5, 6}, {7, 40}, {33, n - 9}}) {
      std::vector<bf16> got(x.size(), bf16{0x1234});
      AlignedVector<float> got_wide(x.size(), kGuard);
      kernels_for(isa).round_bf16(got.data(), got_wide.data(), x.data(), i0, i1);
      AlignedVector<float> only_wide(x.size(), kGuard);
      kernels_for(isa).round_bf16(nullptr, only_wide.data(), x.data(), i0, i1);
      for (int64_t i = 0; i < n; ++i) {
        const bool inside = i >= i0 && i < i1;
        ASSERT_EQ(got[i].bits, inside ? want[i].bits : 0x1234) << isa_name(isa) << " at " << i;
      }
      const std::string wide = piece_mismatch(got_wide, want_wide, i0, i1);
      EXPECT_EQ(wide, "") << isa_name(isa) << ", widened, piece [" << i0 << ", " << i1 << ")";
      EXPECT_EQ(piece_mismatch(only_wide, want_wide, i0, i1), "") << isa_name(isa) << ", widened only";
    }
  }
}

}  // namespace
}  // namespace s3r::kernels
