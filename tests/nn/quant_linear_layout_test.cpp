// Tests of QuantLinear's operands and results in PyTorch nn.Linear's (out, in) layout: a weight
// given as W^T (prepare_weight_transposed) and dW written as dW^T (LinearBackwardConfig::
// dw_transposed). Each must give the bits of the (in, out) path, transposed, in every tier and on
// any thread count (the capped reruns of this test cover the tiers between).
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "check_util.hpp"
#include "nn/linear_problem.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/isa.hpp"
#include "s3r/nn/linear_mode.hpp"
#include "s3r/nn/quant_linear.hpp"
#include "s3r/quant/grad_quant.hpp"
#include "s3r/rng/threefry.hpp"
#include "test_util.hpp"

namespace s3r::nn {
namespace {

using namespace s3r::nn::testing;  // the problems
using s3r::testing::str;

// W given as its transpose (nn.Linear's layout): the same codes, scales and row sums as
// prepare_weight of W, byte for byte, in the reference and the best tier, on 1 and 2 threads (the
// capped reruns of this test cover the other tiers), with an all-zero channel
// and shapes that cross the transpose's tiles; float modes and NaN refused.
TEST(QuantLinearWeight, TransposedLayoutGivesTheSameWeight) {
  for (const auto& [K, N] : {std::pair<int64_t, int64_t>{33, 70}, {64, 64}, {1, 5}, {130, 17}}) {
    AlignedVector<float> w(static_cast<size_t>(K * N)), wt(w.size());
    uint32_t state = 7;
    for (float& v : w) v = static_cast<float>(static_cast<int32_t>(state = state * 1664525u + 1013904223u)) * 1e-9f;
    for (int64_t k = 0; k < K; ++k) w[static_cast<size_t>(k * N + N / 2)] = 0.0f;  // channel N/2 all zero
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t n = 0; n < N; ++n) wt[static_cast<size_t>(n * K + k)] = w[static_cast<size_t>(k * N + n)];
    }
    for (const auto& [isa, threads] : {std::pair{Isa::kReference, 1}, std::pair{best_isa(), 1}, std::pair{best_isa(), 2}}) {
      ScopedIsa scoped(isa);
      s3r::testing::ScopedThreads scoped_threads(threads);
      LinearWeight want, got;
      prepare_weight(want, w, K, N, LinearMode::kS3r, "W");
      prepare_weight_transposed(got, wt, K, N, LinearMode::kS3r, "Wt");
      const std::string ctx = std::string(isa_name(isa)) + " threads " + std::to_string(threads) + " K " +
                              std::to_string(K) + " N " + std::to_string(N);
      EXPECT_EQ(got.codes, want.codes) << ctx;
      EXPECT_EQ(got.scales, want.scales) << ctx;
      EXPECT_EQ(got.code_row_sums, want.code_row_sums) << ctx;
      EXPECT_EQ(got.in, K);
      EXPECT_EQ(got.out, N);
    }
  }
  LinearWeight w;
  AlignedVector<float> wt(12, 1.0f);
  EXPECT_THROW(prepare_weight_transposed(w, wt, 3, 4, LinearMode::kBf16, "Wt"), Error);
  wt[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(prepare_weight_transposed(w, wt, 3, 4, LinearMode::kSr, "Wt"), Error);
}

// dW^T from the product itself: bit for bit the transpose of dW, and dX unchanged, for every int8
// mode with and without the dX correction, in the reference and the best tier on 1 and 2
// threads, at shapes with edges in every dimension of the int8 blocks (and an all-zero G). The
// row and column scales of the product differ per channel, so a scale applied along the wrong
// side is caught. The two-way correction and the float modes refuse the layout.
TEST(QuantLinearLayout, TransposedDwIsTheTransposeBitForBit) {
  const LinearMode modes[] = {LinearMode::kRtne, LinearMode::kSr, LinearMode::kS3r, LinearMode::kS3rBcast};
  struct Shape { int64_t T, K, N, S; bool zero_g; };
  for (const Shape& sh : {Shape{24, 33, 70, 8, false}, Shape{96, 130, 67, 32, false}, Shape{64, 64, 64, 16, false},
                          Shape{16, 20, 12, 8, true}}) {
    const Problem p = make_problem(sh.T, sh.K, sh.N, sh.S, 91u, sh.zero_g);
    for (const auto& [isa, threads] : {std::pair{Isa::kReference, 1}, std::pair{best_isa(), 1}, std::pair{best_isa(), 2}}) {
      ScopedIsa scoped(isa);
      s3r::testing::ScopedThreads scoped_threads(threads);
      for (LinearMode mode : modes) {
        for (Correction correction : {Correction::kNone, Correction::kDx}) {
          SCOPED_TRACE(str(p.shape(), " ", isa_name(isa), " threads ", threads, " ", to_string(mode), " correction ",
                           static_cast<int>(correction)));
          LinearInput in;
          LinearWeight weight;
          prepare_input(in, p.x, p.T, p.K, mode, "X");
          prepare_weight(weight, p.w, p.K, p.N, mode, "W");
          LinearBackwardConfig config;
          config.correction = correction;
          config.tokens_per_example = p.S;
          config.layer_key = make_layer_key(3, 1, 2);
          ASSERT_TRUE(dw_transposable(mode, config));
          AlignedVector<float> dx(static_cast<size_t>(p.T * p.K)), dw(static_cast<size_t>(p.K * p.N));
          AlignedVector<float> dx_t(dx.size()), dw_t(dw.size(), -1.0f);
          LinearWorkspace ws;
          linear_backward(dx, dw, p.g, in, weight, config, ws);
          config.dw_transposed = true;
          linear_backward(dx_t, dw_t, p.g, in, weight, config, ws);
          EXPECT_EQ(dx_t, dx);
          int64_t differ = 0;
          for (int64_t k = 0; k < p.K; ++k) {
            for (int64_t n = 0; n < p.N; ++n) {
              const float want = dw[static_cast<size_t>(k * p.N + n)], got = dw_t[static_cast<size_t>(n * p.K + k)];
              if (std::bit_cast<uint32_t>(want) != std::bit_cast<uint32_t>(got) && ++differ <= 3) {
                ADD_FAILURE() << "dW^T[n=" << n << ", k=" << k << "] = " << got << ", dW[k, n] = " << want;
              }
            }
          }
          EXPECT_EQ(differ, 0);
        }
      }
    }
  }
  const Problem p = make_problem(16, 8, 12, 8, 5u, false);
  LinearBackwardConfig config;
  config.tokens_per_example = p.S;
  config.dw_transposed = true;
  AlignedVector<float> dx(static_cast<size_t>(p.T * p.K)), dw(static_cast<size_t>(p.K * p.N));
  LinearWorkspace ws;
  for (const auto& [mode, correction] : {std::pair{LinearMode::kS3r, Correction::kTwoWay},
                                        std::pair{LinearMode::kF32, Correction::kNone},
                                        std::pair{LinearMode::kBf16, Correction::kNone}}) {
    config.correction = correction;
    EXPECT_FALSE(dw_transposable(mode, config));
    LinearInput in;
    LinearWeight weight;
    prepare_input(in, p.x, p.T, p.K, mode, "X");
    prepare_weight(weight, p.w, p.K, p.N, mode, "W");
    EXPECT_THROW(linear_backward(dx, dw, p.g, in, weight, config, ws), Error) << to_string(mode);
  }
}

}  // namespace
}  // namespace s3r::nn
