// The linear layer's correction kernels: reference vs every vectorized tier over a sweep of shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/dispatch.hpp"
#include "s3r/core/isa.hpp"
#include "test_util.hpp"

namespace s3r::kernels {
namespace {

const int64_t kSizes[] = {1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 1000};

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
      std::vector<int32_t> acc(T * K);
      for (auto& v : acc) v = acc_dist(gen);
      std::vector<float> sx(T), wa(B * K), delta(T), rowsum(K), init(T * K);
      for (auto& v : sx) v = 0.01f * std::exp(normal(gen));
      for (auto& v : wa) v = 1e-3f * normal(gen);
      for (auto& v : delta) v = 1e-4f * normal(gen);
      for (auto& v : rowsum) v = std::round(300.0f * normal(gen));
      for (auto& v : init) v = normal(gen);
      for (bool correct : {false, true}) {
        for (bool accumulate : {false, true}) {
          std::vector<float> a = init;
          const float* w = correct ? wa.data() : nullptr;
          ref::dx_epilogue(a.data(), acc.data(), 0, T, K, 3e-5f, sx.data(), w, delta.data(),
                           rowsum.data(), S, accumulate);
          for (Isa isa : tiers) {
            std::vector<float> b = init;
            b.push_back(-7.0f);  // a guard element past the end, which must stay untouched
            kernels_for(isa).dx_epilogue(b.data(), acc.data(), 0, T, K, 3e-5f, sx.data(), w,
                                         delta.data(), rowsum.data(), S, accumulate);
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
        std::vector<float> a(B * N);
        for (auto& v : a) v = normal(gen);
        std::vector<float> r(B * K);
        ref::gemv_s8_f32(r.data(), w.data(), a.data(), B, K, N, 0, K);
        for (Isa isa : tiers) {
          std::vector<float> v(B * K);
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

}  // namespace
}  // namespace s3r::kernels
