#pragma once
// The parameter schema: every tensor of a model with its name, shape and role, listed once by
// the model (Model::param_table()). Everything that needs to know what a parameter is reads it
// from here rather than from its name: checkpoints (shapes), the optimizer (weight decay), data
// parallelism (which gradients an int8 projection reduces itself), export (each format's names
// and orientation), and the gradient diagnostics (threshold layers).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace s3r::model {

// What a parameter is for.
enum class ParamRole {
  kEmbedding,   // token embedding (V, C)
  kNorm,        // an RMSNorm gain (C)
  kProjection,  // one of a block's quantized projections (in, out)
  kHead,        // the LM head (C, V): bf16 (f32 in f32), or int8 with a /head-int8 recipe
  kRouter,      // a mixture of experts' router (C, E): f32 (SPEC A.10)
};

// A block's quantized projections, in the order of their threshold layers (SPEC section 3):
// projection p of block l draws its thresholds as layer kProjectionsPerBlock l + p, and an int8
// LM head as layer kProjectionsPerBlock L.
enum class Projection : uint32_t { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr uint32_t kProjectionsPerBlock = 7;
constexpr uint32_t layer_index(int64_t block, Projection p) {
  return kProjectionsPerBlock * static_cast<uint32_t>(block) + static_cast<uint32_t>(p);
}
constexpr uint32_t head_layer_index(int64_t layers) { return kProjectionsPerBlock * static_cast<uint32_t>(layers); }
// The projection's part of a parameter name: "attn.q", "attn.k", "attn.v", "attn.o", "ffn.gate",
// "ffn.up", "ffn.down".
std::string_view to_string(Projection p);

struct ParamInfo {
  std::string name;            // "tok_emb", "blocks.L.attn.q", ..., "final_norm", "lm_head"
  std::string local;           // the name inside its block ("attn_norm", "attn.q", ...); = name outside
  int64_t offset = 0;          // into Model::params() / grads()
  int64_t size = 0;            // the product of shape
  std::vector<int64_t> shape;  // row-major; matrices are (in, out): y = x W; experts' (E, in, out)
  ParamRole role = ParamRole::kNorm;
  int64_t block = -1;          // the block it belongs to; -1 outside the blocks
  Projection projection{};     // role kProjection only
  bool decay = true;           // AdamW weight decay: matrices (projections, head, router), not gains or the embedding
  // The tied LM head (a family with tied_head): its values are the embedding transposed, written
  // by every forward; its gradient, once the step's is complete, is added into the embedding's
  // (Model::fold_tied_head) and cleared. Not saved in checkpoints, not updated by the optimizer.
  bool tied = false;
};

}  // namespace s3r::model
