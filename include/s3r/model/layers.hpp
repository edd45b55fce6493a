#pragma once
// The non-GEMM layers of a Llama-style decoder, f32, llm.c style: each layer
// is a *_forward / *_backward pair over explicit buffers, outputs first. Backward functions
// ACCUMULATE (+=) into parameter gradients and into input gradients marked "+=", so that
// residual branches and shared inputs add up without extra buffers.
//
// Shapes: T = B*S tokens, C model width, NH heads of size HD = C / NH, V vocabulary.
// Activations are row-major (T, C); head h of token t occupies columns [h*HD, (h+1)*HD).
#include <cstdint>
#include <span>
#include <vector>

namespace s3r::model {

// embedding_backward's buffers, reused across calls: the tokens grouped by table row.
struct LeafScratch {
  std::vector<int64_t> order;       // token indices sorted by (row, index)
  std::vector<int64_t> run_starts;  // where each row's run of `order` starts, then T
};

// ---- element-wise helpers of the families' additions (Gemma: embedding scale, tied head) -----
// x *= s, element by element (threaded; each element one f32 multiply).
void scale_in_place(std::span<float> x, float s);
// dst (cols, rows) = src (rows, cols) transposed.
void transpose_into(float* dst, const float* src, int64_t rows, int64_t cols);
// dst (cols, rows) += src (rows, cols) transposed, one f32 add per element.
void add_transposed(float* dst, const float* src, int64_t rows, int64_t cols);

// ---- embedding: out[t, :] = table[tokens[t], :] -------------------------------------------
// out (T, C); tokens (T) in [0, V); table (V, C). Throws s3r::Error naming a token out of range.
void embedding_forward(std::span<float> out, std::span<const int32_t> tokens,
                       std::span<const float> table, int64_t vocab, int64_t width);
// dtable (V, C) += scatter of dout (T, C). With leaves > 1 (data parallel, s3r/dist/tree_sum.hpp)
// each leaf's scatter (tokens [l T/leaves, (l+1) T/leaves), each element from +0 in token order)
// is formed apart and the leaf partials are added in the fixed tree before they are added into
// dtable; `scratch` is reused. Only the rows some token names are formed (at most T, not V, per
// leaf): a row no token names would get +0 + ... + +0 = +0 added, which is left out, so such
// rows keep their value (a -0 among them stays -0). Throws s3r::Error naming a token outside
// [0, V) when leaves > 1.
void embedding_backward(std::span<float> dtable, std::span<const float> dout,
                        std::span<const int32_t> tokens, int64_t width, int64_t leaves = 1,
                        LeafScratch* scratch = nullptr);

// ---- RMSNorm: out = in * rstd * weight, rstd = 1 / sqrt(mean(in^2) + eps) ------------------
// out (T, C); rstd (T) saved for the backward; in (T, C); weight (C).
void rmsnorm_forward(std::span<float> out, std::span<float> rstd, std::span<const float> in,
                     std::span<const float> weight, int64_t width, float eps);
// din (T, C) +=; dweight (C) += its sum over tokens: per reduction leaf (tokens [l T/leaves,
// (l+1) T/leaves), in double, in token order), rounded to f32, leaf partials added in the fixed
// tree (s3r/dist/tree_sum.hpp).
void rmsnorm_backward(std::span<float> din, std::span<float> dweight, std::span<const float> dout,
                      std::span<const float> in, std::span<const float> weight,
                      std::span<const float> rstd, int64_t width, int64_t leaves = 1);

// ---- RoPE (rotary position embedding), in place on q or k (T, C) ---------------------------
// Pair i of a head (elements 2i, 2i+1) at position s = t % S rotates by s * theta^(-2i/HD).
// The backward rotates the gradient by the opposite angle (the rotation is orthogonal).
void rope_forward(std::span<float> x, int64_t seq_len, int64_t heads, int64_t head_dim,
                  float theta);
void rope_backward(std::span<float> dx, int64_t seq_len, int64_t heads, int64_t head_dim,
                   float theta);

// ---- causal multi-head attention ------------------------------------------------------------
// out (T, C) = softmax(q k^T / sqrt(HD), causal within each example) v, per head.
// probs (B, NH, S, S) saved for the backward (entries above the diagonal are 0).
void attention_forward(std::span<float> out, std::span<float> probs, std::span<const float> q,
                       std::span<const float> k, std::span<const float> v, int64_t seq_len,
                       int64_t heads, int64_t head_dim);
// dq, dk, dv (T, C) overwritten.
void attention_backward(std::span<float> dq, std::span<float> dk, std::span<float> dv,
                        std::span<const float> dout, std::span<const float> q,
                        std::span<const float> k, std::span<const float> v,
                        std::span<const float> probs, int64_t seq_len, int64_t heads,
                        int64_t head_dim);

// ---- mean cross-entropy over T tokens, fused with its gradient (training) --------------------
// Returns mean_t -log softmax(logits[t])[targets[t]] and overwrites logits (T, V) with its
// gradient (softmax - onehot(targets)) / T: no probabilities tensor, one pass per row with a
// vectorized polynomial exp (kernels::softmax_xent_rows, bit-identical in every tier and for any
// thread count). A row holding a NaN or Inf makes the loss NaN and its gradient row NaN.
// Agrees with cross_entropy_forward / cross_entropy_backward below (which use std::exp in
// double) to about 1e-6 relative (tests/model/layers_test.cpp).
double cross_entropy_fused(std::span<float> logits, std::span<const int32_t> targets, int64_t vocab);
// The same with the gradient scaled by grad_scale (1 / the tokens of the whole data-parallel
// step) and the loss returned as leaf_loss[l] = sum of the token losses of leaf l (tokens
// [l T/L, (l+1) T/L), L = leaf_loss.size(), in token order, in double). A non-finite row makes
// its leaf's sum NaN.
void cross_entropy_fused(std::span<float> logits, std::span<const int32_t> targets, int64_t vocab,
                         float grad_scale, std::span<double> leaf_loss);

// ---- mean cross-entropy over T tokens (double reference of the fused one) -----------------
// Returns mean_t -log softmax(logits[t])[targets[t]]; probs (T, V) saved (softmax).
double cross_entropy_forward(std::span<float> probs, std::span<const float> logits,
                             std::span<const int32_t> targets, int64_t vocab);
// dlogits (T, V) = (probs - onehot(targets)) / T, overwritten.
void cross_entropy_backward(std::span<float> dlogits, std::span<const float> probs,
                            std::span<const int32_t> targets, int64_t vocab);

}  // namespace s3r::model
