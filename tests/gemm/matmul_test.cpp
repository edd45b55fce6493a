// oneDNN matmul wrappers against a scalar reference, for the three layouts of a linear layer.
#include "s3r/gemm/matmul.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "s3r/core/error.hpp"

namespace s3r::gemm {
namespace {

struct Case {
  int64_t M, N, K;
  bool ta, tb;
};

// The layouts of Y = X W, dX = G W^T and dW = X^T G, and odd sizes around the kernels' tiles.
std::vector<Case> cases() {
  std::vector<Case> c;
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 5, 7}, {16, 16, 16},
                         {17, 33, 65}, {64, 48, 130}, {100, 1, 37}, {1, 70, 129}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) c.push_back({M, N, K, ta, tb});
    }
  }
  return c;
}

std::string describe(const Case& c) {
  return "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
         " ta=" + std::to_string(c.ta) + " tb=" + std::to_string(c.tb);
}

// op(A)[m, k] and op(B)[k, n] from row-major storage.
template <typename T>
T at_a(const std::vector<T>& a, const Case& c, int64_t m, int64_t k) {
  return c.ta ? a[k * c.M + m] : a[m * c.K + k];
}
template <typename T>
T at_b(const std::vector<T>& b, const Case& c, int64_t k, int64_t n) {
  return c.tb ? b[n * c.K + k] : b[k * c.N + n];
}

std::vector<int8_t> random_s8(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> v(n);
  for (auto& x : v) x = static_cast<int8_t>(d(gen));
  return v;
}

std::vector<float> random_f32(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

MatmulShape shape_of(const Case& c) { return MatmulShape{c.M, c.N, c.K, c.ta, c.tb}; }

TEST(Matmul, Int8ToInt32IsExact) {
  for (const Case& c : cases()) {
    const auto a = random_s8(c.M * c.K, 1), b = random_s8(c.K * c.N, 2);
    // Extremes: a full row/column of -127 * -127 products.
    std::vector<int32_t> out(c.M * c.N, -1);
    matmul_s8(out.data(), a.data(), b.data(), shape_of(c));
    for (int64_t m = 0; m < c.M; ++m) {
      for (int64_t n = 0; n < c.N; ++n) {
        int64_t ref = 0;
        for (int64_t k = 0; k < c.K; ++k) ref += int64_t{at_a(a, c, m, k)} * at_b(b, c, k, n);
        ASSERT_EQ(out[m * c.N + n], ref) << describe(c) << " at [" << m << ", " << n << "]";
      }
    }
  }
}

TEST(Matmul, Int8WorstCaseSumsAreExact) {
  const Case c{4, 3, 4096, false, true};
  std::vector<int8_t> a(c.M * c.K, -127), b(c.K * c.N, -127);
  std::vector<int32_t> out(c.M * c.N);
  matmul_s8(out.data(), a.data(), b.data(), shape_of(c));
  for (int32_t v : out) EXPECT_EQ(v, 4096 * 127 * 127);
}

// Scaled int8: exact int32 sum times two f32 scales; allow 4 f32 ulps of the result.
TEST(Matmul, Int8ScaledFusesRowAndColumnScales) {
  for (const Case& c : cases()) {
    const auto a = random_s8(c.M * c.K, 3), b = random_s8(c.K * c.N, 4);
    std::vector<float> rs(c.M), cs(c.N);
    for (int64_t m = 0; m < c.M; ++m) rs[m] = 0.01f * static_cast<float>(m + 1);
    for (int64_t n = 0; n < c.N; ++n) cs[n] = 0.003f * static_cast<float>(n % 7 + 1);
    for (int variant = 0; variant < 4; ++variant) {
      const float* row = variant & 1 ? rs.data() : nullptr;
      const float* col = variant & 2 ? cs.data() : nullptr;
      for (bool accumulate : {false, true}) {
        std::vector<float> out(c.M * c.N, 0.5f);
        matmul_s8_scaled(out.data(), a.data(), b.data(), shape_of(c), row, col, accumulate);
        for (int64_t m = 0; m < c.M; ++m) {
          for (int64_t n = 0; n < c.N; ++n) {
            int64_t sum = 0;
            for (int64_t k = 0; k < c.K; ++k) sum += int64_t{at_a(a, c, m, k)} * at_b(b, c, k, n);
            const double ref = (row ? row[m] : 1.0) * (col ? col[n] : 1.0) * static_cast<double>(sum) +
                               (accumulate ? 0.5 : 0.0);
            ASSERT_NEAR(out[m * c.N + n], ref, 4.0 * 0x1p-24 * (std::fabs(ref) + 1.0))
                << describe(c) << " variant " << variant << " acc " << accumulate << " at [" << m
                << ", " << n << "]";
          }
        }
      }
    }
  }
}

// Float products: the f32-accumulated result differs from the exact (double) one by at most
// gamma_K * sum_k |a||b| with gamma_K = K u / (1 - K u), u = 2^-24; inputs of the bf16 product are
// bf16 already, so only accumulation error remains. We allow 2 * K * u * sum|a||b|.
template <typename In, typename Out>
void check_float_product(const char* what, bool accumulate) {
  for (const Case& c : cases()) {
    const auto af = random_f32(c.M * c.K, 5), bf = random_f32(c.K * c.N, 6);
    std::vector<In> a(af.size()), b(bf.size());
    auto from_float = [](float f) {
      if constexpr (std::is_same_v<In, bf16>) {
        return to_bf16(f);
      } else {
        return f;
      }
    };
    for (size_t i = 0; i < a.size(); ++i) a[i] = from_float(af[i]);
    for (size_t i = 0; i < b.size(); ++i) b[i] = from_float(bf[i]);
    auto val = [](In v) -> double {
      if constexpr (std::is_same_v<In, bf16>) {
        return to_float(v);
      } else {
        return v;
      }
    };
    std::vector<Out> out(c.M * c.N);
    std::vector<float> init(c.M * c.N, 0.25f);
    if constexpr (std::is_same_v<Out, float>) {
      out = init;
      if constexpr (std::is_same_v<In, float>) {
        matmul_f32(out.data(), a.data(), b.data(), shape_of(c), accumulate);
      } else {
        matmul_bf16(out.data(), a.data(), b.data(), shape_of(c), accumulate);
      }
    } else {
      matmul_bf16(out.data(), a.data(), b.data(), shape_of(c));
    }
    for (int64_t m = 0; m < c.M; ++m) {
      for (int64_t n = 0; n < c.N; ++n) {
        double ref = accumulate ? 0.25 : 0.0, mag = 0.0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double p = val(at_a(a, c, m, k)) * val(at_b(b, c, k, n));
          ref += p;
          mag += std::fabs(p);
        }
        double got, tol = 2.0 * static_cast<double>(c.K) * 0x1p-24 * mag + 1e-30;
        if constexpr (std::is_same_v<Out, bf16>) {
          got = to_float(out[m * c.N + n]);
          tol += 0x1p-8 * std::fabs(ref);  // bf16 output rounding (8 significant bits)
        } else {
          got = out[m * c.N + n];
        }
        ASSERT_NEAR(got, ref, tol) << what << " " << describe(c) << " at [" << m << ", " << n << "]";
      }
    }
  }
}

TEST(Matmul, F32MatchesReference) {
  check_float_product<float, float>("f32", false);
  check_float_product<float, float>("f32 accumulate", true);
}

TEST(Matmul, Bf16ToF32MatchesReference) {
  check_float_product<bf16, float>("bf16->f32", false);
  check_float_product<bf16, float>("bf16->f32 accumulate", true);
}

TEST(Matmul, Bf16ToBf16MatchesReference) { check_float_product<bf16, bf16>("bf16->bf16", false); }

// Leading dimensions: products of column slices (one attention head of a (T, C) tensor), with
// every transpose, from inside an OpenMP parallel region (each thread its own stream).
TEST(Matmul, LeadingDimensionsReadAndWriteColumnSlices) {
  const int64_t T = 24, C = 40, HD = 8, heads = C / HD;
  const auto q = random_f32(T * C, 7), k = random_f32(T * C, 8);
  std::vector<float> scores(heads * T * T), out(T * C, 0.0f);
#pragma omp parallel for
  for (int64_t h = 0; h < heads; ++h) {
    // scores_h = Q_h K_h^T (T x T): A = Q_h (T x HD, ld C), B = K_h^T stored as (T x HD, ld C).
    matmul_f32(scores.data() + h * T * T, q.data() + h * HD, k.data() + h * HD,
               {T, T, HD, false, true, C, C, T});
    // out_h = scores_h^T K_h (T x HD into columns h*HD.. of out, ld C).
    matmul_f32(out.data() + h * HD, scores.data() + h * T * T, k.data() + h * HD,
               {T, HD, T, true, false, T, C, C});
  }
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = 0; j < T; ++j) {
        double ref = 0.0, mag = 0.0;
        for (int64_t d = 0; d < HD; ++d) {
          ref += double(q[i * C + h * HD + d]) * k[j * C + h * HD + d];
          mag += std::fabs(double(q[i * C + h * HD + d]) * k[j * C + h * HD + d]);
        }
        ASSERT_NEAR(scores[h * T * T + i * T + j], ref, 2.0 * HD * 0x1p-24 * mag) << h << " " << i << " " << j;
      }
      for (int64_t d = 0; d < HD; ++d) {
        double ref = 0.0, mag = 0.0;
        for (int64_t j = 0; j < T; ++j) {
          ref += double(scores[h * T * T + j * T + i]) * k[j * C + h * HD + d];
          mag += std::fabs(double(scores[h * T * T + j * T + i]) * k[j * C + h * HD + d]);
        }
        ASSERT_NEAR(out[i * C + h * HD + d], ref, 2.0 * T * 0x1p-24 * mag) << h << " " << i << " " << d;
      }
    }
  }
  std::vector<float> small(4);
  EXPECT_THROW(matmul_f32(small.data(), q.data(), k.data(), {2, 2, 8, false, false, 4, 0, 0}), Error);
}

TEST(Matmul, PrimitivesAreCachedPerShape) {
  const auto a = random_s8(8 * 8, 1), b = random_s8(8 * 8, 2);
  std::vector<int32_t> out(64);
  matmul_s8(out.data(), a.data(), b.data(), {8, 8, 8});
  const int64_t before = matmul_primitive_count();
  for (int i = 0; i < 5; ++i) matmul_s8(out.data(), a.data(), b.data(), {8, 8, 8});
  EXPECT_EQ(matmul_primitive_count(), before);
  matmul_s8(out.data(), a.data(), b.data(), {8, 8, 8, true, false});
  EXPECT_EQ(matmul_primitive_count(), before + 1);
}

TEST(Matmul, EmptyShapesAreRejected) {
  std::vector<int32_t> out(1);
  std::vector<int8_t> a(1), b(1);
  EXPECT_THROW(matmul_s8(out.data(), a.data(), b.data(), {0, 1, 1}), Error);
}

}  // namespace
}  // namespace s3r::gemm
