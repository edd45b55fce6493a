#pragma once
// Internal: the exact-gradient backward of a BackwardProbe (see s3r/nn/backward_probe.hpp).
#include <span>

#include "s3r/nn/quant_linear.hpp"

namespace s3r::nn {

// dX (+)= G (sw Wq)^T, dW = (sx Xq)^T G in f32 for an int8-prepared x and w.
void exact_int8_backward(std::span<float> dx, std::span<float> dw, std::span<const float> g,
                         const LinearInput& x, const LinearWeight& w, bool accumulate_dx,
                         LinearWorkspace& ws);

}  // namespace s3r::nn
