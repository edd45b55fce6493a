#pragma once
// Helpers of the backward quantizer's tests: random problems shaped like real backward passes,
// and comparisons of two quantizations (codes and D bit for bit; statistics bit for bit or within
// the stated bound of the vectorized tiers' f32 row sums).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/isa.hpp"
#include "s3r/quant/grad_quant.hpp"

namespace s3r::grad_quant_testing {

struct Problem {
  int64_t T, N, S;
  AlignedVector<float> g, sx, sw;
  std::vector<bf16> g_bf16;
};

// Heavy-tailed gradient (many entries below half a step, as in real backward passes) and
// positive forward scales of varied magnitude.
inline Problem make_problem(int64_t T, int64_t N, int64_t S, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Problem p{T, N, S, {}, {}, {}, {}};
  p.g.resize(static_cast<size_t>(T * N));
  for (auto& v : p.g) v = 1e-3f * normal(gen) * std::exp(1.5f * normal(gen));
  p.sx.resize(static_cast<size_t>(T));
  for (auto& v : p.sx) v = 0.01f * std::exp(normal(gen));
  p.sw.resize(static_cast<size_t>(N));
  for (auto& v : p.sw) v = 0.002f * std::exp(normal(gen));
  for (float v : p.g) p.g_bf16.push_back(to_bf16(v));
  return p;
}

inline std::string where(const Problem& p, GradRounding mode) {
  return "T=" + std::to_string(p.T) + " N=" + std::to_string(p.N) + " S=" + std::to_string(p.S) +
         " mode=" + std::string(to_string(mode)) + " isa=" + std::string(isa_name(active_isa()));
}

inline void expect_codes_equal(const QuantizedGrad& a, const QuantizedGrad& b, const std::string& ctx) {
  ASSERT_EQ(a.step, b.step) << ctx;
  ASSERT_EQ(a.count, b.count) << ctx;
  for (int q = 0; q < a.count; ++q) {
    ASSERT_EQ(a.codes[q].size(), b.codes[q].size()) << ctx;
    for (size_t i = 0; i < a.codes[q].size(); ++i) {
      ASSERT_EQ(a.codes[q][i], b.codes[q][i])
          << ctx << " quantization " << q << " element [" << i / a.channels << ", "
          << i % a.channels << "]";
    }
  }
}

// Tolerances of the statistics, in units of D. Each error term Q - x is the same f32 number in
// both implementations; the reference sums a row in double, the AVX-512 kernel in 16 f32 lanes of
// ceil(N/16) terms each (|term| <= 1), so the row sums differ by at most about
// (N/16 + 4) * 2^-24 * N and the means by (N/16 + 4) * 2^-24; we allow twice that. Column sums
// are summed in the same order by both (bit-identical), so their tolerance only covers the final
// double -> f32 rounding.
inline double token_mean_tol(const QuantizedGrad& r) {
  return r.step * (static_cast<double>(r.channels) / 16.0 + 4.0) * 0x1p-23;
}

inline void expect_stats_close(const QuantizedGrad& got, const QuantizedGrad& ref, const std::string& ctx,
                        bool bit_exact) {
  for (int q = 0; q < ref.count; ++q) {
    const ErrorStats& a = got.stats[q];
    const ErrorStats& b = ref.stats[q];
    ASSERT_EQ(a.token_mean.size(), b.token_mean.size()) << ctx;
    ASSERT_EQ(a.channel_mean.size(), b.channel_mean.size()) << ctx;
    ASSERT_EQ(a.grand_mean.size(), b.grand_mean.size()) << ctx;
    const double tol_c = bit_exact ? 0.0 : token_mean_tol(ref);
    const double tol_a = bit_exact ? 0.0 : ref.step * 0x1p-23;
    for (size_t i = 0; i < b.token_mean.size(); ++i) {
      ASSERT_NEAR(a.token_mean[i], b.token_mean[i], tol_c) << ctx << " c[" << i << "] q=" << q;
    }
    for (size_t i = 0; i < b.grand_mean.size(); ++i) {
      ASSERT_NEAR(a.grand_mean[i], b.grand_mean[i], tol_c) << ctx << " m[" << i << "] q=" << q;
    }
    for (size_t i = 0; i < b.channel_mean.size(); ++i) {
      ASSERT_NEAR(a.channel_mean[i], b.channel_mean[i], tol_a)
          << ctx << " a[" << i / ref.channels << ", " << i % ref.channels << "] q=" << q;
    }
  }
}

}  // namespace s3r::grad_quant_testing
