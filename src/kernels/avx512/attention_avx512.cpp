// AVX-512 fused causal attention kernels; operation for operation the same as
// kernels/ref/attention_ref.cpp (bit-exact), see kernels/attention_kernels.hpp for the blocks.
//
// Layout of the work: the 32 query rows of a block are the lanes of two vectors wherever a
// quantity is per (key, query) pair (scores, probabilities, their gradients: p[j * ld + r]),
// so the softmax's maxima and sums run down the keys, vertically, without horizontal
// reductions; products that accumulate rows of HD values (p v, dS k, p^T dout, dS^T q) keep HD in
// the lanes and broadcast one coefficient at a time. Every output element thus sees the
// reference's chain of fmas in the reference's order.
#include <algorithm>
#include <limits>

#include "kernels/attention_kernels.hpp"
#include "kernels/attention_rows.hpp"
#include "kernels/avx512/common_avx512.hpp"
#include "kernels/transpose_f32_block.hpp"

namespace s3r::kernels::avx512 {

namespace {

constexpr int64_t kB = kAttnBlock;


// body(j, e_j) for the keys j < jn in order, e_j = exp_poly16(p[j * ldp] - sub): four exps at a
// time (exp_poly16_n: independent chains for the out-of-order core), the last jn % 4 one by one.
template <class Body>
inline void exp_keys(const float* p, int64_t ldp, __m512 sub, int64_t jn, Body&& body) {
  constexpr int kXn = 4;
  int64_t j = 0;
  for (; j + kXn <= jn; j += kXn) {
    __m512 e[kXn];
#pragma GCC unroll 4
    for (int c = 0; c < kXn; ++c) e[c] = _mm512_sub_ps(_mm512_loadu_ps(p + (j + c) * ldp), sub);
    exp_poly16_n<kXn>(e);
#pragma GCC unroll 4
    for (int c = 0; c < kXn; ++c) body(j + c, e[c]);
  }
  for (; j < jn; ++j) body(j, exp_poly16(_mm512_sub_ps(_mm512_loadu_ps(p + j * ldp), sub)));
}

// st[j * ldst + r] = (fma chain over d of a[j * lda + d] * bt[d * ldb + r]) * scale, j < JT, for
// the 16 NH lanes r from st / bt (NH = 2: all 32 rows of the block; NH = 1: one half).
template <int JT, int NH>
inline void score_rows(float* st, int64_t ldst, const float* a, int64_t lda, const float* bt,
                       int64_t ldb, int64_t hd, float scale) {
  __m512 c[JT][NH];
#pragma GCC unroll 16
  for (int j = 0; j < JT; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < NH; ++v) c[j][v] = _mm512_setzero_ps();
  }
  for (int64_t d = 0; d < hd; ++d) {
    __m512 b[NH];
#pragma GCC unroll 2
    for (int v = 0; v < NH; ++v) b[v] = _mm512_loadu_ps(bt + d * ldb + 16 * v);
#pragma GCC unroll 16
    for (int j = 0; j < JT; ++j) {
      const __m512 x = _mm512_set1_ps(a[j * lda + d]);
#pragma GCC unroll 2
      for (int v = 0; v < NH; ++v) c[j][v] = _mm512_fmadd_ps(x, b[v], c[j][v]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 16
  for (int j = 0; j < JT; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < NH; ++v) {
      _mm512_storeu_ps(st + j * ldst + 16 * v, _mm512_mul_ps(c[j][v], sc));
    }
  }
}

// score_rows for keys [j, nj) (nj <= 32), tiles of 8 keys (16 accumulators with both halves).
template <int NH>
void score_keys(float* st, int64_t ldst, const float* a, int64_t lda, const float* bt,
                int64_t ldb, int64_t hd, int64_t j, int64_t nj, float scale) {
  constexpr int kJt = 8;
  for (; j + kJt <= nj; j += kJt) {
    score_rows<kJt, NH>(st + j * ldst, ldst, a + j * lda, lda, bt, ldb, hd, scale);
  }
  const float* aj = a + j * lda;
  float* sj = st + j * ldst;
  switch (nj - j) {
    case 7:
      score_rows<7, NH>(sj, ldst, aj, lda, bt, ldb, hd, scale);
      break;
    case 6:
      score_rows<6, NH>(sj, ldst, aj, lda, bt, ldb, hd, scale);
      break;
    case 5:
      score_rows<5, NH>(sj, ldst, aj, lda, bt, ldb, hd, scale);
      break;
    case 4:
      score_rows<4, NH>(sj, ldst, aj, lda, bt, ldb, hd, scale);
      break;
    case 3:
      score_rows<3, NH>(sj, ldst, aj, lda, bt, ldb, hd, scale);
      break;
    case 2:
      score_rows<2, NH>(sj, ldst, aj, lda, bt, ldb, hd, scale);
      break;
    case 1:
      score_rows<1, NH>(sj, ldst, aj, lda, bt, ldb, hd, scale);
      break;
    default:
      break;
  }
}

// The scores of a block pair, st[j * ldst + r]: every (key, row) of a full pair; in the diagonal
// pair, keys 16..31 are masked for rows 0..15, so only the upper half of the lanes is computed
// for them.
void score_tile(float* st, int64_t ldst, const float* a, int64_t lda, const float* bt, int64_t ldb,
                int64_t hd, int64_t nj, bool diagonal, float scale) {
  if (!diagonal) {
    score_keys<2>(st, ldst, a, lda, bt, ldb, hd, 0, nj, scale);
    return;
  }
  score_keys<2>(st, ldst, a, lda, bt, ldb, hd, 0, std::min<int64_t>(nj, 16), scale);
  score_keys<1>(st + 16, ldst, a, lda, bt + 16, ldb, hd, 16, nj, scale);
}

// XT rows x (16 NV) columns of c: c = +0 (init) or as read, then for y in [y0, y1) in order
// c[x, :] = fma(coef[x * cx + y * cy], r[y, :], c[x, :]); with alpha set, first
// c[x, :] = c[x, :] * alpha[y + x] at each y > y0 that is a multiple of 32 (the forward's
// rescaling as each key block after the first starts: the forward runs over all of a query
// block's keys at once, its accumulators in registers throughout). The last vector is masked by
// `last`: an AllLanes16 (a whole vector, plain loads and stores; see for_each_vector16) or a
// __mmask16.
template <int XT, int NV, class LastMask>
void accum_tile(float* c, int64_t ldc, const float* coef, int64_t cx, int64_t cy, const float* r,
                int64_t ldr, int64_t y0, int64_t y1, bool init, const float* alpha,
                LastMask last) {
  __m512 acc[XT][NV];
#pragma GCC unroll 16
  for (int x = 0; x < XT; ++x) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : static_cast<__mmask16>(0xFFFF);
      acc[x][v] = init ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, c + x * ldc + 16 * v);
    }
  }
  for (int64_t yb = y0; yb < y1;) {
    const int64_t ye = alpha != nullptr ? std::min(y1, (yb / kB + 1) * kB) : y1;
    if (alpha != nullptr && yb != y0) {
#pragma GCC unroll 16
      for (int x = 0; x < XT; ++x) {
        const __m512 a = _mm512_set1_ps(alpha[yb + x]);
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) acc[x][v] = _mm512_mul_ps(acc[x][v], a);
      }
    }
    for (int64_t y = yb; y < ye; ++y) {
      __m512 rv[NV];
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) {
        const __mmask16 m = v == NV - 1 ? last : static_cast<__mmask16>(0xFFFF);
        rv[v] = _mm512_maskz_loadu_ps(m, r + y * ldr + 16 * v);
      }
#pragma GCC unroll 16
      for (int x = 0; x < XT; ++x) {
        const __m512 w = _mm512_set1_ps(coef[x * cx + y * cy]);
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) acc[x][v] = _mm512_fmadd_ps(w, rv[v], acc[x][v]);
      }
    }
    yb = ye;
  }
#pragma GCC unroll 16
  for (int x = 0; x < XT; ++x) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : static_cast<__mmask16>(0xFFFF);
      _mm512_mask_storeu_ps(c + x * ldc + 16 * v, m, acc[x][v]);
    }
  }
}

// Tiles of one kAttnGroup (4 rows) x 4 vectors: 16 accumulators, 4 row loads and 4 broadcasts
// per step; a tile is one group, so the diagonal pair's ranges are per tile.
constexpr int kXt = static_cast<int>(kAttnGroup);
template <class LastMask>
using AccumFn = void (*)(float*, int64_t, const float*, int64_t, int64_t, const float*, int64_t,
                         int64_t, int64_t, bool, const float*, LastMask);
#define S3R_ACCUM_ROW(X, M) \
  { accum_tile<X, 1, M>, accum_tile<X, 2, M>, accum_tile<X, 3, M>, accum_tile<X, 4, M> }
// Tiles whose last vector is whole (head widths that are multiples of 16), and the others.
constexpr AccumFn<AllLanes16> kAccumWhole[kXt][4] = {
    S3R_ACCUM_ROW(1, AllLanes16), S3R_ACCUM_ROW(2, AllLanes16), S3R_ACCUM_ROW(3, AllLanes16),
    S3R_ACCUM_ROW(4, AllLanes16)};
constexpr AccumFn<__mmask16> kAccumPartial[kXt][4] = {
    S3R_ACCUM_ROW(1, __mmask16), S3R_ACCUM_ROW(2, __mmask16), S3R_ACCUM_ROW(3, __mmask16),
    S3R_ACCUM_ROW(4, __mmask16)};
#undef S3R_ACCUM_ROW

// Which y a row x accumulates over (kernels/attention_kernels.hpp): all of [0, ny); with the
// diagonal pair's y from yd on, keys up to the end of x's group (kKeysUpToGroup: x a query row,
// y keys) or rows from the start of x's group on (kRowsFromGroup: x a key, y query rows).
enum class Range { kAll, kKeysUpToGroup, kRowsFromGroup };

// Rows x < nx of c (stride ldc, hd columns): accum_tile over tiles of one group x 64 columns.
// init: c starts at +0 (its first visit) instead of being read.
void accum_rows(float* c, int64_t ldc, int64_t nx, const float* coef, int64_t cx, int64_t cy,
                const float* r, int64_t ldr, int64_t ny, int64_t hd, bool init, const float* alpha,
                Range range, int64_t yd = 0) {
  for (int64_t d0 = 0; d0 < hd; d0 += 64) {
    const int64_t w = std::min<int64_t>(64, hd - d0);
    const int64_t nv = (w + 15) / 16;
    const __mmask16 last = first_lanes(w - 16 * (nv - 1));
    for (int64_t x = 0; x < nx; x += kXt) {
      const int64_t xt = std::min<int64_t>(kXt, nx - x);
      const int64_t y0 = range == Range::kRowsFromGroup ? yd + x : 0;
      const int64_t y1 = range == Range::kKeysUpToGroup ? std::min(ny, yd + x + kXt) : ny;
      const float* ax = alpha != nullptr ? alpha + x : nullptr;
      if (w == 16 * nv) {
        kAccumWhole[xt - 1][nv - 1](c + x * ldc + d0, ldc, coef + x * cx, cx, cy, r + d0, ldr, y0,
                                    y1, init, ax, AllLanes16{});
      } else {
        kAccumPartial[xt - 1][nv - 1](c + x * ldc + d0, ldc, coef + x * cx, cx, cy, r + d0, ldr,
                                      y0, y1, init, ax, last);
      }
    }
  }
}

// Lanes (rows i = base + lane, r = the lane's i - j0) whose key j0 + j is unmasked:
// j <= r < j + W (causal, and inside the window; W = window_or_all).
inline __mmask16 unmasked(__m512i r, int64_t j, int64_t w) {
  const __mmask16 causal = _mm512_cmpge_epi32_mask(r, _mm512_set1_epi32(static_cast<int32_t>(j)));
  return _mm512_mask_cmplt_epi32_mask(causal, r, _mm512_set1_epi32(static_cast<int32_t>(j + w)));
}

// The forward's online softmax of one block pair (kernels/attention_kernels.hpp): p holds the
// scores p[j * 32 + r] and becomes the probabilities; ms, ls (the rows' m and l) are updated and
// alpha[r] = exp_poly(m - mnew) written. `di` = i0 - j0: lane r of key j is unmasked iff
// 0 <= di + r - j < W. In the diagonal pair the keys past a half's last row are masked in every
// lane of that half: their scores were not computed, and they are not read.
void online_softmax_masked(float* p, float* ms, float* ls, float* alpha, int64_t di, int64_t nj,
                           bool diagonal, int64_t W) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const __m512i iota = lane_iota();
  for (int64_t half = 0; half < kB; half += 16) {  // rows half .. half + 15 in the lanes
    const int64_t jn = diagonal ? std::min(nj, half + 16) : nj;
    const __m512i r = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(di + half)));
    __m512 mb = _mm512_set1_ps(-kInf);
    for (int64_t j = 0; j < jn; ++j) {
      const __mmask16 keep = unmasked(r, j, W);
      mb = _mm512_mask_max_ps(mb, keep, _mm512_loadu_ps(p + j * kB + half), mb);
    }
    const __m512 m = _mm512_loadu_ps(ms + half);
    const __m512 mn = _mm512_max_ps(mb, m);
    const __m512 a = exp_poly16(_mm512_sub_ps(m, mn));
    __m512 sum = _mm512_setzero_ps();
    exp_keys(p + half, kB, mn, jn, [&](int64_t j, __m512 e) {
      e = _mm512_maskz_mov_ps(unmasked(r, j, W), e);
      _mm512_storeu_ps(p + j * kB + half, e);
      sum = _mm512_add_ps(sum, e);  // (the skipped keys would add +0)
    });
    _mm512_storeu_ps(ls + half, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(ls + half), a), sum));
    _mm512_storeu_ps(ms + half, mn);
    _mm512_storeu_ps(alpha + half, a);
  }
}

// online_softmax_masked for a pair with no masked key (a full pair inside the window), both
// halves at once: the exp chains of two halves interleave. The block maximum is taken as four
// partial maxima (keys j mod 4), then (0, 2), (1, 3), and those two: the same value as the
// sequential `s > mb ? s : mb` (a NaN score is skipped by both; only the sign of a zero
// maximum can differ, and m - mnew, s - mnew and m + log(l) give the same bits with either).
void online_softmax_full(float* p, float* ms, float* ls, float* alpha) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  __m512 mn[2], sum[2];
#pragma GCC unroll 2
  for (int hv = 0; hv < 2; ++hv) {
    const float* ph = p + 16 * hv;
    __m512 mb[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) mb[c] = _mm512_set1_ps(-kInf);
    for (int64_t j = 0; j < kB; j += 4) {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) mb[c] = _mm512_max_ps(_mm512_loadu_ps(ph + (j + c) * kB), mb[c]);
    }
    const __m512 m = _mm512_loadu_ps(ms + 16 * hv);
    mn[hv] = _mm512_max_ps(
        _mm512_max_ps(_mm512_max_ps(mb[1], mb[3]), _mm512_max_ps(mb[0], mb[2])), m);
    const __m512 a = exp_poly16(_mm512_sub_ps(m, mn[hv]));
    _mm512_storeu_ps(alpha + 16 * hv, a);
    _mm512_storeu_ps(ms + 16 * hv, mn[hv]);
    sum[hv] = _mm512_mul_ps(_mm512_loadu_ps(ls + 16 * hv), a);  // l * alpha, lsum added below
  }
  __m512 lsum[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  constexpr int kKeys = 4;  // keys per round: eight exps at once (exp_poly16_n)
  for (int64_t j = 0; j < kB; j += kKeys) {
    __m512 e[2 * kKeys];
#pragma GCC unroll 8
    for (int c = 0; c < 2 * kKeys; ++c) {
      e[c] = _mm512_sub_ps(_mm512_loadu_ps(p + (j + c / 2) * kB + 16 * (c % 2)), mn[c % 2]);
    }
    exp_poly16_n<2 * kKeys>(e);
#pragma GCC unroll 8
    for (int c = 0; c < 2 * kKeys; ++c) {  // key j + c / 2, half c % 2: each half's sum in key order
      _mm512_storeu_ps(p + (j + c / 2) * kB + 16 * (c % 2), e[c]);
      lsum[c % 2] = _mm512_add_ps(lsum[c % 2], e[c]);
    }
  }
#pragma GCC unroll 2
  for (int hv = 0; hv < 2; ++hv) _mm512_storeu_ps(ls + 16 * hv, _mm512_add_ps(sum[hv], lsum[hv]));
}

// D_i = dout_i . out_i as ref's row_dots: lane l of 8 doubles sums d = l mod 8 (exact products,
// then the add), then ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
void row_dots(float* dd, const float* a, const float* b, int64_t rows, int64_t ld, int64_t hd) {
  for (int64_t i = 0; i < rows; ++i) {
    __m512d acc = _mm512_setzero_pd();
    for_each_vector8(0, hd, [&](int64_t c, auto m) {
      const __m512d x = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, a + i * ld + c));
      const __m512d y = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, b + i * ld + c));
      acc = _mm512_mask_add_pd(acc, m, acc, _mm512_mul_pd(x, y));
    });
    const __m256d t = _mm256_add_pd(_mm512_castpd512_pd256(acc), _mm512_extractf64x4_pd(acc, 1));
    const __m128d u = _mm_add_pd(_mm256_castpd256_pd128(t), _mm256_extractf128_pd(t, 1));
    dd[i] = static_cast<float>(_mm_cvtsd_f64(_mm_add_sd(u, _mm_unpackhi_pd(u, u))));
  }
}

// The backward's p and dS of a block pair (scores in p, dP in ds, both [j * ldp + r]), in place:
// p = exp_poly(s - L_r) and dS = (p (dP - D_r)) scale where key j is unmasked for row r (di = i0 -
// j0), +0 elsewhere. kMasked = false: a pair with no masked key, whose lane masks are skipped.
template <bool kMasked>
void probs_and_ds(float* p, float* ds, int64_t ldp, const float* L, const float* D, __m512 sc,
                  int64_t di, int64_t nj, bool diagonal, int64_t W) {
  const __m512i iota = lane_iota();
  for (int64_t half = 0; half < kB; half += 16) {
    const int64_t jn = diagonal ? std::min(nj, half + 16) : nj;
    const __m512i r = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(di + half)));
    const __m512 Lh = _mm512_loadu_ps(L + half), Dh = _mm512_loadu_ps(D + half);
    exp_keys(p + half, ldp, Lh, jn, [&](int64_t j, __m512 e) {
      const __m512 g = _mm512_sub_ps(_mm512_loadu_ps(ds + j * ldp + half), Dh);
      __m512 d = _mm512_mul_ps(_mm512_mul_ps(e, g), sc);
      if constexpr (kMasked) {
        const __mmask16 keep = unmasked(r, j, W);
        e = _mm512_maskz_mov_ps(keep, e);
        d = _mm512_maskz_mov_ps(keep, d);
      }
      _mm512_storeu_ps(p + j * ldp + half, e);
      _mm512_storeu_ps(ds + j * ldp + half, d);
    });
  }
}

}  // namespace

void attention_forward_block(float* out, float* lse, const AttnHead& h, int64_t block,
                             float* scratch, const AttnNextRows* next) {
  const int64_t S = h.seq_len, HD = h.head_dim, ld = h.ld, ldkv = h.ld_kv;
  const int64_t i0 = block * kB, ni = std::min(kB, S - i0);
  const int64_t W = window_or_all(h.window), jfirst = first_key_block(i0, h.window);
  const int64_t nk = i0 - jfirst + ni;     // the keys jfirst .. i0 + ni - 1
  float* qt = scratch;                     // (HD, 32)
  float* acc = qt + HD * kB;               // (32, HD)
  float* ms = acc + kB * HD;               // (32)
  float* ls = ms + kB;                     // (32)
  float* alpha = ls + kB;                  // (Sp): key block jfirst + b's at 32 b
  float* p = alpha + attention_padded(S);  // (Sp, 32): key jfirst + y's at 32 y: p[y * 32 + r]
  transpose_block(qt, kB, h.q + i0 * ld, ld, ni, HD);
  for (int64_t half = 0; half < kB; half += 16) {
    _mm512_storeu_ps(ms + half, _mm512_set1_ps(std::numeric_limits<float>::lowest()));
    _mm512_storeu_ps(ls + half, _mm512_setzero_ps());
  }
  const int64_t pairs = visited_pairs(S, h.window), pair0 = visited_pairs(i0, h.window);
  for (int64_t j0 = jfirst; j0 <= i0; j0 += kB) {
    const int64_t nj = std::min(kB, S - j0);
    const bool diagonal = j0 == i0;
    prefetch_next_block(h, i0, j0, jfirst);
    prefetch_next_call(next, pair0 + (j0 - jfirst) / kB, pairs, 0, 1);
    float* pb = p + (j0 - jfirst) * kB;
    float* ab = alpha + (j0 - jfirst);
    score_tile(pb, kB, h.k + j0 * ldkv, ldkv, qt, kB, HD, nj, diagonal, h.scale);
    if (pair_unmasked(i0, ni, j0, W)) {
      online_softmax_full(pb, ms, ls, ab);
    } else {
      online_softmax_masked(pb, ms, ls, ab, i0 - j0, nj, diagonal, W);
    }
  }
  // acc = p v over all the keys at once, rescaled by each key block's alpha as it starts.
  accum_rows(acc, HD, ni, p, 1, kB, h.v + jfirst * ldkv, ldkv, nk, HD, true, alpha,
             Range::kKeysUpToGroup, i0 - jfirst);
  const bool lines = out_rows_are_lines(out, h);  // then streamed (kernels/attention_rows.hpp)
  for (int64_t r = 0; r < ni; ++r) {
    const __m512 lv = _mm512_set1_ps(ls[r]);
    float* o = out + (i0 + r) * ld;
    for_each_vector16(0, HD, [&](int64_t d, auto m) {
      const __m512 y = _mm512_div_ps(_mm512_maskz_loadu_ps(m, acc + r * HD + d), lv);
      if (lines) {
        _mm512_stream_ps(o + d, y);
      } else {
        _mm512_mask_storeu_ps(o + d, m, y);
      }
    });
    lse[i0 + r] = ref::attention_lse(ms[r], ls[r]);
  }
  if (lines) _mm_sfence();
}

void attention_backward_head(float* dq, float* dk, float* dv, const float* dout, const float* out,
                             const float* lse, const AttnHead& h, float* scratch,
                             const AttnNextRows* next) {
  const int64_t S = h.seq_len, HD = h.head_dim, ld = h.ld, Sp = attention_padded(S);
  const int64_t lddkv = h.ld_dkv, lp = kAttnBackwardPairs * kB;
  float* qt = scratch;        // (Sp / 32, HD, 32): q transposed (backward_rows)
  float* dot = qt + HD * Sp;  // (Sp / 32, HD, 32): dout transposed
  float* D = dot + HD * Sp;   // (Sp)
  float* L = D + Sp;          // (Sp)
  float* p = L + Sp;          // (32, lp): p[j * lp + y], y a row of the pairs taken together
  float* ds = p + kB * lp;    // (32, lp)
  // Rows in place, or copied where their stride crowds the L1 sets (kernels/attention_rows.hpp).
  const BackwardRows rows_of = backward_rows(h, dout, qt, dot, ds + kB * lp, rows_overfill_l1_sets);
  row_dots(D, dout, out, S, ld, HD);
  std::copy(lse, lse + S, L);
  std::fill(D + S, D + Sp, 0.0f);
  std::fill(L + S, L + Sp, 0.0f);
  // dq, dk, dv are not zeroed: each row's first accumulation starts from +0 (init).

  const __m512 sc = _mm512_set1_ps(h.scale);
  const int64_t W = window_or_all(h.window);
  const int64_t pairs = visited_pairs(S, h.window);
  for_each_backward_pair(
      h,
      [&](int64_t j0, int64_t i0, int64_t g0, int64_t pair) {
        const int64_t nj = std::min(kB, S - j0), ni = std::min(kB, S - i0);
        const bool diagonal = i0 == j0;
        float* pp = p + (i0 - g0);  // p and dS of the pairs taken together: row g0 + y at y
        float* dsp = ds + (i0 - g0);
        prefetch_next_call(next, pair, pairs, 0, 4);
        score_tile(pp, lp, rows_of.k + j0 * rows_of.lkv, rows_of.lkv, qt + i0 * HD, kB, HD, nj,
                   diagonal, h.scale);
        prefetch_next_call(next, pair, pairs, 1, 4);
        score_tile(dsp, lp, rows_of.v + j0 * rows_of.lkv, rows_of.lkv, dot + i0 * HD, kB, HD, nj,
                   diagonal, 1.0f);
        prefetch_next_call(next, pair, pairs, 2, 4);
        if (pair_unmasked(i0, ni, j0, W)) {
          probs_and_ds<false>(pp, dsp, lp, L + i0, D + i0, sc, 0, nj, diagonal, W);
        } else {
          probs_and_ds<true>(pp, dsp, lp, L + i0, D + i0, sc, i0 - j0, nj, diagonal, W);
        }
        prefetch_next_call(next, pair, pairs, 3, 4);
        accum_rows(dq + i0 * ld, ld, ni, dsp, 1, lp, rows_of.k + j0 * rows_of.lkv, rows_of.lkv,
                   nj, HD, j0 == first_key_block(i0, h.window), nullptr,
                   diagonal ? Range::kKeysUpToGroup : Range::kAll);
      },
      [&](int64_t j0, int64_t g0, int64_t rows) {  // dv, dk over all the pairs' rows at once
        const int64_t nj = std::min(kB, S - j0);
        const bool first = g0 == j0;
        const Range range = first ? Range::kRowsFromGroup : Range::kAll;
        accum_rows(dv + j0 * lddkv, lddkv, nj, p, lp, 1, rows_of.dout + g0 * rows_of.lq,
                   rows_of.lq, rows, HD, first, nullptr, range);
        accum_rows(dk + j0 * lddkv, lddkv, nj, ds, lp, 1, rows_of.q + g0 * rows_of.lq,
                   rows_of.lq, rows, HD, first, nullptr, range);
      });
}

}  // namespace s3r::kernels::avx512
