#pragma once
// Memory estimates of the models the tools build, for the one memory check (s3r::check_memory,
// s3r/core/machine.hpp) made before large allocations.
#include <cstdint>
#include <string>

#include "s3r/core/machine.hpp"
#include "s3r/model/config.hpp"
#include "s3r/nn/recipe.hpp"

namespace s3r::tools {

// The values a model of CFG holds (parameters, per-step activations, logits, attention
// probabilities), roughly, in double: the sizes the library multiplies in int64 stay far from
// overflow while this is below kMaxModelElements.
double model_elements(const model::ModelConfig& cfg);
constexpr double kMaxModelElements = 1e15;  // 4 PB of f32: beyond any machine

// Bytes a model::Model of CFG and RECIPE holds after a training step (model::Model::estimate_bytes,
// within about 30%, the contract in model.hpp that tests/model checks), plus AdamW's two moments per
// parameter when with_optimizer. For shapes beyond kMaxModelElements, a lower bound (4 bytes per
// element) computed in double instead of the library's int64 arithmetic, which would overflow.
double estimate_model_bytes(const model::ModelConfig& cfg, const nn::Recipe& recipe, bool with_optimizer);

}  // namespace s3r::tools
