#pragma once
// Modes of a linear layer's products and of its S3R-EC correction (SPEC sections 2 and 4). A
// model's choice of both, with its LM head, is one value: nn::Recipe (s3r/nn/recipe.hpp).
#include <string_view>

#include "s3r/quant/grad_quant.hpp"

namespace s3r::nn {

enum class LinearMode {
  kF32,       // f32 operands and products: the exact reference (gradient checks)
  kBf16,      // bf16 operands, f32 accumulation, no int8 anywhere: the paper's baseline
  kRtne,      // int8 forward and backward, gradient rounded to nearest even
  kSr,        // int8, independent stochastic rounding per element and product
  kS3r,       // int8, one shared 7-bit threshold per token (the default)
  kS3rBcast,  // int8, one shared threshold per example (ablation)
};

enum class Correction {
  kNone,    // no correction
  kDx,      // subtract the structured error from dX only (the default with s3r)
  kTwoWay,  // subtract it from dX and dW
};

// "f32" | "bf16" | "rtne" | "sr" | "s3r" | "s3r-bcast"; parse throws s3r::Error listing them.
std::string_view to_string(LinearMode mode);
LinearMode parse_linear_mode(std::string_view name);
// "none" | "dx" | "two-way".
std::string_view to_string(Correction correction);
Correction parse_correction(std::string_view name);

constexpr bool is_int8(LinearMode m) { return m != LinearMode::kF32 && m != LinearMode::kBf16; }

// The backward rounding of an int8 mode.
GradRounding grad_rounding(LinearMode mode);

}  // namespace s3r::nn
