#pragma once
// QuantLinear: Y = X W in any LinearMode, with the S3R-EC correction in the backward pass
// (SPEC sections 1-4). A llm.c-style pair of functions over explicit buffers:
//
//   prepare_input(xin, X)        quantize (or convert) X once; several layers that read the same
//                                X (Q, K, V; gate and up) share one LinearInput
//   prepare_weight(win, W)       quantize (or convert) W; also rowsum(Wq) for the correction
//   linear_forward(Y, xin, win)
//   linear_backward(dX, dW, G, xin, win, config, workspace)
//
// Shapes: X (T, K) f32 row-major, W (K, N), Y and G (T, N), dX (T, K), dW (K, N); T = B*S.
// Int8 modes: Y = sx sw (Xq Wq); G is quantized once by s3r::quantize_gradient (twice under sr);
//   dX = D/sx * (Q Wq^T) - correction, dW = D/sw * (Xq^T Q) - correction (two-way only).
// The correction never forms Estr: dX's term is (Wq a_b + (c - m) rowsum(Wq)) / sx, from a
// (B x N) by (N x K) matrix-vector product and the statistics of the quantizer; dW's term is the
// rank-(B+1) product (u_b a_b + v_b) / sw with u_b = Xq_b^T 1 and v_b = Xq_b^T (c_b - m_b).
// Buffers live in the structs and are reused across calls (no per-step allocation once sized).
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/bf16.hpp"
#include "s3r/core/work.hpp"
#include "s3r/dist/communicator.hpp"
#include "s3r/nn/backward_probe.hpp"
#include "s3r/nn/linear_mode.hpp"
#include "s3r/quant/grad_quant.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r::nn {

// The forward operand X as the layer's products read it, kept for the backward pass.
struct LinearInput {
  LinearMode mode = LinearMode::kS3r;
  int64_t tokens = 0;            // T
  int64_t features = 0;          // K
  AlignedVector<int8_t> codes;   // (T, K) int8 modes: Xq (64-byte aligned: read in place by AMX)
  AlignedVector<float> scales;     // (T)    int8 modes: sx
  std::vector<bf16> bf16_values; // (T, K) bf16 mode with native bf16 products (else empty)
  AlignedVector<float> f32_values; // (T, K) f32 mode; bf16 mode with f32-emulated bf16 products:
                                 // X rounded to bf16 and widened back (exact), read by products
  int64_t row_phase = 0;         // float modes: the rows' place in the products' tile grid (Y and
                                 // dX; gemm::MatmulShape::row_phase), kept by prepare_input
};

// The weight as the layer's products read it.
struct LinearWeight {
  LinearMode mode = LinearMode::kS3r;
  int64_t in = 0;                 // K
  int64_t out = 0;                // N
  AlignedVector<int8_t> codes;    // (K, N) int8 modes: Wq
  AlignedVector<float> scales;      // (N)    int8 modes: sw
  AlignedVector<float> code_row_sums;  // (K) int8 modes: rowsum(Wq)[k] = sum_n Wq[k, n] (exact)
  std::vector<bf16> bf16_values;  // (K, N) bf16 mode with native bf16 products (else empty)
  AlignedVector<float> f32_values;  // (K, N) f32 mode; bf16 mode with f32-emulated bf16 products:
                                  // W rounded to bf16 and widened back (exact), read by products
};

// Where a call's T tokens sit in a data-parallel step (SPEC section 6; s3r/dist/tree_sum.hpp).
struct BatchPlacement {
  // The ranks that hold the rest of this batch: D is their max, the int8 dW sums are added over
  // them exactly in int32, and S3R-EC's dW factors are gathered from them, so the int8 modes'
  // dW comes out reduced over the group. nullptr: this process holds the whole batch.
  dist::Communicator* group = nullptr;
  uint64_t first_token = 0;  // global index of token 0 (a multiple of S)
  // Reduction leaves in these T tokens (T / S divisible by it): the float modes' dW is formed per
  // leaf and the partials added in the fixed tree; it is this process's partial of the group's
  // sum, to be completed with Communicator::tree_sum by the caller.
  int64_t leaves = 1;
  // Non-empty: the rows are a mixture of experts' rows of one expert (s3r/quant/grad_quant.hpp:
  // RaggedRows), not T / S examples of S tokens; its examples replace those of S tokens in the
  // thresholds, S3R-EC's statistics and the reduction leaves (leaves divide its example count).
  RaggedRows ragged{};
};

struct LinearBackwardConfig {
  Correction correction = Correction::kNone;
  int64_t tokens_per_example = 0;  // S (T must be a multiple)
  Key layer_key{};                 // fold_in(fold_in(key(seed), step), layer_index)
  bool accumulate_dx = false;      // dX += ... (layers sharing one input); else dX = ...
  int64_t layer_index = -1;        // the layer's index (telemetry of a BackwardProbe); -1: none
  BatchPlacement placement{};
  // dW written as its transpose (N, K), the (out, in) layout of PyTorch's nn.Linear, straight
  // from the product (dW^T = D/sw * (Q^T Xq): the same bits as transposing dW). Only where
  // dw_transposable says so; linear_backward throws otherwise.
  bool dw_transposed = false;
  // The quantizer's pass 1 over G, already taken by G's writer (s3r/quant/grad_quant.hpp:
  // GradAbsMax, over every row of G with this layer's sx and sw), or nullptr. int8 modes only.
  const GradAbsMax* g_absmax = nullptr;
};

// Whether linear_backward can write dW transposed (config.dw_transposed): the int8 modes on one
// process (no placement.group of over one rank) without the two-way correction, whose dW is one scaled product.
bool dw_transposable(LinearMode mode, const LinearBackwardConfig& config);

// Wall-clock milliseconds and work (s3r/core/work.hpp) per phase, accumulated while a PhaseTimes
// is attached (benchmarks).
struct PhaseTimes {
  work::Phase prepare;        // quantizing / converting activations and weights
  work::Phase gemm;           // matrix products, with their fused dequantization epilogues
  work::Phase quantize_grad;  // quantizing gradients (and their statistics)
  work::Phase correction;     // S3R-EC terms (matrix-vector products, dW's rank-(B+1) product)
  work::Phase elementwise;    // activations and their derivatives
  work::Phase routing;        // a mixture of experts' router, sort, gathers and combines (moe.hpp)
  PhaseTimes& operator+=(const PhaseTimes& o) {
    prepare += o.prepare;
    gemm += o.gemm;
    quantize_grad += o.quantize_grad;
    correction += o.correction;
    elementwise += o.elementwise;
    routing += o.routing;
    return *this;
  }
};

// Scratch of linear_backward, reused across calls and layers of equal shape.
struct LinearWorkspace {
  PhaseTimes* times = nullptr;        // when set, linear_backward adds its phase times here
  const BackwardProbe* probe = nullptr;  // diagnostics only (s3r/nn/backward_probe.hpp)
  QuantizedGrad grad;                 // codes, D and statistics of G
  std::vector<int32_t> acc;           // (T, K) int32 accumulators of the dX product
  AlignedVector<float> col_scale;       // (N) D / sw
  AlignedVector<float> wa;              // (B, K) Wq a_b
  AlignedVector<float> delta;           // (T) c[t] - m[b]
  AlignedVector<float> u_local;         // (2 B, K) this process's u_b (rows 0..B-1) and v_b (B..2B-1)
  AlignedVector<float> u_all;           // (2 Bg, K) every rank's u_b and v_b (Bg: the group's examples)
  AlignedVector<float> u;               // (Bg + 1, K) dW correction left factor
  AlignedVector<float> a_all;           // (Bg, N) every rank's channel means a_b
  AlignedVector<float> a_scaled;        // (Bg + 1, N) dW correction right factor
  std::vector<int32_t> dw_acc;        // (K, N) int32 dW sums, added over a group of ranks
  std::vector<AlignedVector<float>> tree_scratch;  // float dW: one (K, N) per leaf-tree level
  QuantizedGrad grad_dw;              // probe->dw_rounding: the second quantization, for dW
  AlignedVector<float> x_dequant, w_dequant;  // probe->exact_grad: sx Xq (T, K) and sw Wq (K, N)
};

// `name` names the tensor in error messages (e.g. "blocks.3.ffn.gate.X").
void prepare_input(LinearInput& out, std::span<const float> x, int64_t tokens, int64_t features,
                   LinearMode mode, std::string_view name);
void prepare_weight(LinearWeight& out, std::span<const float> w, int64_t in, int64_t out_features,
                    LinearMode mode, std::string_view name);
// prepare_weight for W given as its transpose: wt (N, K) row-major, the (out, in) layout of
// PyTorch's nn.Linear. The same LinearWeight, bit for bit, as prepare_weight of wt^T: wt's rows
// (one output channel each) are quantized and the int8 codes transposed, a quarter of the bytes
// of transposing the floats. Int8 modes only (s3r::Error otherwise: transpose the floats and call
// prepare_weight).
void prepare_weight_transposed(LinearWeight& out, std::span<const float> wt, int64_t in, int64_t out_features,
                               LinearMode mode, std::string_view name);

// y: (T, N), overwritten.
void linear_forward(std::span<float> y, const LinearInput& x, const LinearWeight& w);

// dx: (T, K) or empty (no dX wanted); dw: (K, N) ((N, K) with config.dw_transposed), overwritten.
// g: (T, N).
// Throws NonFiniteGradient on NaN/Inf in G (int8 modes), s3r::Error on mismatched shapes.
void linear_backward(std::span<float> dx, std::span<float> dw, std::span<const float> g,
                     const LinearInput& x, const LinearWeight& w, const LinearBackwardConfig& config,
                     LinearWorkspace& ws);

// The backward of a layer that has no rows on this process (a mixture of experts' expert that no
// token of this rank chose; config.placement.ragged with examples of no rows): in an int8 mode
// over a group, it takes part in the group's collectives as linear_backward does on the other
// ranks (D's max, the int32 dW sum, two-way's factors) and writes the same dW they do; otherwise
// dW = 0 (this process's partial).
void linear_backward_without_rows(std::span<float> dw, const LinearWeight& w, const LinearBackwardConfig& config,
                                  LinearWorkspace& ws);

}  // namespace s3r::nn
