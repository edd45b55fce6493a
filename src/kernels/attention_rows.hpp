#pragma once
// Memory traffic of the fused attention in the vector tiers (kernels/attention_kernels.hpp): none
// of it changes a result.
//   - A head's rows come from memory. A forward block prefetches the next block's q, k and v rows
//     (a thread takes a head's blocks in order: model/attention.cpp), and every call a share of
//     the rows of the call its thread makes next (AttnNextRows), all into L2 (numbers below).
//   - A block's output rows go by non-temporal stores where they are whole 64-byte lines: the
//     store of a line not in the caches reads it first, and nothing reads `out` before the
//     O projection's GEMM (which streams it in order). 4.4% less time, same probe. The kernel
//     fences (sfence) before it returns.
//
// Include only from tier translation units (internal linkage, each tier compiling its own copy).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/attention_kernels.hpp"
#include "kernels/transpose_f32_block.hpp"

namespace s3r::kernels {
namespace {  // NOLINT(build/namespaces): internal linkage per tier, see above

// One line's prefetch into L2 (T1: on an AMD Zen 4, AVX2, `small`, the forward with the next
// block's rows prefetched this way took 4% less time than with T0, into L1). Written as volatile
// asm, not _mm_prefetch: GCC 12 takes a function whose only effect is __builtin_prefetch for pure
// and drops the calls to it, and so dropped every prefetch of this file until 2026-12-06.
inline void prefetch_l2(const float* p) {
  asm volatile("prefetcht1 %0" : : "m"(*reinterpret_cast<const char*>(p)));
}

// The share of the next block's rows (i0 + 32 .. i0 + 63, those below S) that the key block j0 of
// block i0's pairs (the first at jfirst) prefetches: the rows evenly over the block's pairs.
inline void prefetch_next_block(const AttnHead& h, int64_t i0, int64_t j0, int64_t jfirst) {
  const int64_t next0 = i0 + kAttnBlock, next1 = std::min(h.seq_len, i0 + 2 * kAttnBlock);
  if (next0 >= next1) return;
  const int64_t pairs = (i0 - jfirst) / kAttnBlock + 1;
  const int64_t share = (next1 - next0 + pairs - 1) / pairs;
  const int64_t r0 = next0 + (j0 - jfirst) / kAttnBlock * share, r1 = std::min(next1, r0 + share);
  const auto rows = [&](const float* x, int64_t ld) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t d = 0; d < h.head_dim; d += 16) {
        prefetch_l2(x + r * ld + d);
      }
    }
  };
  rows(h.q, h.ld);
  rows(h.k, h.ld_kv);
  rows(h.v, h.ld_kv);
}

// Part `part` of `parts` of the share of the thread's next call's rows that pair number `pair`
// of a head (of `pairs`, in visiting order; a forward block numbers its pairs on from the
// earlier blocks') prefetches into L2: rows [pair r, pair r + r) of each set, r = the rows over
// the pairs rounded up, its (row, set) items taken in turn by the parts (a backward pair spreads
// its share over four points of its work). Nothing without a next call.
// A head's rows come from memory: at `small` a backward reads 320 KB and first writes 192 KB,
// a forward reads 192 KB. On an AMD Zen 4 (one thread, `small`, rows from memory against rows in
// cache) the misses took 17% of an AVX2 backward head (the set-up's reads about 85 k cycles of
// 780 k, the first writes of dq, dk, dv about 40 k) and 20% of a forward head. With the next
// head's rows prefetched this way, and the next block's in the forward: the AVX2 backward 690-706
// against 754-789 k cycles per head (in one burst per pair 704-723), the AVX-512 backward
// 621-626 against 687-777 (in one burst 640-652), the forwards 293-299 against 314-339 (AVX2)
// and 266-272 against 277-301 (AVX-512): the best of 15 rounds per process, alternating
// processes. In the step (two threads) attention took 5-10% less time at `small`. The forward
// names only the next head's first block: with all of that head's rows the AVX2 forward took
// 1-1.5% longer (alternating in one process), its later blocks' rows coming again with the block
// before them.
inline void prefetch_next_call(const AttnNextRows* next, int64_t pair, int64_t pairs, int part,
                               int parts) {
  if (next == nullptr || next->sets == 0) return;
  const int64_t share = (next->seq_len + pairs - 1) / pairs;
  const int64_t r0 = pair * share, r1 = std::min(next->seq_len, r0 + share);
  const int64_t items = (r1 - r0) * next->sets;
  for (int64_t item = part; item < items; item += parts) {
    const int s = static_cast<int>(item % next->sets);
    const float* row = next->rows[s] + (r0 + item / next->sets) * next->ld[s];
    for (int64_t d = 0; d < next->head_dim; d += 16) prefetch_l2(row + d);
  }
}

// The vector tiers' backward visiting order (kernels/attention_kernels.hpp), written once: key
// blocks j0 in order, and in each the query blocks i0 that visit it, from j0 on, taken
// kAttnBackwardPairs at a time: pair(j0, i0, g0, number) for each (g0: the first query block
// taken with it; number: the pair's place in the whole head's order), then group(j0, g0, rows)
// for the pairs taken together (query rows g0 .. g0 + rows - 1).
template <class Pair, class Group>
void for_each_backward_pair(const AttnHead& h, Pair&& pair, Group&& group) {
  const int64_t S = h.seq_len;
  int64_t number = 0;
  for (int64_t j0 = 0; j0 < S; j0 += kAttnBlock) {
    int64_t i0 = j0;
    while (i0 < S && first_key_block(i0, h.window) <= j0) {
      const int64_t g0 = i0;
      for (int64_t c = 0;
           c < kAttnBackwardPairs && i0 < S && first_key_block(i0, h.window) <= j0;
           ++c, i0 += kAttnBlock) {
        pair(j0, i0, g0, number++);
      }
      group(j0, g0, std::min(i0, S) - g0);
    }
  }
}

// dst (rows, hd contiguous) = src's rows (stride lds). The backward reads the head's rows from
// such copies (the AVX2 tier q's and dout's, and each key block's k rows as it transposes them;
// the AVX-512 tier q, dout, k and v where copy says so) where their stride would crowd the L1
// cache's sets (32 KB, 8 ways of 64 sets on AMD Zen 3/4 and Intel cores since Skylake; the
// model's activations all start at the same offset in their pages): rows 1 KB apart (`small`'s
// 256 floats) use a quarter of the sets, and a 32-row block fills their ways; rows 4 KB apart
// (`wide`'s 1024) all fall into the same sets, four times over their ways. On an AMD Zen 4 one
// AVX2 accumulation over a 32 x 32 pair (HD = 64, all in L1 or L2) took 4100 TSC cycles on
// rows 1 KB apart and 3350 on contiguous ones (2905 at the FMA limit); in the step, attention
// under the AVX2 cap 10% less time at `small` and 25% at `wide`. The AVX-512 backward (its
// tiles read whole 256-byte rows) was 3-4% slower with copies of rows 1 KB apart and about 9%
// faster with copies of rows 4 KB apart; it copies where the stride is a multiple of 2 KB (more
// than 8 of a block's lines per set).
inline void compact_rows(float* dst, const float* src, int64_t lds, int64_t rows, int64_t hd) {
  for (int64_t r = 0; r < rows; ++r) std::copy(src + r * lds, src + r * lds + hd, dst + r * hd);
}
// Whether rows `ld` floats apart put more than 8 lines of a 32-row block into one L1 set.
inline bool rows_overfill_l1_sets(int64_t ld) { return (ld * 4) % 2048 == 0; }

// The rows the backward's pairs read: q and dout (stride lq), k and v (stride lkv), in place or
// contiguous copies.
struct BackwardRows {
  const float* q;
  const float* dout;
  const float* k;
  const float* v;
  int64_t lq, lkv;
};

// The backward's set-up of the rows: q and dout transposed block by block into qt and dot (block
// b's (HD, 32) at b * HD * 32, rows past S zero), and, where copy(stride) says so, q and dout
// (copied while the transposes read them) and k and v copied contiguous into `copies` (4 Sp HD
// floats: attention_backward_scratch_copies).
template <class CopyRule>
BackwardRows backward_rows(const AttnHead& h, const float* dout, float* qt, float* dot,
                           float* copies, CopyRule copy) {
  const int64_t S = h.seq_len, HD = h.head_dim, Sp = attention_padded(S);
  const bool copy_q = copy(h.ld), copy_kv = copy(h.ld_kv);
  float* qc = copies;         // (S, HD) when copied
  float* doc = qc + Sp * HD;  // (S, HD)
  float* kc = doc + Sp * HD;  // (S, HD)
  float* vc = kc + Sp * HD;   // (S, HD)
  for (int64_t i0 = 0; i0 < S; i0 += kAttnBlock) {
    const int64_t ni = std::min(kAttnBlock, S - i0);
    transpose_block(qt + i0 * HD, kAttnBlock, h.q + i0 * h.ld, h.ld, ni, HD,
                    copy_q ? qc + i0 * HD : nullptr);
    transpose_block(dot + i0 * HD, kAttnBlock, dout + i0 * h.ld, h.ld, ni, HD,
                    copy_q ? doc + i0 * HD : nullptr);
  }
  if (copy_kv) {
    compact_rows(kc, h.k, h.ld_kv, S, HD);
    compact_rows(vc, h.v, h.ld_kv, S, HD);
  }
  return {copy_q ? qc : h.q, copy_q ? doc : dout, copy_kv ? kc : h.k, copy_kv ? vc : h.v,
          copy_q ? HD : h.ld, copy_kv ? HD : h.ld_kv};
}

// Whether every output row of the head (out, stride h.ld) is whole 64-byte lines.
inline bool out_rows_are_lines(const float* out, const AttnHead& h) {
  return h.head_dim % 16 == 0 && h.ld % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 64 == 0;
}

}  // namespace
}  // namespace s3r::kernels
