// Scalar reference of the elementwise activation kernels.
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

}  // namespace s3r::kernels::ref
