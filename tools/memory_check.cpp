// Memory estimates of the tools' models; see memory_check.hpp.
#include "memory_check.hpp"

#include "s3r/core/error.hpp"
#include "s3r/model/model.hpp"

namespace s3r::tools {

double model_elements(const model::ModelConfig& cfg) {
  const double L = static_cast<double>(cfg.layers), C = static_cast<double>(cfg.width),
               F = static_cast<double>(cfg.ffn_width), V = static_cast<double>(cfg.vocab),
               S = static_cast<double>(cfg.seq_len), B = static_cast<double>(cfg.batch),
               NH = static_cast<double>(cfg.heads), T = B * S;
  const double Ckv = static_cast<double>(cfg.kv_heads) * (C / NH);
  return 2.0 * V * C + L * (2.0 * C * (C + Ckv) + 3.0 * C * F) + L * B * NH * S * S +
         T * (3.0 * V + L * (6.0 * C + 2.0 * Ckv + 6.0 * F));
}

double estimate_model_bytes(const model::ModelConfig& cfg, const nn::Recipe& recipe, bool with_optimizer) {
  const double elements = model_elements(cfg);
  if (!(elements < kMaxModelElements)) return 4.0 * elements;
  double bytes = static_cast<double>(model::Model::estimate_bytes(cfg, recipe));
  if (with_optimizer) bytes += 8.0 * static_cast<double>(model::Model::parameter_count(cfg));
  return bytes;
}

}  // namespace s3r::tools
