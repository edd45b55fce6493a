#pragma once
// The product cases of the matmul tests (matmul_test.cpp: int8; matmul_float_test.cpp: f32 and
// bf16): the three layouts of a linear layer at odd sizes, and the operands' elements as a layout
// reads them.
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/gemm/matmul.hpp"

namespace s3r::gemm::product_cases {

struct Case {
  int64_t M, N, K;
  bool ta, tb;
};

// The layouts of Y = X W, dX = G W^T and dW = X^T G, and odd sizes around the kernels' tiles.
inline std::vector<Case> cases() {
  std::vector<Case> c;
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 5, 7}, {16, 16, 16},
                         {17, 33, 65}, {64, 48, 130}, {100, 1, 37}, {1, 70, 129},
                         // 3 x 3 of the thread-invariant f32/bf16 tiles (128 x 256), edges included
                         {300, 530, 40}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) c.push_back({M, N, K, ta, tb});
    }
  }
  return c;
}

inline std::string describe(const Case& c) {
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

// n normal (0, 1) f32 values of a fixed generator.
inline AlignedVector<float> random_f32(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  AlignedVector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

inline MatmulShape shape_of(const Case& c) { return MatmulShape{c.M, c.N, c.K, c.ta, c.tb}; }

}  // namespace s3r::gemm::product_cases
