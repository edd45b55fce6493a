// The int8 linear layer's dX product with its epilogue fused (gemm/matmul_dx.hpp): in every int8
// backend, on 1 and 2 threads, the bits of the reference epilogue applied to the exact int32 sums
// (computed here), around the blocks of s3r's own GEMMs (AVX2: 6 x 16 tiles in blocks of up to 144 x 256;
// AMX/VNNI: 32 x 32 blocks; outputs over 1 MB, which the VNNI GEMM stores past the caches), with
// and without S3R-EC's term, overwriting and accumulating.
#include "gemm/matmul_dx.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gemm/backends.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/gemm/backend.hpp"
#include "test_util.hpp"

namespace s3r::gemm {
namespace {

AlignedVector<float> normal_values(size_t n, float scale, std::mt19937& gen) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  AlignedVector<float> v(n);
  for (auto& x : v) x = scale * d(gen);
  return v;
}

TEST(MatmulDx, FusedEqualsTheReferenceEpilogueOfTheExactSums) {
  const auto backends = testing::int8_backends();
  std::mt19937 gen(5);
  // (T, K, N, S): T tokens of S per example; K the output's columns, N the summed dimension.
  for (auto [T, K, N, S] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 1, 1, 1}, {7, 17, 3, 7},
                            {37, 50, 70, 37}, {70, 300, 130, 35}, {97, 257, 513, 97}, {145, 40, 513, 29}, {64, 64, 128, 16},
                            {40, 50, 2049, 20},   // AVX2: packed by K slice (T <= 768, N >= 2048)
                            {300, 1040, 70, 60}, {300, 1001, 70, 100}}) {  // VNNI: over 1 MB, streamed
    const auto g = testing::random_s8(T * N, 11), w = testing::random_s8(K * N, 12);
    // the exact sums of G W^T, W stored (K, N)
    std::vector<int32_t> sums(T * K);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        int32_t s = 0;
        for (int64_t n = 0; n < N; ++n) s += int32_t{g[t * N + n]} * w[k * N + n];
        sums[t * K + k] = s;
      }
    }
    AlignedVector<float> sx = normal_values(T, 1.0f, gen), wa = normal_values((T / S) * K, 1e-3f, gen),
                       delta = normal_values(T, 1e-4f, gen), rowsum = normal_values(K, 300.0f, gen),
                       init = normal_values(T * K, 1.0f, gen);
    for (auto& v : sx) v = 0.01f * std::exp(v);
    for (auto& v : rowsum) v = std::round(v);
    for (bool correct : {false, true}) {
      for (bool accumulate : {false, true}) {
        const kernels::DxTerms d{3e-5f, sx.data(), correct ? wa.data() : nullptr, delta.data(), rowsum.data(), S, K,
                                 accumulate};
        AlignedVector<float> want = init;
        kernels::ref::dx_epilogue(want.data(), K, sums.data(), K, 0, T, 0, K, d);
        for (Int8Backend backend : backends) {
          ScopedInt8Backend scoped(backend);
          for (int threads : {1, 2}) {
            ::s3r::testing::ScopedThreads st(threads);
            AlignedVector<float> got = init;
            got.push_back(-7.0f);  // a guard past the end
            matmul_s8_dx(got.data(), g.data(), w.data(), MatmulShape{T, K, N, false, true}, d);
            for (int64_t i = 0; i < T * K; ++i) {
              ASSERT_EQ(got[i], want[i]) << to_string(backend) << " T=" << T << " K=" << K << " N=" << N
                                         << " S=" << S << " correct=" << correct << " accumulate=" << accumulate
                                         << " threads " << threads << " at [" << i / K << ", " << i % K << "]";
            }
            ASSERT_EQ(got[T * K], -7.0f) << to_string(backend) << ": wrote past the end";
          }
        }
      }
    }
  }
}

TEST(MatmulDx, RefusesAStridedOutputOrOtherTerms) {
  const auto g = testing::random_s8(4 * 8, 1), w = testing::random_s8(6 * 8, 2);
  AlignedVector<float> out(4 * 10), sx(4, 1.0f);
  kernels::DxTerms d{1.0f, sx.data(), nullptr, nullptr, nullptr, 4, 6, false};
  EXPECT_THROW(matmul_s8_dx(out.data(), g.data(), w.data(), MatmulShape{4, 6, 8, false, true, 0, 0, 10}, d), Error);
  d.K = 5;
  EXPECT_THROW(matmul_s8_dx(out.data(), g.data(), w.data(), MatmulShape{4, 6, 8, false, true}, d), Error);
}

}  // namespace
}  // namespace s3r::gemm
