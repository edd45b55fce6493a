#pragma once
// Fused causal multi-head and grouped-query attention ("flash attention"): the same function as
// attention_forward / attention_backward of layers.hpp (on k, v repeated over each group of query
// heads), without the (B, NH, S, S) probabilities.
//
// Shapes and layout as in layers.hpp: T = B*S tokens, C = NH * HD; q, out and their gradients
// are row-major (T, C), head h of token t in columns [h*HD, (h+1)*HD); examples are contiguous
// blocks of S tokens and attend causally within themselves only.
// Grouped-query attention: k, v, dk, dv are (T, Ckv), Ckv = NKV * HD, with NKV = kv_heads
// dividing NH; query head h reads kv head h / G, G = NH / NKV (consecutive query heads share a
// kv head: Hugging Face's repeat_kv, llama.cpp's GQA). NKV = NH is multi-head attention. A kv
// head's dk, dv sum its G query heads' contributions in f32 in head order, each head's computed
// whole first: dk = ((dk_h0 + dk_h1) + dk_h2) + ... (likewise dv; G = 1 writes them directly).
//
// Numerics (kernels/attention_kernels.hpp has the exact operation order): f32 throughout, with
// fused multiply-adds in fixed orders; queries and keys in blocks of 32, key blocks above the
// diagonal skipped, an online softmax (running maximum and sum, rescaled per key block); exp is
// the Cephes-style polynomial of kernels/ref/numerics.hpp (relative error <= 2^-21, i.e. at most
// 8 ulp, tests/nn/elementwise_test.cpp; arguments below -87 clamped, so a probability below
// e^-87 = 1.6e-38 comes out as 1.6e-38); masked (future) keys get probability exactly 0, never
// through exp. The log of the sum and the backward's D_i = dout_i . out_i are formed in double.
// Results are bit-identical for any thread count and across the reference, AVX2 and AVX-512
// kernel tiers (the active tier: s3r/core/isa.hpp). Against the two-pass f32 attention of
// layers.hpp they differ by f32 rounding: at most a few 1e-7 of the largest value in the tests
// (tests/model/attention_test.cpp, MatchesTwoPassAttention), well inside first-order error bounds
// computed from the data. Saved for the backward: lse, B*NH*S floats, instead of the two-pass
// attention's (B, NH, S, S) probabilities.
//
// Sliding window (Gemma's local layers): with window W >= 1, query i attends to keys
// i - W < j <= i only (W >= S: the same as none); key blocks wholly outside every row's window are
// not visited. window = 0: causal attention over all earlier keys.
//
// Threads: OpenMP inside each call; the forward over (example, head, query block), the backward
// over (example, kv head). Each thread keeps one scratch buffer, grown once (O(S HD) floats).
// Outputs must not alias inputs. Sizes are checked: a wrong one is an s3r::Error naming the
// function, the tensor, its size and the expected size; so is kv_heads < 1 or not dividing heads.
#include <cstdint>
#include <span>

namespace s3r::model {

// out (T, C) = causal softmax(q k^T / sqrt(HD)) v per (example, query head, with its kv head),
// overwritten; lse (B, NH, S) = log sum_{j <= i} exp(q_i . k_j / sqrt(HD)) of each query row i
// (f32), saved for the backward, overwritten. q (T, C); k, v (T, Ckv).
void flash_attention_forward(std::span<float> out, std::span<float> lse, std::span<const float> q,
                             std::span<const float> k, std::span<const float> v, int64_t seq_len,
                             int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t window = 0);

// dq (T, C), dk, dv (T, Ckv) overwritten (not accumulated), from dout (T, C) and the forward's
// out (T, C) and lse (B, NH, S): probabilities recomputed block by block as P = exp(s - lse),
// D_i = dout_i . out_i, dS = P (dP - D) / sqrt(HD); dk, dv summed over each kv head's group as
// above.
void flash_attention_backward(std::span<float> dq, std::span<float> dk, std::span<float> dv,
                              std::span<const float> dout, std::span<const float> out,
                              std::span<const float> q, std::span<const float> k,
                              std::span<const float> v, std::span<const float> lse, int64_t seq_len,
                              int64_t heads, int64_t kv_heads, int64_t head_dim,
                              int64_t window = 0);

}  // namespace s3r::model
