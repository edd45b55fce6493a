#pragma once
// Internal: one block's parameters and saved activations (s3r/model/model.hpp), shared by the
// passes of model.cpp and model_moe.cpp.
#include <cstdint>
#include <string>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/model/model.hpp"
#include "s3r/nn/moe.hpp"

namespace s3r::model {

// Per-block parameters (offsets into the arenas) and saved activations. Cq = NH HD: the width of
// Q and of the attention's output (C unless the head size is explicit); Ckv = NKV HD: the width
// of K and V (Cq without grouped-query attention).
struct Model::Block {
  int64_t attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
  int64_t q_norm = -1, k_norm = -1;      // QK-norm gains (HD each), when the family has them
  int64_t attn_post = -1, ffn_post = -1;  // post-norm gains (C each), when the family has them
  int64_t router = -1;                    // a mixture of experts' router (C, E), when the family has one;
                                          // then w_gate, w_up, w_down are the experts' (E, C, F), (E, F, C)
  float rope_theta = 0;                  // this layer's RoPE base (local layers: their own)
  int64_t window = 0;                    // this layer's sliding window (0: none)
  std::string prefix;                    // "blocks.l.": names of quantized operands in errors
  AlignedVector<float> x_in;               // (T, C) residual stream entering the block
  AlignedVector<float> xn1, rstd1;         // attention RMSNorm
  AlignedVector<float> q, att;             // (T, Cq)
  AlignedVector<float> k, v;               // (T, Ckv)
  AlignedVector<float> q_raw, k_raw;       // QK-norm: q (T, Cq) and k (T, Ckv) before their norms
  AlignedVector<float> q_rstd, k_rstd;     // QK-norm: (T NH), (T NKV)
  AlignedVector<float> lse;                // (B, NH, S): the fused attention's log-sum-exp
  AlignedVector<float> x_mid, xn2, rstd2;  // after the attention residual; FFN RMSNorm
  AlignedVector<float> o_raw, rstd_o;      // post-norms: attention output (T, C) before its norm
  AlignedVector<float> f_raw, rstd_f;      // post-norms: FFN output (T, C) before its norm
  nn::LinearInput qkv_in, o_in;
  nn::LinearWeight wq_w, wk_w, wv_w, wo_w;
  nn::SwigluState ffn;
  nn::MoeState moe;  // with a mixture of experts, in place of ffn
  AlignedVector<float> x_in_grad;  // dL/d(x_in), kept when capture_input_grads_ (diagnostics)
};

}  // namespace s3r::model
