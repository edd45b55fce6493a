// Diagnostic backward variations; see s3r/nn/backward_probe.hpp.
#include "s3r/nn/backward_probe.hpp"

#include <cmath>

#include "core/parallel_blocks.hpp"
#include "nn/linear_backward_steps.hpp"
#include "nn/probe_backward.hpp"
#include "s3r/core/error.hpp"
#include "s3r/gemm/matmul.hpp"

namespace s3r::nn {

namespace {

constexpr int64_t kRowBlock = 16;  // rows per OpenMP task of the dequantization passes

// dX (+)= G (sw Wq)^T, dW = (sx Xq)^T G in f32 for an int8-prepared x and w.
void exact_int8_backward(std::span<float> dx, std::span<float> dw, std::span<const float> g,
                         const LinearInput& x, const LinearWeight& w, bool accumulate_dx,
                         LinearWorkspace& ws) {
  const int64_t T = x.tokens, K = x.features, N = w.out;
  ws.x_dequant.resize(static_cast<size_t>(T * K));
  ws.w_dequant.resize(static_cast<size_t>(K * N));
  parallel_blocks(T, kRowBlock, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t k = 0; k < K; ++k) ws.x_dequant[t * K + k] = x.scales[t] * x.codes[t * K + k];
    }
  });
  parallel_blocks(K, kRowBlock, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      for (int64_t n = 0; n < N; ++n) ws.w_dequant[k * N + n] = w.scales[n] * w.codes[k * N + n];
    }
  });
  if (!dx.empty()) {
    gemm::matmul_f32(dx.data(), g.data(), ws.w_dequant.data(), {T, K, N, false, true}, accumulate_dx);
  }
  gemm::matmul_f32(dw.data(), ws.x_dequant.data(), g.data(), {K, N, T, true, false});
}

// The causal ablation: dX from the layer's own quantization of G, dW from a second one with
// `rounding` and layer key fold_in(layer_key, 1), whose D is the same (it depends only on G').
void separate_dw_backward(std::span<float> dx, std::span<float> dw, std::span<const float> g,
                          const LinearInput& x, const LinearWeight& w,
                          const LinearBackwardConfig& config, GradRounding rounding,
                          LinearWorkspace& ws) {
  if (config.correction != Correction::kNone) {
    throw Error("linear_backward: a probe's separate dW rounding needs correction none");
  }
  quantize_grad(ws.grad, g, x, w, config, grad_rounding(x.mode), config.layer_key, false, ws.times);
  const float D = ws.grad.step;
  if (D == 0.0f) return zero_backward(dx, dw, config.accumulate_dx);
  if (!dx.empty()) int8_dx(dx, ws.grad, x, w, config, /*correct=*/false, ws);
  quantize_grad(ws.grad_dw, g, x, w, config, rounding, fold_in(config.layer_key, 1), false, ws.times);
  int8_dw(dw, ws.grad_dw.codes_for_dw(), D, x, w, config, ws);
}

}  // namespace

GradTelemetry grad_telemetry(std::span<const float> g, int64_t tokens, int64_t channels,
                             std::span<const float> sx, std::span<const float> sw,
                             int64_t layer_index) {
  if (g.size() != static_cast<size_t>(tokens * channels) || sx.size() != static_cast<size_t>(tokens) ||
      sw.size() != static_cast<size_t>(channels)) {
    throw Error("grad_telemetry: G, sx and sw do not match T = " + std::to_string(tokens) +
                ", N = " + std::to_string(channels));
  }
  GradTelemetry t{layer_index, tokens, channels, 0.0f, 1.0};
  // G' = (sx G) sw in f32, in the quantizer's order (s3r/quant/grad_quant.hpp).
  float amax = 0.0f;
  // An OpenMP reduction, not parallel_blocks (which has none): a max is exact in any order.
#pragma omp parallel for reduction(max : amax) schedule(static)
  for (int64_t i = 0; i < tokens; ++i) {
    for (int64_t n = 0; n < channels; ++n) amax = std::fmax(amax, std::fabs(sx[i] * g[i * channels + n] * sw[n]));
  }
  t.step = amax / 127.0f;
  if (t.step == 0.0f) return t;
  int64_t below = 0;
  // An OpenMP reduction, not parallel_blocks (which has none): an integer count is exact in any order.
#pragma omp parallel for reduction(+ : below) schedule(static)
  for (int64_t i = 0; i < tokens; ++i) {
    for (int64_t n = 0; n < channels; ++n) {
      below += std::fabs(sx[i] * g[i * channels + n] * sw[n] / t.step) <= 0.5f;
    }
  }
  t.share_below_half_step = static_cast<double>(below) / static_cast<double>(tokens * channels);
  return t;
}

void probe_linear_backward(std::span<float> dx, std::span<float> dw, std::span<const float> g,
                           const LinearInput& x, const LinearWeight& w,
                           const LinearBackwardConfig& config, LinearWorkspace& ws) {
  const BackwardProbe& probe = *ws.probe;
  if (probe.telemetry != nullptr) {
    probe.telemetry->push_back(grad_telemetry(g, x.tokens, w.out, x.scales, w.scales, config.layer_index));
  }
  if (probe.exact_grad) return exact_int8_backward(dx, dw, g, x, w, config.accumulate_dx, ws);
  if (probe.dw_rounding) return separate_dw_backward(dx, dw, g, x, w, config, *probe.dw_rounding, ws);
  int8_backward(dx, dw, g, x, w, config, ws);
}

}  // namespace s3r::nn
