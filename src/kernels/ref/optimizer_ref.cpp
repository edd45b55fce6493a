// Scalar reference of the AdamW update (kernels/kernels.hpp adamw_update): plain loops, the
// operations of the contract in its order.
#include <cmath>

#include "kernels/kernels.hpp"

namespace s3r::kernels::ref {

bool adamw_update(const AdamWElements& e, int64_t i0, int64_t i1, bool write) {
  // x * 0 is 0 for a finite x and NaN for Inf or NaN: the sum is 0 exactly when all are finite.
  float poison = 0.0f;
  for (int64_t i = i0; i < i1; ++i) {
    const float g = e.g[i] * e.clip;
    const float m = e.beta1 * e.m[i] + e.one_minus_beta1 * g;
    const float v = e.beta2 * e.v[i] + e.one_minus_beta2 * g * g;
    const float w0 = e.w[i];
    const float w = w0 - e.lr * (m / e.bias1) / (std::sqrt(v / e.bias2) + e.eps) - e.decay * w0;
    poison += w * 0.0f + m * 0.0f + v * 0.0f;
    if (write) {
      e.m[i] = m;
      e.v[i] = v;
      e.w[i] = w;
    }
  }
  return poison == 0.0f;
}

}  // namespace s3r::kernels::ref
