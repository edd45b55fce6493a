#pragma once
// Mixture-of-experts feed-forward block (Qwen3-MoE's `Qwen3MoeSparseMoeBlock`): a router and E
// SwiGLU experts, each token sent to its k most probable experts, no shared expert, no token
// dropping. docs/SPEC.md A.10 is the contract; in short:
//
//   logits = X Wr (f32),  p = softmax(logits),  the top k of p (ties: the lower expert first),
//   weights w_j = p_j / sum of the k chosen (f32),  Y[t] = sum_j w_j expert_{e_j}(X[t]) (f32, j in order).
//
//   X (T, C), Wr (C, E), gate and up (E, C, F), down (E, F, C), Y (T, C); F is one expert's width.
// Rows: (token t, slot j) is row r = t k + j. The rows are sorted by expert with a stable sort;
// expert e's rows are one group, and its three projections are one QuantLinear each over that
// group (swiglu.hpp), in the recipe's mode. Their thresholds are keyed on the row's global id
// first_token k + r, its place in the unsorted order, so a token's thresholds do not depend on how
// the other tokens were routed or on the ranks; the layer keys are those of the dense FFN (gate,
// up, down: first_layer, + 1, + 2), shared by the experts. D is one per expert projection (what
// one GEMM contracts). S3R-EC's examples are, per expert, the rows of each example (ragged; SPEC
// A.10).
// Losses: the Switch load-balancing loss per example, aux = E sum_e f_e P_e with f_e = (rows of
// the example routed to e) / S and P_e the mean of p_e over its S tokens, times --moe-aux-loss and
// averaged over the step's examples; the router z-loss, the mean over tokens of logsumexp(logits)^2
// times --moe-z-loss. Their gradients flow into the router; their values are reported, not added to
// the cross-entropy.
#include <cstdint>
#include <span>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/nn/quant_linear.hpp"
#include "s3r/nn/swiglu.hpp"

namespace s3r::nn {

struct MoeShape {
  int64_t tokens = 0;              // T
  int64_t width = 0;               // C
  int64_t expert_width = 0;        // F
  int64_t experts = 0;             // E
  int64_t top_k = 0;               // k
  int64_t tokens_per_example = 0;  // S (T a multiple)
};

struct MoeLossWeights {
  float aux = 0.0f;     // the load-balancing loss's coefficient
  float z_loss = 0.0f;  // the router z-loss's coefficient
};

struct MoeWeights {
  std::span<const float> router;  // Wr (C, E)
  std::span<const float> gate;    // (E, C, F)
  std::span<const float> up;      // (E, C, F)
  std::span<const float> down;    // (E, F, C)
};

struct MoeGrads {
  std::span<float> router, gate, up, down;  // as MoeWeights; overwritten
};

// What one block saves in its forward for its backward.
struct MoeState {
  MoeShape shape;
  uint64_t first_token = 0;
  LinearInput router_in;
  LinearWeight router_w;
  AlignedVector<float> probs;                // (T, E) softmax of the router's logits
  AlignedVector<float> lse;                  // (T) logsumexp of the logits (z-loss)
  std::vector<int32_t> expert_of;          // (T, k) the chosen experts, in slot order
  AlignedVector<float> weight;               // (T, k) their renormalized weights
  std::vector<int64_t> expert_offsets;     // (E + 1) expert e's sorted rows [off[e], off[e + 1])
  std::vector<int64_t> position;           // (T k) row r's place in the sorted order
  std::vector<uint64_t> row_ids;           // (T k) sorted place -> global row id first_token k + r
  std::vector<int64_t> example_offsets;    // (E, B + 1) per expert, its rows of each example
  AlignedVector<float> x_sorted, y_sorted;   // (T k, C) the experts' inputs and outputs
  std::vector<SwigluState> experts;        // (E)
  double aux_loss = 0.0, z_loss = 0.0;     // this batch's sums (before the coefficients' means)
  std::vector<double> aux_per_example;     // (B) each example's load-balancing loss (aux_loss: their sum in order)
  PhaseTimes* times = nullptr;
  int64_t rows_of(int64_t e) const { return expert_offsets[e + 1] - expert_offsets[e]; }
};

// Buffers that live only inside one call (shared by every block of a model).
struct MoeScratch {
  SwigluScratch ffn;
  AlignedVector<float> dy_sorted, dx_sorted;  // (T k, C)
  AlignedVector<float> dlogits;               // (T, E)
  LinearWorkspace router_ws;
};

// y: (T, C), overwritten. first_token: the global index of token 0 (row ids). group: the ranks
// that hold the rest of the batch (nullptr: none); in the float modes each expert's products then
// start where its rows would in one process's (gemm::MatmulShape::row_phase), one all-gather of
// the rows per expert. Throws s3r::Error on mismatched sizes, k outside [1, E], or non-finite
// inputs (naming the tensor).
void moe_forward(std::span<float> y, std::span<const float> x, const MoeWeights& w, const MoeShape& shape,
                 LinearMode mode, uint64_t first_token, MoeState& state, MoeScratch& scratch,
                 dist::Communicator* group = nullptr);

// dx: (T, C), overwritten. loss_scale: what one token's loss is multiplied by in the objective
// (1 / the step's tokens), for the losses' gradients. `placement`: the batch's place in a
// data-parallel step; over a group every rank takes part in every expert's collectives (D, the
// int8 dW sums), rows or none (linear_backward_without_rows).
void moe_backward(std::span<float> dx, const MoeGrads& grads, std::span<const float> dy, Correction correction,
                  Key step_key, uint32_t first_layer, const MoeLossWeights& losses, float loss_scale,
                  MoeState& state, MoeScratch& scratch, const BatchPlacement& placement);

// Expert load of the last forward: rows per expert, min, max and coefficient of variation.
struct ExpertLoad {
  int64_t min = 0, max = 0;
  double cv = 0.0;
};
ExpertLoad expert_load(const MoeState& state);
ExpertLoad expert_load(std::span<const int64_t> rows_per_expert);

}  // namespace s3r::nn
