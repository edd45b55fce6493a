#pragma once
// Fused causal attention ("flash attention") kernels of one (example, head): the tier functions
// behind s3r/model/attention.hpp. Kept apart from kernels.hpp's table: a second, small family
// with its own table and its own dispatch (kernels/attention_dispatch.cpp), same tiers.
//
// The computation is defined block by block, and every tier performs it with the same f32
// operations in the same order, so results agree bit for bit across tiers (tests/model/
// attention_test.cpp checks it); -ffp-contract=off everywhere, and the fused multiply-adds are
// explicit (std::fma in the reference, vfmadd in the tiers; both round once).
//
// Blocks: queries and keys in blocks of kAttnBlock = 32 (the last one may be shorter). The block
// pair (query block [i0, i0 + ni), key block [j0, j0 + nj)) is visited iff
// first_key_block(i0, W) <= j0 <= i0 (blocks wholly above the diagonal are skipped, and with a
// sliding window W those wholly before every row's window); j0 < i0 is a full pair, j0 = i0 the
// diagonal pair. Key j is masked for row i iff j > i (causal) or, with a window W >= 1,
// i - j >= W (row i attends to keys i - W < j <= i: Hugging Face's and llama.cpp's sliding
// window). The mask is applied by leaving the score out of the maximum and setting the
// probability (and dS) to exactly +0, never through exp; a full pair's window-masked keys are
// accumulated like the others (adding fma(+0, x, acc) = acc). In the diagonal pair, masked terms are
// also skipped, at a granularity that every tier shares (kAttnGroup = 4 rows): query row i of
// group g (rows i0 + 4g .. i0 + 4g + 3) accumulates over keys j < j0 + min(nj, 4g + 4), and key j
// of group g accumulates over rows i >= i0 + 4g; the masked keys those ranges still include add
// fma(+0, x, acc) = acc for finite x. Scores that no unmasked pair needs are not computed.
//
// Per visited pair, for query row i and keys j (in order):
//   s_ij  = fma chain over d = 0..HD-1 of k_j[d] * q_i[d] (from 0), then * scale
// forward (state m_i = lowest finite float, l_i = 0, acc_i = 0 before the first key block; a
// row none of whose keys in a pair is unmasked keeps m, l = 0 and acc = 0, alpha being 1):
//   mb    = max over unmasked j of s_ij (as mb = s > mb ? s : mb, from -inf; a NaN score is
//           skipped; the order is free: it can only change the sign of a zero maximum, and
//           neither s - mnew, m - mnew nor m + log(l) below depends on it)
//   mnew  = mb > m ? mb : m;  alpha = exp_poly(m - mnew)
//   p_ij  = unmasked ? exp_poly(s_ij - mnew) : 0;  lsum = ((0 + p_i0) + p_i1) + ...
//   l     = l * alpha + lsum  (two roundings);  m = mnew
//   acc_i = acc_i * alpha, then acc_i = fma(p_ij, v_j, acc_i) for j in order (in its range)
// and after the last key block: out_i = acc_i / l;  lse_i = float(double(m) + log(double(l))).
// backward, with D_i = dout_i . out_i in double: eight partial sums P_l (lane l adds the exact
// products double(dout_i[d]) * out_i[d] of d = l mod 8, in d order), then
// D_i = float(((P_0 + P_4) + (P_2 + P_6)) + ((P_1 + P_5) + (P_3 + P_7))):
//   p_ij  = unmasked ? exp_poly(s_ij - lse_i) : +0
//   dp_ij = fma chain over d of v_j[d] * dout_i[d] (from 0), then * 1
//   ds_ij = unmasked ? (p_ij * (dp_ij - D_i)) * scale : +0
//   dv_j  = fma(p_ij, dout_i, dv_j) for i in order (query blocks in order, rows in their range)
//   dk_j  = fma(ds_ij, q_i, dk_j)   for i in order
//   dq_i  = fma(ds_ij, k_j, dq_i)   for j in order (key blocks in order, keys in their range)
// with dq, dk, dv zeroed first, key blocks outermost; a kv head shared by G > 1 query heads
// gets dk = ((dk_h0 + dk_h1) + dk_h2) + ... over its heads in order (f32 adds; AttnHead), dv alike.
// exp_poly is kernels/ref/numerics.hpp's Cephes-style exp (relative error <= 2^-21 on [-87, 88],
// argument clamped to that range).
#include <cstdint>

#include "s3r/core/isa.hpp"

namespace s3r::kernels {

inline constexpr int64_t kAttnBlock = 32;
inline constexpr int64_t kAttnGroup = 4;
// The vector tiers' backward takes a key block's pairs this many at a time, their p and dS side
// by side, and accumulates dv and dk over all their rows at once (the same operations in the
// same order): each accumulation tile loads and stores its sums half as often. On an AMD Zen 4
// (one thread, `small`, alternating in one process) 1.0-1.3% less time per AVX2 head and
// 1.2-1.4% per AVX-512 head than one pair at a time; three pairs the same as two, four 1-2%
// slower (more lines than L1 keeps).
inline constexpr int64_t kAttnBackwardPairs = 2;

// The first key block the query block starting at row i0 visits: the block of key i0 - W + 1,
// the first that row i0 (and so any row of the block) may attend to; 0 without a window (W = 0).
inline int64_t first_key_block(int64_t i0, int64_t window) {
  if (window <= 0 || i0 - window + 1 <= 0) return 0;
  return (i0 - window + 1) / kAttnBlock * kAttnBlock;
}
// W for the vector tiers' lane masks (i - j < W): a window, or one no row distance reaches.
inline int64_t window_or_all(int64_t window) { return window > 0 ? window : int64_t{1} << 30; }
// Whether no key of the block pair (query rows [i0, i0 + ni), key block j0 < i0) is masked for
// any of its rows: the pair lies below the diagonal and its farthest (row, key) distance is
// inside the window (w = window_or_all). The vector tiers skip the lane masks of such pairs.
inline bool pair_unmasked(int64_t i0, int64_t ni, int64_t j0, int64_t w) {
  return j0 < i0 && i0 + ni - 1 - j0 < w;
}

// One (example, query head) and the kv head it reads; HD = head_dim columns of each row are used.
// Row s of q (and of out, dout, dq) starts at s * ld, row s of k and v at s * ld_kv, row s of dk
// and dv (the backward's outputs) at s * ld_dkv. The strides change no arithmetic: a kernel's
// results are the same bits for any strides.
// Grouped-query attention (s3r/model/attention.hpp): the G = NH / NKV query heads of a group read
// the same k, v rows (ld = NH * HD, ld_kv = NKV * HD). With G = 1 a head's dk, dv are written in
// place (ld_dkv = ld_kv); with G > 1 the caller writes the group's first head's dk, dv in place
// and each later head's into a contiguous (S, HD) scratch (ld_dkv = HD), which it then adds to
// them in f32, head after head: dk = ((dk_h0 + dk_h1) + dk_h2) + ..., likewise dv.
struct AttnHead {
  const float* q = nullptr;  // (S, ld)
  const float* k = nullptr;  // (S, ld_kv)
  const float* v = nullptr;  // (S, ld_kv)
  int64_t seq_len = 0;       // S >= 1
  int64_t head_dim = 0;      // HD >= 1
  int64_t ld = 0;            // >= HD: q, out, dout, dq (NH * HD in the (T, NH * HD) layout)
  int64_t ld_kv = 0;         // >= HD: k, v (NKV * HD in the (T, NKV * HD) layout)
  int64_t ld_dkv = 0;        // >= HD: dk, dv (backward only; ld_kv, or HD for a scratch)
  float scale = 1.0f;        // 1 / sqrt(HD)
  int64_t window = 0;        // W >= 1: sliding window (row i attends to keys i - W < j <= i); 0: none
};

// The rows a thread's next call reads and writes (the first seq_len rows of HD floats of each
// set, at the given strides): the forward's next head's first block of q, k, v (each later block
// is prefetched by the one before); the backward's next call's q, dout, out, k, v, dq, dk, dv.
// The vector tiers prefetch them into L2 over the current head's pairs
// (kernels/attention_rows.hpp: prefetch_next_call); no result depends on it.
struct AttnNextRows {
  static constexpr int kMaxSets = 8;
  const float* rows[kMaxSets] = {};
  int64_t ld[kMaxSets] = {};
  int sets = 0;
  int64_t seq_len = 0, head_dim = 0;  // the rows of each set to prefetch, their floats
};

// The block pairs a head visits in its query blocks starting below row `rows` (S: all of them):
// per query block, its key blocks first_key_block .. itself.
inline int64_t visited_pairs(int64_t rows, int64_t window) {
  int64_t pairs = 0;
  for (int64_t i0 = 0; i0 < rows; i0 += kAttnBlock) {
    pairs += (i0 - first_key_block(i0, window)) / kAttnBlock + 1;
  }
  return pairs;
}

// Scratch floats a kernel needs (the caller provides them, e.g. one buffer per thread).
inline int64_t attention_padded(int64_t S) {
  return (S + kAttnBlock - 1) / kAttnBlock * kAttnBlock;
}
// (The forward's: q transposed, the block's accumulators, and the probabilities and rescalings of
// all its key blocks, the vector tiers accumulating p v over all of them at once.)
inline int64_t attention_forward_scratch(int64_t seq_len, int64_t head_dim) {
  return 2 * head_dim * kAttnBlock + (kAttnBlock + 1) * attention_padded(seq_len) + 2 * kAttnBlock;
}
// (The backward's: q and dout transposed, D, lse, a pair's p and dS.)
inline int64_t attention_backward_scratch(int64_t seq_len, int64_t head_dim) {
  return 2 * head_dim * attention_padded(seq_len) + 2 * attention_padded(seq_len) +
         2 * kAttnBlock * kAttnBlock;
}
// The AVX-512 backward's: the above, the p and dS of kAttnBackwardPairs pairs, and room for
// contiguous copies of the head's q, dout, k and v rows (kernels/attention_rows.hpp:
// compact_rows).
inline int64_t attention_backward_scratch_copies(int64_t seq_len, int64_t head_dim) {
  return attention_backward_scratch(seq_len, head_dim) +
         2 * (kAttnBackwardPairs - 1) * kAttnBlock * kAttnBlock +
         4 * head_dim * attention_padded(seq_len);
}

// The AVX2 backward's: contiguous copies of the head's q and dout rows, one key block's k and v
// transposed and its k rows, D, lse, and the p and dS of kAttnBackwardPairs pairs.
inline int64_t attention_backward_scratch_avx2(int64_t seq_len, int64_t head_dim) {
  const int64_t Sp = attention_padded(seq_len);
  return 2 * head_dim * Sp + 3 * kAttnBlock * head_dim + 2 * Sp +
         2 * kAttnBackwardPairs * kAttnBlock * kAttnBlock;
}

#define S3R_DECLARE_ATTENTION_KERNELS                                                             \
  /* Query block `block` of one head: rows [32 block, min(32 block + 32, S)) of out (row stride   \
     h.ld, HD columns written) and of lse (S) are written. scratch: attention_forward_scratch.   \
     The vector tiers prefetch block + 1's rows and stream out's rows where they are whole lines \
     (kernels/attention_rows.hpp), fencing before they return; next (or nullptr): the rows of    \
     the head the thread takes after this one, which each block prefetches a share of. */       \
  void attention_forward_block(float* out, float* lse, const AttnHead& h, int64_t block,          \
                               float* scratch, const AttnNextRows* next);                         \
  /* The whole head: dq (S rows, stride h.ld), dk, dv (S rows, stride h.ld_dkv), HD columns,     \
     overwritten; dout, out as q; lse (S). scratch: the tier's backward_scratch(S, HD) floats.   \
     next (or nullptr): the rows of the thread's next call, which the vector tiers prefetch. */   \
  void attention_backward_head(float* dq, float* dk, float* dv, const float* dout,                \
                               const float* out, const float* lse, const AttnHead& h,             \
                               float* scratch, const AttnNextRows* next);

namespace ref {
S3R_DECLARE_ATTENTION_KERNELS
// The scalar piece every tier calls (compiled once, here, so it is the same code everywhere):
// lse = float(double(m) + log(double(l))).
float attention_lse(float m, float l);
}  // namespace ref
namespace avx2 {
S3R_DECLARE_ATTENTION_KERNELS
}  // namespace avx2
namespace avx512 {
S3R_DECLARE_ATTENTION_KERNELS
}  // namespace avx512
#undef S3R_DECLARE_ATTENTION_KERNELS

struct AttentionKernels {
  decltype(&ref::attention_forward_block) forward_block;
  decltype(&ref::attention_backward_head) backward_head;
  decltype(&attention_backward_scratch) backward_scratch;  // floats backward_head needs
};

// The attention kernels of `isa`; throws s3r::Error if this build has no such tier.
const AttentionKernels& attention_kernels_for(Isa isa);

}  // namespace s3r::kernels
