#pragma once
// Memory checks made before large allocations, so that a model too large for this machine is one
// clear s3r::Error at the start ("needs about 41.2 GB, but only 30.1 GB are available") instead
// of std::bad_alloc or the OOM killer after a minute of work.
#include <cstdint>
#include <string>

#include "s3r/model/config.hpp"
#include "s3r/nn/recipe.hpp"

namespace s3r::tools {

// Memory this process can still take, in bytes: MemAvailable of /proc/meminfo, lowered to what
// the cgroup's memory limit leaves when one applies (v2: memory.max - memory.current +
// inactive_file of memory.stat; v1 likewise). -1 when neither can be read.
int64_t usable_memory_bytes();

// The values a model of CFG holds (parameters, per-step activations, logits, attention
// probabilities), roughly, in double: the sizes the library multiplies in int64 stay far from
// overflow while this is below kMaxModelElements.
double model_elements(const model::ModelConfig& cfg);
constexpr double kMaxModelElements = 1e15;  // 4 PB of f32: beyond any machine

// Bytes a model::Model of CFG and RECIPE holds after a training step (model::Model::estimate_bytes,
// within about 15% of the measured peaks of `s3r bench step`), plus AdamW's two moments per
// parameter when with_optimizer. For shapes beyond kMaxModelElements, a lower bound (4 bytes per
// element) computed in double instead of the library's int64 arithmetic, which would overflow.
double estimate_model_bytes(const model::ModelConfig& cfg, const nn::Recipe& recipe, bool with_optimizer);

// Throws s3r::Error "WHAT needs about X GB, but only Y GB are available; HINT" when need_bytes
// exceeds `fraction` of usable_memory_bytes(); does nothing when that cannot be read.
void check_memory(double need_bytes, const std::string& what, const std::string& hint, double fraction = 0.9);

}  // namespace s3r::tools
