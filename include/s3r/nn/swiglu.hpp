#pragma once
// Gated feed-forward block: Y = (act(X W1) * (X W3)) W2, forward and backward in any LinearMode;
// act = silu (SwiGLU: Llama, Qwen3) or GELU's tanh form (GeGLU: Gemma).
//
//   X (T, C), W1 = gate (C, F), W3 = up (C, F), W2 = down (F, C), Y (T, C); silu(z) = z sigmoid(z),
//   gelu(z) = 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))) (kernels/kernels.hpp: geglu_*).
// X is quantized once for W1 and W3 (one LinearInput); the hidden activation is quantized for W2.
// Layer keys (SPEC section 3): gate, up and down are layers first_layer, first_layer + 1 and
// first_layer + 2, with layer keys fold_in(step_key, index); step_key = fold_in(key(seed), step).
#include <cstdint>
#include <span>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/nn/quant_linear.hpp"

namespace s3r::nn {

enum class GatedActivation : uint8_t { kSilu, kGeluTanh };

struct SwigluWeights {
  std::span<const float> gate;  // W1 (C, F)
  std::span<const float> up;    // W3 (C, F)
  std::span<const float> down;  // W2 (F, C)
};

struct SwigluGrads {
  std::span<float> gate;  // dW1 (C, F)
  std::span<float> up;    // dW3 (C, F)
  std::span<float> down;  // dW2 (F, C)
};

// What one block saves in its forward for its backward.
struct SwigluState {
  LinearMode mode = LinearMode::kS3r;
  GatedActivation activation = GatedActivation::kSilu;
  int64_t tokens = 0, width = 0, ffn_width = 0;  // T, C, F
  LinearInput x_in, hidden_in;
  LinearWeight gate_w, up_w, down_w;
  AlignedVector<float> h1, h3;    // (T, F): X W1, X W3
  PhaseTimes* times = nullptr;  // when set, forward and backward add their phase times here
};

// Buffers that live only inside one forward or backward call: their contents are dead between
// calls, so one scratch may serve every block of a model (blocks run one at a time), which keeps
// a model's memory at one block's worth of them instead of one per block.
struct SwigluScratch {
  AlignedVector<float> hidden;              // (T, F) silu(h1) * h3, before hidden_in is prepared
  AlignedVector<float> d_hidden, dh1, dh3;  // (T, F)
  LinearWorkspace ws;
};

// y: (T, C). Throws s3r::Error on mismatched sizes or non-finite inputs (naming the tensor).
// row_phase: the rows' place in the float products' tile grid (LinearInput::row_phase; a
// mixture of experts' rows on one rank of several), for the forward and the backward's dX.
void swiglu_forward(std::span<float> y, std::span<const float> x, const SwigluWeights& w,
                    int64_t tokens, int64_t width, int64_t ffn_width, LinearMode mode,
                    SwigluState& state, SwigluScratch& scratch,
                    GatedActivation activation = GatedActivation::kSilu, int64_t row_phase = 0);

// dx: (T, C), overwritten (or empty: not wanted). grads are overwritten. `placement`: where the
// batch sits in a data-parallel step (quant_linear.hpp), for its three projections.
void swiglu_backward(std::span<float> dx, const SwigluGrads& grads, std::span<const float> dy,
                     Correction correction, int64_t tokens_per_example, Key step_key,
                     uint32_t first_layer, SwigluState& state, SwigluScratch& scratch,
                     const BatchPlacement& placement = {});

}  // namespace s3r::nn
