#pragma once
// Inference on a trained checkpoint: a decoder with a KV cache, so that each new
// token costs one position, and the samplers of `s3r generate`.
//
// The forward is the model's (s3r/model/model.hpp) for one sequence at positions 0, 1, ...:
// embedding, per block RMSNorm -> Q, K, V -> RoPE (adjacent pairs, positions from the cache) ->
// causal attention over the cached keys and values -> output projection -> residual, RMSNorm ->
// SwiGLU -> residual, final RMSNorm, LM head. The projections run through nn::linear_forward in
// the chosen precision, with weights prepared once:
//   kTrained: as the model computes its forward during training and validation: int8 modes round
//             each token's input and each output channel of the weight to int8 (RTNE), bf16 mode
//             rounds both to bf16, and the LM head is bf16 (f32 in f32 mode, int8 with --head int8);
//   kF32:     every product in f32 (what an exported f32 GGUF / Hugging Face model computes).
// Per-token rounding makes kTrained's results independent of how tokens are grouped into calls,
// up to the f32 summation order of the attention, which here sums in double.
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "s3r/ckpt/checkpoint.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/model/model.hpp"

namespace s3r::infer {

enum class Precision { kTrained, kF32 };
Precision parse_precision(const std::string& name);  // "trained" | "f32"; s3r::Error otherwise
const char* to_string(Precision p);
// The recipe a forward in `precision` computes with: the trained recipe, or f32 everywhere.
nn::Recipe inference_recipe(const nn::Recipe& trained, Precision precision);

// A checkpoint's weights in a Model (any mode: the arena is the same), and its record.
struct LoadedCheckpoint {
  ckpt::CheckpointInfo info;            // the checkpoint's own configuration (info.model: B, S as trained)
  std::unique_ptr<model::Model> model;  // holds the weights only: batch 1, seq_len 1, the checkpoint's mode
};
// `dir`: a run folder or a checkpoint folder. Throws s3r::Error naming what is wrong.
LoadedCheckpoint load_for_inference(const std::string& dir);

class Decoder {
 public:
  // `weights` must outlive the decoder. context: the most positions the cache holds (> 0).
  Decoder(const LoadedCheckpoint& weights, Precision precision, int64_t context);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  int64_t position() const { return pos_; }  // tokens in the cache
  int64_t context() const { return context_; }
  int64_t vocab() const { return V_; }
  void reset() { pos_ = 0; }

  // Appends `tokens` (at least one; position() + size <= context()) and returns the logits (V)
  // of the next token after the last one. With all_logits, also the logits after each of the
  // tokens, (n, V) row-major. Throws s3r::Error on an id outside the vocabulary or a full cache.
  std::span<const float> feed(std::span<const int32_t> tokens, AlignedVector<float>* all_logits = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t pos_ = 0, context_ = 0, V_ = 0;
};

struct SamplingOptions {
  float temperature = 0.8f;  // 0: greedy (the most likely token; ties: the lowest id)
  int64_t top_k = 40;        // 0: no limit
  float top_p = 0.95f;       // 1: no limit
  uint64_t seed = 0;
};

// Draws tokens from logits: temperature, then top-k, then top-p (the smallest set of the most
// likely tokens whose probabilities add up to at least top_p), then one draw from a seeded
// std::mt19937_64, so the same seed gives the same tokens.
class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);  // throws s3r::Error on a bad option
  int32_t sample(std::span<const float> logits);

 private:
  SamplingOptions o_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> work_;
};

// Index of the largest logit (ties: the lowest index).
int32_t argmax(std::span<const float> logits);

}  // namespace s3r::infer
