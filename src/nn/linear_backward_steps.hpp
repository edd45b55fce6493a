#pragma once
// Internal: the steps of linear_backward's int8 path (SPEC sections 1, 2, 4 and 6), defined in
// quant_linear.cpp. linear_backward runs them in order (int8_backward); the diagnostic probes
// (backward_probe.cpp) recombine them. Every step adds its time to its phase of ws.times.
#include <cstdint>
#include <span>

#include "s3r/nn/quant_linear.hpp"

namespace s3r::nn {

// The int8 backward of one layer: quantize G' once, dX, dW, the S3R-EC terms config asks for.
void int8_backward(std::span<float> dx, std::span<float> dw, std::span<const float> g,
                   const LinearInput& x, const LinearWeight& w, const LinearBackwardConfig& config,
                   LinearWorkspace& ws);

// q = G' = sx G sw quantized with `rounding` and layer key `key` over the batch of
// config.placement (D is the group's), with S3R-EC's statistics when `stats`.
void quantize_grad(QuantizedGrad& q, std::span<const float> g, const LinearInput& x,
                   const LinearWeight& w, const LinearBackwardConfig& config, GradRounding rounding,
                   Key key, bool stats, PhaseTimes* times);

// D == 0: every gradient of the layer is exactly 0 (dX is left as it is when accumulating).
void zero_backward(std::span<float> dx, std::span<float> dw, bool accumulate_dx);

// dX (+)= (D acc - [Wq a_b + (c - m) rowsum(Wq)]) / sx with acc = Q Wq^T exact in int32, Q =
// q.codes_for_dx(); the bracket (S3R-EC's dX term) only when `correct`. dx: (T, K).
void int8_dx(std::span<float> dx, const QuantizedGrad& q, const LinearInput& x,
             const LinearWeight& w, const LinearBackwardConfig& config, bool correct,
             LinearWorkspace& ws);

// dW = (D / sw) * Xq^T Q for codes Q (T, N) of step D, summed over config.placement's group.
void int8_dw(std::span<float> dw, std::span<const int8_t> codes, float D, const LinearInput& x,
             const LinearWeight& w, const LinearBackwardConfig& config, LinearWorkspace& ws);

}  // namespace s3r::nn
