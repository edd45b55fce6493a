#pragma once
// Llama-style decoder configuration and presets.
#include <cstdint>
#include <string>
#include <string_view>

namespace s3r::model {

struct ModelConfig {
  int64_t layers = 2;       // L
  int64_t width = 64;       // C
  int64_t heads = 4;        // NH (head size C / NH, even)
  int64_t ffn_width = 192;  // F
  int64_t vocab = 256;      // V
  int64_t seq_len = 32;     // S
  int64_t batch = 4;        // B
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  // The numerics (projections, correction, LM head) are not part of the shape: nn::Recipe.

  int64_t head_dim() const { return width / heads; }
  int64_t tokens() const { return batch * seq_len; }  // T
  // Throws s3r::Error naming the first invalid field (e.g. C not divisible by heads).
  void validate() const;
  std::string describe() const;  // one line: L, C, heads, F, V, S, B
  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// "tiny" (tests; seconds), "small" (the default main job), "wide" (4 blocks of C = 1024, F = 4096,
// the FFN shape W2 of the paper's Table III: GEMM-bound, for `s3r bench step`), "paper" (the
// paper's 12-layer decoder).
ModelConfig preset(std::string_view name);

}  // namespace s3r::model
