#pragma once
// Internal kernel interface. Every kernel exists once per tier with the same signature:
//   kernels::ref::NAME     (src/kernels/ref/)    plain scalar loops: the executable spec and the
//                                                fallback on any x86-64 CPU
//   kernels::avx2::NAME    (src/kernels/avx2/)   AVX2 + FMA intrinsics, own -m flags
//   kernels::avx512::NAME  (src/kernels/avx512/) AVX-512 F/BW/VL intrinsics, own -m flags
// and each tier folder has one table of them (TIER::table(), src/kernels/TIER/table_TIER.cpp);
// kernels/dispatch.cpp is the one place that chooses. A new tier (NEON, SVE, a GPU) is one
// folder, one table and one line there.
// Kernels are single-threaded over the range they are given; the drivers in src/rng and
// src/quant split the work into fixed blocks and thread over them with OpenMP, so results never
// depend on the thread count. Integer results are bit-exact between the tiers.
// This folder depends on nothing above it: only s3r/core and the constexpr definitions of the
// random bits, thresholds and rounding modes.
#include <cstdint>

#include "s3r/core/bf16.hpp"
#include "s3r/quant/grad_rounding.hpp"
#include "s3r/quant/thresholds.hpp"
#include "s3r/rng/philox.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r::kernels {

// The dX epilogue of an int8 linear layer (SPEC section 4): with inv = 1 / sx[t],
//   v = float(acc[t, k]) * (D * inv) - (wa[b * K + k] + delta[t] * rowsum[k]) * inv
// in this order of f32 operations (the correction term only when wa is set; b = t / S), then
// dx = v, or dx = dx + v when accumulating. gemm_s8_epilogue applies it to its blocks where the
// product's S8Epilogue carries one (the dX product with its dequantization fused).
struct DxTerms {
  float D = 0.0f;                  // the step of G's codes
  const float* sx = nullptr;       // (T) X's row scales
  const float* wa = nullptr;       // (B, K) Wq a_b of example b, or null
  const float* delta = nullptr;    // (T) c[t] - m[b]
  const float* rowsum = nullptr;   // (K) rowsum(Wq)
  int64_t S = 1;                   // rows per example
  int64_t K = 0;                   // wa's row length
  bool accumulate = false;
};

// One backward-quantizer problem (see s3r/quant/grad_quant.hpp for the numerics).
struct GradProblem {
  const float* g_f32 = nullptr;  // (T, N): exactly one of g_f32 / g_bf16 is set
  const bf16* g_bf16 = nullptr;
  const float* sx = nullptr;  // (T)
  const float* sw = nullptr;  // (N)
  int64_t tokens = 0;         // T
  int64_t channels = 0;       // N
  int64_t tokens_per_example = 0;  // S
  uint64_t first_token = 0;  // global index of row 0 (its rank's or micro-batch's offset; a multiple of S)
  // Rows that are not consecutive tokens (a mixture of experts' expert-sorted rows): the global
  // index of row t is row_ids[t] and its example's is row_ids[t] / ids_per_example. null: row t
  // is token first_token + t of example (first_token + t) / S.
  const uint64_t* row_ids = nullptr;
  uint64_t ids_per_example = 0;
  GradRounding mode = GradRounding::kS3r;
  int count = 1;     // quantizations (2 under sr)
  Key keys[2] = {};  // product keys fold_in(layer_key, p)

  // The index of row t's threshold (s3r), of its example's (s3r-bcast), and of element (t, 0)
  // of its bits (sr: t*N + n), in every tier.
  uint64_t row_id(int64_t t) const {
    return row_ids != nullptr ? row_ids[t] : first_token + static_cast<uint64_t>(t);
  }
  uint64_t example_id(int64_t t) const {
    return row_ids != nullptr ? row_ids[t] / ids_per_example
                              : (first_token + static_cast<uint64_t>(t)) / static_cast<uint64_t>(tokens_per_example);
  }
};

// One AdamW update (s3r/optim/adamw.hpp) of a range of elements: the state arrays and the step's
// scalars (one_minus_beta1 = 1 - beta1 and one_minus_beta2 = 1 - beta2 rounded to float once).
struct AdamWElements {
  float* w = nullptr;  // weights
  float* m = nullptr;  // first moments
  float* v = nullptr;  // second moments
  const float* g = nullptr;  // gradients
  float clip = 1.0f, beta1 = 0.0f, one_minus_beta1 = 1.0f, beta2 = 0.0f, one_minus_beta2 = 1.0f;
  float lr = 0.0f, bias1 = 1.0f, bias2 = 1.0f, eps = 0.0f, decay = 0.0f;
};

// Output of pass 2 for one block of rows [r0, r1) inside one example.
struct GradBlockOut {
  int8_t* codes[2] = {nullptr, nullptr};      // (T, N) each; rows r0..r1 are written
  float* row_sums[2] = {nullptr, nullptr};    // (T) each or null: sum_n (Q - x) of row t
  float* col_sums[2] = {nullptr, nullptr};    // (N) each or null: sum_{t in block} (Q - x)
};

#define S3R_DECLARE_KERNELS                                                                     \
  /* out[j] = random_bits32(key, first + j), j < n */                                           \
  void threefry_bits(Key key, uint64_t first, uint32_t* out, int64_t n);                        \
  /* out[j] = philox_bits32(key, first + j), j < n */                                           \
  void philox_bits(PhiloxKey key, uint64_t first, uint32_t* out, int64_t n);                    \
  /* Rows [r0, r1) of x (rows, cols): absmax scale and RTNE codes. Returns false (outputs      \
     unspecified) if a value is not finite. */                                                  \
  bool quantize_rows_rtne(int8_t* codes, float* scales, const float* x, int64_t r0, int64_t r1, \
                          int64_t cols);                                                        \
  /* colmax[c] = max over rows [r0, r1) of |w[r, c]| for c in [c0, c1). Returns false if a     \
     value is not finite. */                                                                    \
  bool absmax_cols(float* colmax, const float* w, int64_t r0, int64_t r1, int64_t cols,         \
                   int64_t c0, int64_t c1);                                                     \
  /* Rows [r0, r1): codes[r, c] = clamp(rne(w[r, c] / scales[c])). */                          \
  void quantize_cols_rtne(int8_t* codes, const float* w, const float* scales, int64_t r0,       \
                          int64_t r1, int64_t cols);                                            \
  /* Pass 1: max over rows [r0, r1) of |(sx[t] * G[t,n]) * sw[n]|; sets *nonfinite when a G    \
     value is NaN or Inf. */                                                                    \
  float grad_absmax(const GradProblem& p, int64_t r0, int64_t r1, bool* nonfinite);             \
  /* Pass 2: codes (and, where requested, error sums) of rows [r0, r1), one example's block;   \
     col_sums are overwritten (not accumulated). step > 0. */                                   \
  void grad_quantize(const GradProblem& p, float step, int64_t r0, int64_t r1,                  \
                     const GradBlockOut& out);                                                  \
  /* S3R-EC's matrix-vector products: out[b, k] = sum_n w[k, n] a[b, n] for rows k in [k0, k1);  \
     w (K, N) int8, a (B, N) f32, out (B, K) f32. */                                            \
  void gemv_s8_f32(float* out, const int8_t* w, const float* a, int64_t B, int64_t K,          \
                   int64_t N, int64_t k0, int64_t k1);                                          \
  /* dX epilogue of an int8 linear layer (DxTerms), rows [t0, t1) and columns [k0, k1) of dx  \
     (row stride ldx); acc[(t - t0) * ld_acc + (k - k0)] is the int32 sum of (t, k). */         \
  void dx_epilogue(float* dx, int64_t ldx, const int32_t* acc, int64_t ld_acc, int64_t t0,      \
                   int64_t t1, int64_t k0, int64_t k1, const DxTerms& d);                       \
  /* SwiGLU, elements [i0, i1): hidden = (h1 * sigmoid(h1)) * h3. */                            \
  void swiglu_forward_ew(float* hidden, const float* h1, const float* h3, int64_t i0,           \
                         int64_t i1);                                                           \
  /* SwiGLU backward, elements [i0, i1): with s = sigmoid(h1),                                   \
     dh3 = dh * (h1 * s),  dh1 = (dh * h3) * (s * (1 + h1 * (1 - s))). */                        \
  void swiglu_backward_ew(float* dh1, float* dh3, const float* dh, const float* h1,            \
                          const float* h3, int64_t i0, int64_t i1);                           \
  /* GeGLU (Gemma's FFN), elements [i0, i1): hidden = (h1 * s) * h3 with s, c as              \
     kernels/ref/numerics.hpp's gelu_gate(gelu_clamp(h1)): (h1 s) is GELU's tanh form. */       \
  void geglu_forward_ew(float* hidden, const float* h1, const float* h3, int64_t i0,            \
                        int64_t i1);                                                            \
  /* GeGLU backward, elements [i0, i1): dh3 = dh * (h1 * s), dh1 = (dh * h3) * gelu_slope(c, s). */ \
  void geglu_backward_ew(float* dh1, float* dh3, const float* dh, const float* h1,             \
                         const float* h3, int64_t i0, int64_t i1);                            \
  /* Softmax cross-entropy of rows [r0, r1) of z (rows, V), in place. Per row r, y = targets[r]: \
     m = max_i z[i]; e_i = exp_poly(z[i] - m); sum = double sum of the e_i in 16 interleaved     \
     partial sums (partial j adds i = j mod 16, i increasing; then partials 0..15 in order);    \
     loss[r] = (log(sum) + m) - z[y] in double; then z[i] = (e_i * float(1 / sum) - [i == y])   \
     * grad_scale, the gradient of grad_scale * loss. Returns false (the outputs of the block    \
     unspecified) if a z value is not finite. */                                                \
  bool softmax_xent_rows(float* z, double* loss, const int32_t* targets, int64_t r0,            \
                         int64_t r1, int64_t vocab, float grad_scale);                          \
  /* RMSNorm of rows [r0, r1) of x (rows, C): ss = sum_c x^2 in double in 16 interleaved        \
     partial sums (as softmax_xent_rows), rstd[r] = float(1 / sqrt(ss / C + eps)),              \
     out = (x * rstd) * weight in float. */                                                     \
  void rmsnorm_rows(float* out, float* rstd, const float* x, const float* weight, int64_t r0,   \
                    int64_t r1, int64_t width, float eps);                                      \
  /* RMSNorm's input gradient, rows [r0, r1): dot = sum_c (x * w) * dy in double (16 partials),  \
     k = r^3 dot / C with r = rstd[row] in double, dx += float((r * w) * dy - k * x). */         \
  void rmsnorm_backward_rows(float* dx, const float* dy, const float* x, const float* weight,  \
                             const float* rstd, int64_t r0, int64_t r1, int64_t width);         \
  /* Rows [r0, r1) of src (rows, cols; row stride lds) into columns [r0, r1) of dst (cols,      \
     rows; row stride ldd): dst[c * ldd + r] = src[r * lds + c] for c < cols. Nothing else of   \
     dst is written. A copy: the tiers agree byte for byte. */                                  \
  void transpose_s8(int8_t* dst, int64_t ldd, const int8_t* src, int64_t lds, int64_t r0,      \
                    int64_t r1, int64_t cols);                                                  \
  /* AdamW on elements [i0, i1), each on its own, in f32 without fused multiply-adds:           \
       g' = g * clip;  m' = beta1 * m + one_minus_beta1 * g';                                   \
       v' = beta2 * v + (one_minus_beta2 * g') * g';                                            \
       w' = (w - (lr * (m' / bias1)) / (sqrt(v' / bias2) + eps)) - decay * w.                   \
     Returns whether every w', m', v' is finite; writes them over w, m, v only when `write`.    \
     Every operation is correctly rounded, so the tiers agree bit for bit. */                   \
  bool adamw_update(const AdamWElements& e, int64_t i0, int64_t i1, bool write);             \
  /* Elements [i0, i1) of x rounded to bf16 as s3r/core/bf16.hpp's to_bf16 (nearest, ties to    \
     even; a NaN becomes a quiet NaN with its sign): out[i] = to_bf16(x[i]) where out is set,    \
     widened[i] = to_float(to_bf16(x[i])) where widened is set. Integer operations on the bits:  \
     the tiers agree bit for bit. */                                                            \
  void round_bf16(bf16* out, float* widened, const float* x, int64_t i0, int64_t i1);

struct KernelTable;

namespace ref {
S3R_DECLARE_KERNELS
const KernelTable& table();
}  // namespace ref
namespace avx2 {
S3R_DECLARE_KERNELS
const KernelTable& table();
}  // namespace avx2
namespace avx512 {
S3R_DECLARE_KERNELS
const KernelTable& table();
}  // namespace avx512
#undef S3R_DECLARE_KERNELS

// One tier's kernels, as function pointers.
struct KernelTable {
  decltype(&ref::threefry_bits) threefry_bits;
  decltype(&ref::philox_bits) philox_bits;
  decltype(&ref::quantize_rows_rtne) quantize_rows_rtne;
  decltype(&ref::absmax_cols) absmax_cols;
  decltype(&ref::quantize_cols_rtne) quantize_cols_rtne;
  decltype(&ref::grad_absmax) grad_absmax;
  decltype(&ref::grad_quantize) grad_quantize;
  decltype(&ref::gemv_s8_f32) gemv_s8_f32;
  decltype(&ref::dx_epilogue) dx_epilogue;
  decltype(&ref::swiglu_forward_ew) swiglu_forward_ew;
  decltype(&ref::swiglu_backward_ew) swiglu_backward_ew;
  decltype(&ref::geglu_forward_ew) geglu_forward_ew;
  decltype(&ref::geglu_backward_ew) geglu_backward_ew;
  decltype(&ref::softmax_xent_rows) softmax_xent_rows;
  decltype(&ref::rmsnorm_rows) rmsnorm_rows;
  decltype(&ref::rmsnorm_backward_rows) rmsnorm_backward_rows;
  decltype(&ref::transpose_s8) transpose_s8;
  decltype(&ref::adamw_update) adamw_update;
  decltype(&ref::round_bf16) round_bf16;
};

// The table of every tier, in the same order everywhere (a tier's table_TIER.cpp is this macro
// inside its namespace).
#define S3R_KERNEL_TABLE                                                                   \
  KernelTable {                                                                            \
    threefry_bits, philox_bits, quantize_rows_rtne, absmax_cols, quantize_cols_rtne,       \
        grad_absmax, grad_quantize, gemv_s8_f32, dx_epilogue, swiglu_forward_ew,           \
        swiglu_backward_ew, geglu_forward_ew, geglu_backward_ew, softmax_xent_rows,        \
        rmsnorm_rows, rmsnorm_backward_rows, transpose_s8, adamw_update, round_bf16        \
  }

}  // namespace s3r::kernels
