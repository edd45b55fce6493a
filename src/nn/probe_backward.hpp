#pragma once
// Internal: the backward of an int8 layer with a BackwardProbe attached (ws.probe), the one
// place the diagnostics of s3r/nn/backward_probe.hpp live. linear_backward hands such a call
// here after its argument checks; the Model attaches a probe with Model::set_backward_probe.
#include <span>

#include "s3r/nn/quant_linear.hpp"

namespace s3r::nn {

// linear_backward for an int8 x and w with *ws.probe: the telemetry of G, then either the exact
// (unrounded) backward, the causal ablation (a second quantization of G for dW), or the plain
// int8 backward.
void probe_linear_backward(std::span<float> dx, std::span<float> dw, std::span<const float> g,
                           const LinearInput& x, const LinearWeight& w,
                           const LinearBackwardConfig& config, LinearWorkspace& ws);

}  // namespace s3r::nn
