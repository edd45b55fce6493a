#pragma once
// A decoder's configuration, in two parts: its architecture (every size a parameter has: what a
// checkpoint records and inference needs) and the shape of a training step's batch (which sizes
// no parameter: a checkpoint resumes, evaluates or generates with another). ModelConfig holds
// both, for the code that builds a training model.
#include <cstdint>
#include <string>
#include <string_view>

namespace s3r::model {

// The model families s3r trains. A family is data: what its blocks have beyond the Llama block
// (FamilyTraits), read by the model, the decoder, checkpoints and exports from one table.
enum class Family : uint8_t { kLlama, kQwen3, kGemma3, kQwen3Moe };

struct FamilyTraits {
  Family family;
  std::string_view name;  // "llama", "qwen3", "gemma3", "qwen3moe": --arch, meta.json, GGUF general.architecture
  bool qk_norm;           // RMSNorm over each head of q and k (weights of HD), before RoPE
  float rope_theta, norm_eps;  // the family's defaults (rope_theta: of the global layers)
  // Gemma's block (docs/SPEC.md, appendix A.9):
  float norm_offset = 0.0f;     // an RMSNorm's gain is norm_offset + w (Gemma: 1 + w, w from 0)
  bool post_norms = false;      // RMSNorm of the attention's and the FFN's outputs before the residual add
  bool gelu = false;            // GeGLU (GELU's tanh form) instead of SwiGLU
  bool embed_scale = false;     // token embeddings times sqrt(C)
  bool tied_head = false;       // LM head = the embedding, transposed; its gradient flows into the embedding
  int64_t local_period = 0;     // > 0: layers l with (l + 1) % local_period != 0 are local (sliding window)
  float rope_theta_local = 0;   // RoPE base of the local layers
  // Qwen3-MoE's block (docs/SPEC.md A.10): the FFN is a routed mixture of `experts` SwiGLU
  // experts of width ffn_width, each token sent to `experts_used` of them (s3r/nn/moe.hpp).
  bool moe = false;
};

const FamilyTraits& traits(Family f);
// The family named `name`; throws s3r::Error listing the names otherwise.
Family parse_family(std::string_view name);
std::string family_names();  // "llama, qwen3"

// The decoder's architecture: Llama-style blocks (s3r/model/model.hpp) with the additions of its
// family; the parameter schema (s3r/model/params.hpp) is a function of it alone.
struct Architecture {
  int64_t layers = 2;       // L
  int64_t width = 64;       // C
  int64_t heads = 4;        // NH query heads
  int64_t kv_heads = 4;     // NKV key/value heads, dividing NH; NKV < NH: grouped-query attention
  int64_t ffn_width = 192;  // F (with experts: one expert's)
  int64_t vocab = 256;      // V
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  // HD, the size of one attention head (even, for RoPE); 0: C / NH (which NH must then divide).
  // An explicit size equal to C / NH is stored as 0 (normalized()), so that equal shapes compare
  // equal.
  int64_t head_size = 0;
  Family family = Family::kLlama;  // what the blocks add to Llama's (traits())
  // W, the sliding window of the family's local layers (traits().local_period): their query i
  // attends to keys i - W < j <= i; 0: no window (every layer attends to all earlier keys).
  int64_t window = 0;
  // E experts and k of them per token in a family with a mixture of experts (traits().moe); 0
  // otherwise.
  int64_t experts = 0;
  int64_t experts_used = 0;

  int64_t head_dim() const { return head_size != 0 ? head_size : width / heads; }  // HD
  int64_t q_width() const { return heads * head_dim(); }       // columns of Q and of attention's output: NH HD
  int64_t kv_width() const { return kv_heads * head_dim(); }  // columns of K and V: NKV HD
  // This architecture with head_size 0 where it equals C / NH.
  Architecture normalized() const;
  const FamilyTraits& traits() const { return model::traits(family); }
  // Layer l attends through the sliding window (a local layer of a family that has them, W > 0).
  bool is_local(int64_t l) const {
    return window > 0 && traits().local_period > 0 && (l + 1) % traits().local_period != 0;
  }
  int64_t window_of(int64_t l) const { return is_local(l) ? window : 0; }  // for flash attention
  float rope_theta_of(int64_t l) const { return is_local(l) ? traits().rope_theta_local : rope_theta; }
  // Throws s3r::Error naming the first invalid field (e.g. C not divisible by heads).
  void validate() const;
  // "L=2 C=64 heads=4 F=192 V=256" ("heads=4/kv=2" with GQA, " hd=32" with an explicit head size)
  std::string describe() const;
  friend bool operator==(const Architecture&, const Architecture&) = default;
};

// The shape of one training step's batch on this process.
struct RunShape {
  int64_t seq_len = 32;  // S
  int64_t batch = 4;     // B
  int64_t tokens() const { return batch * seq_len; }  // T
  friend bool operator==(const RunShape&, const RunShape&) = default;
};

// An architecture with the batch shape a model is built for. The numerics (projections,
// correction, LM head) are a separate value: nn::Recipe.
struct ModelConfig : Architecture, RunShape {
  const Architecture& architecture() const { return *this; }
  const RunShape& shape() const { return *this; }
  // Both parts, and their sizes together (tensors of T x max(C, F, V), parameters, attention)
  // within what any machine holds; throws s3r::Error naming the first problem.
  void validate() const;
  std::string describe() const;  // the architecture's line, then " S=32 B=4"
  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// "tiny" (tests; seconds), "small" (the default main job), "wide" (4 blocks of C = 1024, F = 4096,
// the FFN shape W2 of the paper's Table III: GEMM-bound, for `s3r bench step`), "paper" (the
// paper's 12-layer decoder), of a family. Llama's presets have kv_heads = heads; Qwen3's keep
// Qwen3's ratios at these widths (kv_heads = heads / 2, a head size of 2 C / heads, its RoPE
// base 1e6 and norm eps 1e-6); Gemma 3's have kv_heads = heads / 2, a window of S / 2 for its
// local layers (five of every six), RoPE bases 1e4 (local) and 1e6 (global), norm eps 1e-6.
// Qwen3-MoE's are Qwen3's with Qwen3-30B-A3B's expert width 0.375 C and E = 8 (tiny, wide) or
// 32 (small, paper) experts, k = 2 of them per token.
ModelConfig preset(std::string_view name, Family family = Family::kLlama);

}  // namespace s3r::model
