// Tests of the diagnostic backward probes (s3r/nn/backward_probe.hpp) that `s3r diag grad-error`
// is built on: the exact-gradient reference, the separate dW quantization of the causal
// ablation, the telemetry, and the model's capture of block-input gradients.
#include "s3r/nn/backward_probe.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/model/model.hpp"
#include "s3r/nn/quant_linear.hpp"
#include "s3r/quant/grad_quant.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r::nn {
namespace {

constexpr int64_t T = 48, K = 40, N = 72, S = 16;

AlignedVector<float> uniform(uint32_t stream, int64_t n, float scale) {
  AlignedVector<float> v(static_cast<size_t>(n));
  const Key key = fold_in(key_from_seed(11), stream);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * (2.0f * uniform23(random_bits32(key, i)) - 1.0f);
  return v;
}

struct Layer {
  AlignedVector<float> x = uniform(1, T * K, 1.0f), w = uniform(2, K * N, 0.2f), g = uniform(3, T * N, 1e-3f);
  LinearInput xin;
  LinearWeight win;
  explicit Layer(LinearMode mode) {
    prepare_input(xin, x, T, K, mode, "X");
    prepare_weight(win, w, K, N, mode, "W");
  }
};

TEST(BackwardProbe, ExactGradientIsTheUnroundedBackwardOfTheQuantizedForward) {
  Layer l(LinearMode::kS3r);
  BackwardProbe probe;
  probe.exact_grad = true;
  LinearWorkspace ws;
  ws.probe = &probe;
  AlignedVector<float> dx(T * K), dw(K * N);
  linear_backward(dx, dw, l.g, l.xin, l.win, {Correction::kNone, S, key_from_seed(1), false}, ws);
  // Double-precision G (sw Wq)^T and (sx Xq)^T G; f32 sums of n terms are within n u sum|ab|.
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      double ref = 0.0, mag = 0.0;
      for (int64_t n = 0; n < N; ++n) {
        const double a = static_cast<double>(l.g[t * N + n]) * l.win.scales[n] * l.win.codes[k * N + n];
        ref += a, mag += std::fabs(a);
      }
      ASSERT_NEAR(dx[t * K + k], ref, (N + 2) * 0x1p-24 * mag + 1e-30) << "dX[" << t << "," << k << "]";
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0.0, mag = 0.0;
      for (int64_t t = 0; t < T; ++t) {
        const double a = static_cast<double>(l.xin.scales[t]) * l.xin.codes[t * K + k] * l.g[t * N + n];
        ref += a, mag += std::fabs(a);
      }
      ASSERT_NEAR(dw[k * N + n], ref, (T + 2) * 0x1p-24 * mag + 1e-30) << "dW[" << k << "," << n << "]";
    }
  }
}

TEST(BackwardProbe, SeparateDwRoundingKeepsDxAndTakesDwFromTheSecondQuantization) {
  const Key key = key_from_seed(5);
  const LinearBackwardConfig cfg{Correction::kNone, S, key, false};
  // Ablation: s3r for dX, per-example thresholds for dW.
  Layer l(LinearMode::kS3r);
  BackwardProbe probe;
  probe.dw_rounding = GradRounding::kS3rBcast;
  LinearWorkspace ws;
  ws.probe = &probe;
  AlignedVector<float> dx(T * K), dw(K * N);
  linear_backward(dx, dw, l.g, l.xin, l.win, cfg, ws);
  // dX: bit-identical to plain s3r with the same key.
  LinearWorkspace plain;
  AlignedVector<float> dx_s3r(T * K), dw_s3r(K * N);
  linear_backward(dx_s3r, dw_s3r, l.g, l.xin, l.win, cfg, plain);
  EXPECT_EQ(0, std::memcmp(dx.data(), dx_s3r.data(), dx.size() * sizeof(float)));
  // dW: bit-identical to plain s3r-bcast with layer key fold_in(key, 1).
  Layer lb(LinearMode::kS3rBcast);
  AlignedVector<float> dx_b(T * K), dw_b(K * N);
  LinearWorkspace bcast;
  linear_backward(dx_b, dw_b, lb.g, lb.xin, lb.win, {Correction::kNone, S, fold_in(key, 1), false}, bcast);
  EXPECT_EQ(0, std::memcmp(dw.data(), dw_b.data(), dw.size() * sizeof(float)));
  // And it differs from s3r's own dW (the ablation changes something).
  EXPECT_NE(0, std::memcmp(dw.data(), dw_s3r.data(), dw.size() * sizeof(float)));
}

TEST(BackwardProbe, SeparateDwRoundingRefusesACorrection) {
  Layer l(LinearMode::kS3r);
  BackwardProbe probe;
  probe.dw_rounding = GradRounding::kS3rBcast;
  LinearWorkspace ws;
  ws.probe = &probe;
  AlignedVector<float> dx(T * K), dw(K * N);
  EXPECT_THROW(linear_backward(dx, dw, l.g, l.xin, l.win, {Correction::kDx, S, key_from_seed(1), false}, ws),
               Error);
}

TEST(BackwardProbe, TelemetryStepIsTheQuantizersAndShareIsCounted) {
  Layer l(LinearMode::kRtne);
  std::vector<GradTelemetry> tele;
  BackwardProbe probe;
  probe.telemetry = &tele;
  LinearWorkspace ws;
  ws.probe = &probe;
  AlignedVector<float> dx(T * K), dw(K * N);
  linear_backward(dx, dw, l.g, l.xin, l.win, {Correction::kNone, S, key_from_seed(1), false, 9}, ws);
  ASSERT_EQ(tele.size(), 1u);
  EXPECT_EQ(tele[0].layer_index, 9);
  EXPECT_EQ(tele[0].step, ws.grad.step);  // bit-identical D
  // Under rtne, the codes that are 0 are exactly the elements with |G'/D| <= 1/2.
  int64_t zeros = 0;
  for (int8_t c : ws.grad.codes[0]) zeros += c == 0;
  EXPECT_DOUBLE_EQ(tele[0].share_below_half_step, static_cast<double>(zeros) / (T * N));
  EXPECT_GT(zeros, 0);
  EXPECT_LT(zeros, T * N);
}

TEST(BackwardProbe, ModelCapturesTheGradientEnteringEachBlock) {
  // f32 model: the embedding gradient of token v is the sum of dL/d(input of block 0) over the
  // positions holding v, so the captured block-0 gradient must reproduce it.
  model::ModelConfig cfg{{2, 32, 4, 4, 64, 50}, {8, 2}};
  model::Model m(cfg, Recipe::make(LinearMode::kF32, Correction::kNone));
  m.init_weights(3);
  m.set_capture_input_grads(true);
  std::vector<int32_t> in(cfg.tokens()), tg(cfg.tokens());
  for (int64_t i = 0; i < cfg.tokens(); ++i) in[i] = static_cast<int32_t>((i * 7) % 5), tg[i] = static_cast<int32_t>((i * 3) % 50);
  m.forward(in, tg);
  m.backward(key_from_seed(0));
  const auto d0 = m.block_input_grad(0);
  ASSERT_EQ(d0.size(), static_cast<size_t>(cfg.tokens() * cfg.width));
  EXPECT_EQ(m.block_input_grad(1).size(), d0.size());
  const float* emb = m.grads().data();  // tok_emb is the first parameter
  for (int v = 0; v < 5; ++v) {
    for (int64_t c = 0; c < cfg.width; ++c) {
      double sum = 0.0, mag = 0.0;
      for (int64_t t = 0; t < cfg.tokens(); ++t) {
        if (in[t] == v) sum += d0[t * cfg.width + c], mag += std::fabs(d0[t * cfg.width + c]);
      }
      ASSERT_NEAR(emb[v * cfg.width + c], sum, 1e-6 * mag + 1e-12) << "token " << v << " channel " << c;
    }
  }
  EXPECT_THROW(m.block_input_grad(2), Error);
}

}  // namespace
}  // namespace s3r::nn
