// Scalar reference of the fused backward quantizer: SPEC sections 1, 2 and 4, element by element.
#include <cmath>

#include "kernels/kernels.hpp"
#include "kernels/ref/numerics.hpp"
#include "s3r/quant/thresholds.hpp"

namespace s3r::kernels::ref {

namespace {
float load_g(const GradProblem& p, int64_t i) {
  return p.g_f32 ? p.g_f32[i] : to_float(p.g_bf16[i]);
}
}  // namespace

float grad_absmax(const GradProblem& p, int64_t r0, int64_t r1, bool* nonfinite) {
  float absmax = 0.0f;
  for (int64_t t = r0; t < r1; ++t) {
    for (int64_t n = 0; n < p.channels; ++n) {
      const float g = load_g(p, t * p.channels + n);
      if (!std::isfinite(g)) *nonfinite = true;
      absmax = std::fmax(absmax, std::fabs((p.sx[t] * g) * p.sw[n]));
    }
  }
  return absmax;
}

void grad_quantize(const GradProblem& p, float step, int64_t r0, int64_t r1,
                   const GradBlockOut& out) {
  const int64_t N = p.channels;
  for (int q = 0; q < p.count; ++q) {
    if (out.col_sums[q]) {
      for (int64_t n = 0; n < N; ++n) out.col_sums[q][n] = 0.0f;
    }
  }
  for (int64_t t = r0; t < r1; ++t) {
    // Shared thresholds: one per token (s3r) or per example (s3r-bcast), product key 0.
    float shared_r = 0.0f;
    if (p.mode == GradRounding::kS3r) shared_r = threshold7(p.keys[0], p.row_id(t));
    if (p.mode == GradRounding::kS3rBcast) shared_r = threshold7(p.keys[0], p.example_id(t));
    for (int q = 0; q < p.count; ++q) {
      double row_acc = 0.0;
      for (int64_t n = 0; n < N; ++n) {
        const int64_t i = t * N + n;
        const float x = ((p.sx[t] * load_g(p, i)) * p.sw[n]) / step;
        int8_t code = 0;
        switch (p.mode) {
          case GradRounding::kRtne: code = rtne_code(x); break;
          case GradRounding::kSr:
            code = sr_code(x, uniform23(random_bits32(p.keys[q], p.row_id(t) * static_cast<uint64_t>(N) + static_cast<uint64_t>(n))));
            break;
          case GradRounding::kS3r:
          case GradRounding::kS3rBcast: code = sr_code(x, shared_r); break;
        }
        out.codes[q][i] = code;
        const float e = static_cast<float>(code) - x;  // E / D, rounded to f32
        row_acc += e;
        if (out.col_sums[q]) out.col_sums[q][n] += e;
      }
      if (out.row_sums[q]) out.row_sums[q][t] = static_cast<float>(row_acc);
    }
  }
}

}  // namespace s3r::kernels::ref
