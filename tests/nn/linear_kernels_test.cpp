// The linear layer's correction kernels: reference vs every vectorized tier over a sweep of shapes,
// and on blocks of rows that start mid-range.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dispatch.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/isa.hpp"
#include "test_util.hpp"

namespace s3r::kernels {
namespace {

const int64_t kSizes[] = {1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 1000};

// dx_epilogue's operands for T rows, K features and B examples: int32 sums, row scales sx, the
// S3R-EC terms (wa, delta, rowsum) and the output's initial values, drawn in that order.
struct DxEpilogueOperands {
  std::vector<int32_t> acc;
  AlignedVector<float> sx, wa, delta, rowsum, init;
  static DxEpilogueOperands random(int64_t T, int64_t K, int64_t B, std::mt19937& gen,
                                   std::normal_distribution<float>& normal,
                                   std::uniform_int_distribution<int32_t>& acc_dist) {
    DxEpilogueOperands o{std::vector<int32_t>(T * K), AlignedVector<float>(T), AlignedVector<float>(B * K),
                         AlignedVector<float>(T), AlignedVector<float>(K), AlignedVector<float>(T * K)};
    for (auto& v : o.acc) v = acc_dist(gen);
    for (auto& v : o.sx) v = 0.01f * std::exp(normal(gen));
    for (auto& v : o.wa) v = 1e-3f * normal(gen);
    for (auto& v : o.delta) v = 1e-4f * normal(gen);
    for (auto& v : o.rowsum) v = std::round(300.0f * normal(gen));
    for (auto& v : o.init) v = normal(gen);
    return o;
  }
  DxTerms terms(int64_t S, int64_t K, bool correct, bool accumulate) const {
    return {3e-5f, sx.data(), correct ? wa.data() : nullptr, delta.data(), rowsum.data(), S, K, accumulate};
  }
};

TEST(LinearKernels, DxEpilogueIsBitExact) {
  const auto tiers = testing::vector_isas();
  S3R_SKIP_WITHOUT_VECTOR_TIERS(tiers);
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> acc_dist(-2000000, 2000000);
  for (int64_t T : {1, 3, 16, 17, 64}) {
    for (int64_t K : kSizes) {
      const int64_t S = T % 3 == 0 && T > 1 ? T / 3 : T;
      const int64_t B = T / S;
      const DxEpilogueOperands o = DxEpilogueOperands::random(T, K, B, gen, normal, acc_dist);
      for (bool correct : {false, true}) {
        for (bool accumulate : {false, true}) {
          AlignedVector<float> a = o.init;
          const DxTerms d = o.terms(S, K, correct, accumulate);
          ref::dx_epilogue(a.data(), K, o.acc.data(), K, 0, T, 0, K, d);
          for (Isa isa : tiers) {
            AlignedVector<float> b = o.init;
            b.push_back(-7.0f);  // a guard element past the end, which must stay untouched
            kernels_for(isa).dx_epilogue(b.data(), K, o.acc.data(), K, 0, T, 0, K, d);
            for (int64_t i = 0; i < T * K; ++i) {
              ASSERT_EQ(a[i], b[i]) << isa_name(isa) << " T=" << T << " K=" << K
                                    << " correct=" << correct << " accumulate=" << accumulate
                                    << " at [" << i / K << ", " << i % K << "]";
            }
            ASSERT_EQ(b[T * K], -7.0f) << isa_name(isa) << ": wrote past the end, T=" << T
                                       << " K=" << K;
          }
        }
      }
    }
  }
}

// gemv sums N products in f32 lanes with FMA (vector tiers, L = 8 or 16 lanes) or in double
// (reference): they differ by at most (N/L + 4) * 2^-24 * sum_n |w a| (L-lane f32 summation
// bound); we allow twice the bound of the narrowest tier, L = 8.
TEST(LinearKernels, GemvMatchesReference) {
  const auto tiers = testing::vector_isas();
  S3R_SKIP_WITHOUT_VECTOR_TIERS(tiers);
  std::mt19937 gen(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> code(-127, 127);
  for (int64_t K : {1, 17, 64}) {
    for (int64_t N : kSizes) {
      for (int64_t B : {1, 3, 8, 9, 17}) {
        std::vector<int8_t> w(K * N);
        for (auto& v : w) v = static_cast<int8_t>(code(gen));
        AlignedVector<float> a(B * N);
        for (auto& v : a) v = normal(gen);
        AlignedVector<float> r(B * K);
        ref::gemv_s8_f32(r.data(), w.data(), a.data(), B, K, N, 0, K);
        for (Isa isa : tiers) {
          AlignedVector<float> v(B * K);
          kernels_for(isa).gemv_s8_f32(v.data(), w.data(), a.data(), B, K, N, 0, K);
          for (int64_t b = 0; b < B; ++b) {
            for (int64_t k = 0; k < K; ++k) {
              double mag = 0.0;
              for (int64_t n = 0; n < N; ++n) mag += std::fabs(w[k * N + n] * a[b * N + n]);
              const double tol = 2.0 * (static_cast<double>(N) / 8.0 + 4.0) * 0x1p-24 * mag;
              ASSERT_NEAR(v[b * K + k], r[b * K + k], tol) << isa_name(isa) << " K=" << K
                  << " N=" << N << " B=" << B << " at [" << b << ", " << k << "]";
            }
          }
        }
      }
    }
  }
}

// The layer calls both kernels on blocks: dx_epilogue on rows [t0, t1) and columns [k0, k1) (the
// fused dX product's output blocks), gemv_s8_f32 on [k0, k1) of the features. A block that starts
// mid-range (rows and columns off any vector or example boundary, so the elements start off the
// lane grid) gives the whole-range call's values in it (the example of row t is t / S, whatever the
// block) and leaves every other element as it was. Every tier, the reference included.
TEST(LinearKernels, BlocksStartingMidRangeGiveTheWholeRangesRows) {
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> acc_dist(-2000000, 2000000);
  std::uniform_int_distribution<int> code(-127, 127);
  constexpr float kGuard = -7.0f;
  const int64_t T = 21, S = 7, B = T / S;
  using Range = std::pair<int64_t, int64_t>;
  for (int64_t K : {1, 9, 17, 33}) {
    const DxEpilogueOperands o = DxEpilogueOperands::random(T, K, B, gen, normal, acc_dist);
    for (bool accumulate : {false, true}) {
      const DxTerms d = o.terms(S, K, true, accumulate);
      AlignedVector<float> whole = o.init;
      ref::dx_epilogue(whole.data(), K, o.acc.data(), K, 0, T, 0, K, d);
      for (Isa isa : testing::runnable_isas()) {
        for (auto [t0, t1] : {Range{1, T}, {3, 4}, {5, 16}, {8, 13}}) {
          for (auto [k0, k1] : {Range{0, K}, {K / 3, K}, {K / 2, K / 2 + 1}}) {
            AlignedVector<float> got = o.init;
            got.push_back(kGuard);
            kernels_for(isa).dx_epilogue(got.data(), K, o.acc.data() + t0 * K + k0, K, t0, t1, k0, k1, d);
            for (int64_t i = 0; i <= T * K; ++i) {
              const bool inside = i >= t0 * K && i < t1 * K && i % K >= k0 && i % K < k1;
              const float want = inside ? whole[i] : (i < T * K ? o.init[i] : kGuard);
              ASSERT_EQ(got[i], want) << isa_name(isa) << " dx_epilogue K=" << K << " accumulate="
                                      << accumulate << " rows [" << t0 << ", " << t1 << ") columns [" << k0
                                      << ", " << k1 << ") at [" << i / K << ", " << i % K << "]"
                                      << (inside ? "" : " (outside the block)");
            }
          }
        }
      }
    }
  }
  for (int64_t N : {9, 40}) {
    const int64_t K = 29, Bv = 3;
    std::vector<int8_t> w(K * N);
    for (auto& v : w) v = static_cast<int8_t>(code(gen));
    AlignedVector<float> a(Bv * N);
    for (auto& v : a) v = normal(gen);
    for (Isa isa : testing::runnable_isas()) {
      // Against the same tier's whole-range call: bit for bit (each output is one row's sum).
      AlignedVector<float> whole(Bv * K);
      kernels_for(isa).gemv_s8_f32(whole.data(), w.data(), a.data(), Bv, K, N, 0, K);
      for (auto [k0, k1] : {std::pair<int64_t, int64_t>{1, K}, {3, 4}, {5, 22}, {17, 28}}) {
        AlignedVector<float> got(Bv * K + 1, kGuard);
        kernels_for(isa).gemv_s8_f32(got.data(), w.data(), a.data(), Bv, K, N, k0, k1);
        for (int64_t i = 0; i <= Bv * K; ++i) {
          const bool inside = i < Bv * K && i % K >= k0 && i % K < k1;
          ASSERT_EQ(got[i], inside ? whole[i] : kGuard)
              << isa_name(isa) << " gemv N=" << N << " rows [" << k0 << ", " << k1 << ") at ["
              << i / K << ", " << i % K << "]" << (inside ? "" : " (outside the rows)");
        }
      }
    }
  }
}

}  // namespace
}  // namespace s3r::kernels
