#pragma once
// Diagnostic variations of the int8 backward pass (`s3r diag grad-error`, the paper's Table II).
// The trainer never sets a probe; with none attached, linear_backward is unchanged.
//
//   exact_grad    The backward with unquantized gradients through the same quantized forward:
//                 dX = G (sw Wq)^T and dW = (sx Xq)^T G in f32, G not rounded at all. This is
//                 the reference that a rounding mode's gradient errors are measured against.
//   dw_rounding   Quantize G a second time, with this rounding, for the dW product only (the
//                 paper's causal ablation: s3r thresholds for dX with per-example thresholds for
//                 dW, and the reverse). The second quantization uses layer key
//                 fold_in(layer_key, 1), so its randomness is independent of the first; D is the
//                 same (it depends only on G'). Needs correction none.
//   telemetry     When set, every int8 linear_backward appends the step D of its G and the share
//                 of elements that round to 0 under rtne (|G'/D| <= 1/2, G' = sx G sw): the
//                 gradient signal that stagnates without stochastic rounding.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "s3r/quant/grad_quant.hpp"

namespace s3r::nn {

struct GradTelemetry {
  int64_t layer_index = -1;  // LinearBackwardConfig::layer_index (7 l + j in the model)
  int64_t tokens = 0, channels = 0;  // T, N
  float step = 0.0f;                 // D = max |G'| / 127
  double share_below_half_step = 0.0;  // fraction of G' with |G'| / D <= 1/2 (1 when D = 0)
  int64_t expert = -1;  // a mixture of experts' expert (its experts share the layer index)
};

struct BackwardProbe {
  bool exact_grad = false;
  std::optional<GradRounding> dw_rounding;
  std::vector<GradTelemetry>* telemetry = nullptr;
};

// The telemetry of one gradient: G (T, N), the forward scales sx (T) and sw (N).
GradTelemetry grad_telemetry(std::span<const float> g, int64_t tokens, int64_t channels,
                             std::span<const float> sx, std::span<const float> sw,
                             int64_t layer_index);

}  // namespace s3r::nn
