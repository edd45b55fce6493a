// Diagnostic backward variations; see s3r/nn/backward_probe.hpp.
#include "s3r/nn/backward_probe.hpp"

#include <cmath>

#include "nn/probe_backward.hpp"
#include "s3r/core/error.hpp"
#include "s3r/gemm/matmul.hpp"

namespace s3r::nn {

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
#pragma omp parallel for reduction(max : amax) schedule(static)
  for (int64_t i = 0; i < tokens; ++i) {
    for (int64_t n = 0; n < channels; ++n) amax = std::fmax(amax, std::fabs(sx[i] * g[i * channels + n] * sw[n]));
  }
  t.step = amax / 127.0f;
  if (t.step == 0.0f) return t;
  int64_t below = 0;
#pragma omp parallel for reduction(+ : below) schedule(static)
  for (int64_t i = 0; i < tokens; ++i) {
    for (int64_t n = 0; n < channels; ++n) {
      below += std::fabs(sx[i] * g[i * channels + n] * sw[n] / t.step) <= 0.5f;
    }
  }
  t.share_below_half_step = static_cast<double>(below) / static_cast<double>(tokens * channels);
  return t;
}

void exact_int8_backward(std::span<float> dx, std::span<float> dw, std::span<const float> g,
                         const LinearInput& x, const LinearWeight& w, bool accumulate_dx,
                         LinearWorkspace& ws) {
  const int64_t T = x.tokens, K = x.features, N = w.out;
  ws.x_dequant.resize(static_cast<size_t>(T * K));
  ws.w_dequant.resize(static_cast<size_t>(K * N));
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) ws.x_dequant[t * K + k] = x.scales[t] * x.codes[t * K + k];
  }
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) ws.w_dequant[k * N + n] = w.scales[n] * w.codes[k * N + n];
  }
  if (!dx.empty()) {
    gemm::matmul_f32(dx.data(), g.data(), ws.w_dequant.data(), {T, K, N, false, true}, accumulate_dx);
  }
  gemm::matmul_f32(dw.data(), ws.x_dequant.data(), g.data(), {K, N, T, true, false});
}

}  // namespace s3r::nn
