// Scalar reference of the element-wise and row kernels (SwiGLU, GeGLU, softmax cross-entropy, RMSNorm,
// bf16 rounding).
#include <cmath>

#include "kernels/kernels.hpp"
#include "kernels/ref/numerics.hpp"

namespace s3r::kernels::ref {

void swiglu_forward_ew(float* hidden, const float* h1, const float* h3, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) hidden[i] = (h1[i] * sigmoid_poly(h1[i])) * h3[i];
}

void swiglu_backward_ew(float* dh1, float* dh3, const float* dh, const float* h1, const float* h3,
                        int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float s = sigmoid_poly(h1[i]);
    dh3[i] = dh[i] * (h1[i] * s);
    dh1[i] = (dh[i] * h3[i]) * (s * (1.0f + h1[i] * (1.0f - s)));
  }
}

void geglu_forward_ew(float* hidden, const float* h1, const float* h3, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) hidden[i] = (h1[i] * gelu_gate(gelu_clamp(h1[i]))) * h3[i];
}

void geglu_backward_ew(float* dh1, float* dh3, const float* dh, const float* h1, const float* h3,
                       int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float c = gelu_clamp(h1[i]);
    const float s = gelu_gate(c);
    dh3[i] = dh[i] * (h1[i] * s);
    dh1[i] = (dh[i] * h3[i]) * gelu_slope(c, s);
  }
}

bool softmax_xent_rows(float* z, double* loss, const int32_t* targets, int64_t r0, int64_t r1,
                       int64_t vocab, float grad_scale) {
  for (int64_t r = r0; r < r1; ++r) {
    float* row = z + r * vocab;
    const int32_t y = targets[r];
    float m = row[0];
    for (int64_t i = 0; i < vocab; ++i) {
      if (!std::isfinite(row[i])) return false;
      m = row[i] > m ? row[i] : m;
    }
    const float zy = row[y];
    double partial[16] = {};
    for (int64_t i = 0; i < vocab; ++i) {
      row[i] = exp_poly(row[i] - m);
      partial[i % 16] += static_cast<double>(row[i]);
    }
    double sum = 0.0;
    for (double p : partial) sum += p;
    loss[r] = (std::log(sum) + static_cast<double>(m)) - static_cast<double>(zy);
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < vocab; ++i) row[i] = (row[i] * inv - (i == y ? 1.0f : 0.0f)) * grad_scale;
  }
  return true;
}

void rmsnorm_rows(float* out, float* rstd, const float* x, const float* weight, int64_t r0,
                  int64_t r1, int64_t width, float eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * width;
    double partial[16] = {};
    for (int64_t c = 0; c < width; ++c) partial[c % 16] += static_cast<double>(xr[c]) * static_cast<double>(xr[c]);
    double ss = 0.0;
    for (double p : partial) ss += p;
    const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(width) + static_cast<double>(eps)));
    rstd[r] = rs;
    for (int64_t c = 0; c < width; ++c) out[r * width + c] = (xr[c] * rs) * weight[c];
  }
}

void rmsnorm_backward_rows(float* dx, const float* dy, const float* x, const float* weight,
                           const float* rstd, int64_t r0, int64_t r1, int64_t width) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * width;
    const float* g = dy + r * width;
    double partial[16] = {};
    for (int64_t c = 0; c < width; ++c) {
      partial[c % 16] += (static_cast<double>(xr[c]) * static_cast<double>(weight[c])) * static_cast<double>(g[c]);
    }
    double dot = 0.0;
    for (double p : partial) dot += p;
    const double rr = rstd[r];
    const double k = rr * rr * rr * dot / static_cast<double>(width);
    for (int64_t c = 0; c < width; ++c) {
      const double v = (rr * static_cast<double>(weight[c])) * static_cast<double>(g[c]) - k * static_cast<double>(xr[c]);
      dx[r * width + c] += static_cast<float>(v);
    }
  }
}

void round_bf16(bf16* out, float* widened, const float* x, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const bf16 b = to_bf16(x[i]);
    if (out != nullptr) out[i] = b;
    if (widened != nullptr) widened[i] = to_float(b);
  }
}

}  // namespace s3r::kernels::ref
