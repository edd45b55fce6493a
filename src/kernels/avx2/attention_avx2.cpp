// AVX2 fused causal attention kernels; operation for operation the same as
// kernels/ref/attention_ref.cpp (bit-exact). The forward has the AVX-512 twin's layout
// (kernels/avx512/attention_avx512.cpp): the 32 query rows of a block in the lanes (four
// vectors) for the per-(key, query) quantities, HD in the lanes for the row accumulations. The
// backward puts a block's 32 keys in the lanes instead, so that it transposes one key block's k
// and v at a time rather than the head's q and dout (attention_backward_head says why).
#include <algorithm>
#include <cassert>
#include <limits>

#include "kernels/attention_kernels.hpp"
#include "kernels/attention_rows.hpp"
#include "kernels/avx2/common_avx2.hpp"
#include "kernels/transpose_f32_block.hpp"

namespace s3r::kernels::avx2 {

namespace {

constexpr int64_t kB = kAttnBlock;


// body(j, e_j) for the keys j < jn in order, e_j = exp_poly8(p[j * ldp] - sub): eight exps at a
// time (exp_poly8_n), the last jn % 8 one by one.
template <class Body>
inline void exp_keys(const float* p, int64_t ldp, __m256 sub, int64_t jn, Body&& body) {
  constexpr int kXn = 8;
  int64_t j = 0;
  for (; j + kXn <= jn; j += kXn) {
    __m256 e[kXn];
#pragma GCC unroll 8
    for (int c = 0; c < kXn; ++c) e[c] = _mm256_sub_ps(_mm256_loadu_ps(p + (j + c) * ldp), sub);
    exp_poly8_n<kXn>(e);
#pragma GCC unroll 8
    for (int c = 0; c < kXn; ++c) body(j + c, e[c]);
  }
  for (; j < jn; ++j) body(j, exp_poly8(_mm256_sub_ps(_mm256_loadu_ps(p + j * ldp), sub)));
}

// Lanes r (of the 8 starting at lane0) with t <= r < t + w: all-ones, else zero. With rows in
// the lanes (the forward), t = the key's index minus the block's first row (j0 + j - i0) and
// w = window_or_all(W): the rows for which the key is unmasked (causal, inside the window); with
// keys in the lanes (the backward), t = y - dj - w + 1 for row y: the keys unmasked for it.
inline __m256 lanes_unmasked(int64_t lane0, int64_t t, int64_t w) {
  const __m256i r = _mm256_add_epi32(lane_iota(), _mm256_set1_epi32(static_cast<int32_t>(lane0)));
  const __m256i from = _mm256_cmpgt_epi32(r, _mm256_set1_epi32(static_cast<int32_t>(t - 1)));
  const __m256i below = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(t + w)), r);
  return _mm256_castsi256_ps(_mm256_and_si256(from, below));
}

// st[j * ldst + h + r] = (fma chain over d of a[j * lda + d] * bt[d * ldb + h + r]) * scale for
// j < JT and the 16 lanes r of half h (h = 0 or 16; bt already offset by h).
template <int JT>
inline void score_rows(float* st, int64_t ldst, const float* a, int64_t lda, const float* bt,
                       int64_t ldb, int64_t hd, float scale) {
  __m256 c0[JT], c1[JT];
#pragma GCC unroll 16
  for (int j = 0; j < JT; ++j) c0[j] = c1[j] = _mm256_setzero_ps();
  // A register per row: left to itself, GCC addresses rows 3 and 5 through two more registers
  // that it recomputes at every d (27 instructions per 12 FMAs instead of 24). Instructions count
  // where another thread shares the core's front end (a VM's co-tenant on the other hyperthread:
  // s3r/gemm/roofline.hpp's core check): the fewer a tile issues, the less it loses.
  const float* aj[JT];
#pragma GCC unroll 16
  for (int j = 0; j < JT; ++j) {
    aj[j] = a + j * lda;
    asm("" : "+r"(aj[j]));  // hides that the rows are lda apart
  }
  const float* b = bt;
  for (int64_t d = 0; d < hd; ++d, b += ldb) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 16
    for (int j = 0; j < JT; ++j) {
      const __m256 x = _mm256_broadcast_ss(aj[j] + d);
      c0[j] = _mm256_fmadd_ps(x, b0, c0[j]);
      c1[j] = _mm256_fmadd_ps(x, b1, c1[j]);
    }
  }
  const __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 16
  for (int j = 0; j < JT; ++j) {
    _mm256_storeu_ps(st + j * ldst, _mm256_mul_ps(c0[j], sc));
    _mm256_storeu_ps(st + j * ldst + 8, _mm256_mul_ps(c1[j], sc));
  }
}

// Which of a block pair's scores a diagonal pair leaves out: with the query rows in the lanes
// (the forward), keys 16..31 of rows 0..15; with the keys in the lanes (the backward), rows
// 0..15 of keys 16..31 (the same scores: those keys are masked for those rows).
enum class Lanes { kRows, kKeys };

// The scores of a block pair, st[j * ldst + r] (j < nj the rows of a, r the lanes), per half of
// 16 lanes; in the diagonal pair only the unmasked halves (Lanes). Never inlined: GCC 12 inlines
// it into the backward's pair loop, where unrelated code added to attention_backward_head
// changed its tiles' register use (a copy loop after the pairs made each pair's score tile 45%
// slower, 5.4 against 3.7 k TSC cycles, AMD Zen 3); out of line, its time does not depend on
// its callers, and is the same as inlined today (0.997x forward, 0.998x backward).
__attribute__((noinline)) void score_tile(float* st, int64_t ldst, const float* a, int64_t lda,
                                          const float* bt, int64_t ldb, int64_t hd, int64_t nj,
                                          bool diagonal, float scale, Lanes lanes = Lanes::kRows) {
  constexpr int kJt = 6;  // 2 vectors x 6 keys: 12 accumulators
  for (int64_t half = 0; half < kB; half += 16) {
    const int64_t jn = diagonal && lanes == Lanes::kRows ? std::min(nj, half + 16) : nj;
    int64_t j = diagonal && lanes == Lanes::kKeys ? half : 0;
    // Tiles of 6 keys; 2 keys left over are taken as 4 + 4 from the last 8 (a 2-key tile's 4
    // chains wait on the FMA's latency: 32 keys as 6 x 4 + 4 + 4 took 1.9% less time per AVX2
    // backward head and 0.9-1.6% per forward head than as 6 x 5 + 2, AMD Zen 4, `small`).
    for (; j + kJt <= jn && jn - j != kJt + 2; j += kJt) {
      score_rows<kJt>(st + j * ldst + half, ldst, a + j * lda, lda, bt + half, ldb, hd, scale);
    }
    if (jn - j == kJt + 2) {
      score_rows<4>(st + j * ldst + half, ldst, a + j * lda, lda, bt + half, ldb, hd, scale);
      j += 4;
    }
    const float* aj = a + j * lda;
    float* sj = st + j * ldst + half;
    switch (jn - j) {
      case 5:
        score_rows<5>(sj, ldst, aj, lda, bt + half, ldb, hd, scale);
        break;
      case 4:
        score_rows<4>(sj, ldst, aj, lda, bt + half, ldb, hd, scale);
        break;
      case 3:
        score_rows<3>(sj, ldst, aj, lda, bt + half, ldb, hd, scale);
        break;
      case 2:
        score_rows<2>(sj, ldst, aj, lda, bt + half, ldb, hd, scale);
        break;
      case 1:
        score_rows<1>(sj, ldst, aj, lda, bt + half, ldb, hd, scale);
        break;
      default:
        break;
    }
  }
}

// XT rows x (8 NV) columns of c, the last vector's first `last_n` lanes only (all 8: kFull): c =
// +0 (init) or as read, then for y in [y0, y1) in order c[x, :] = fma(coef[x cx + y cy], r[y, :],
// c[x, :]), the coefficients' strides (cx, cy) = (CX, 32 / CX) with CX 1 or 32; with alpha set,
// first c[x, :] = c[x, :] * alpha[y + x] at each y > y0 that is a multiple of 32 (the forward's
// rescaling as each key block after the first starts: the forward runs over all of a query
// block's keys at once, its accumulators in registers throughout).
// kFull and the constant strides keep the step at 22 instructions per 12 FMAs (why that counts:
// score_rows): with last_n at run time GCC loads every row's last vector masked (its mask
// reloaded from the stack each step), and with run-time strides it adds an address computation
// (26 in all).
template <int XT, int NV, bool kFull, int CX>
void accum_tile(float* c, int64_t ldc, const float* coef, const float* r, int64_t ldr, int64_t y0,
                int64_t y1, bool init, const float* alpha, int64_t last_n_given) {
  static_assert(CX == 1 || CX == kB);
  constexpr int64_t cx = CX, cy = kB / CX;
  const int64_t last_n = kFull ? 8 : last_n_given;
  __m256 acc[XT][NV];
#pragma GCC unroll 16
  for (int x = 0; x < XT; ++x) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      acc[x][v] = init ? _mm256_setzero_ps() : load8(c + x * ldc + 8 * v, v == NV - 1 ? last_n : 8);
    }
  }
  for (int64_t yb = y0; yb < y1;) {
    const int64_t ye = alpha != nullptr ? std::min(y1, (yb / kB + 1) * kB) : y1;
    if (alpha != nullptr && yb != y0) {
#pragma GCC unroll 16
      for (int x = 0; x < XT; ++x) {
        const __m256 a = _mm256_set1_ps(alpha[yb + x]);
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) acc[x][v] = _mm256_mul_ps(acc[x][v], a);
      }
    }
    const float* ry = r + yb * ldr;
    for (const float *cf = coef + yb * cy, *end = coef + ye * cy; cf != end; cf += cy, ry += ldr) {
      __m256 rv[NV];
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) rv[v] = load8(ry + 8 * v, v == NV - 1 ? last_n : 8);
#pragma GCC unroll 16
      for (int x = 0; x < XT; ++x) {
        const __m256 w = _mm256_broadcast_ss(cf + x * cx);
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) acc[x][v] = _mm256_fmadd_ps(w, rv[v], acc[x][v]);
      }
    }
    yb = ye;
  }
#pragma GCC unroll 16
  for (int x = 0; x < XT; ++x) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) store8(c + x * ldc + 8 * v, v == NV - 1 ? last_n : 8, acc[x][v]);
  }
}

// Tiles of one kAttnGroup (4 rows) x 3 vectors: 12 accumulators, 3 row loads, 1 broadcast; a
// tile is one group, so the diagonal pair's ranges are per tile.
constexpr int kXt = static_cast<int>(kAttnGroup);
constexpr int kNv = 3;
using AccumFn = void (*)(float*, int64_t, const float*, const float*, int64_t, int64_t, int64_t,
                         bool, const float*, int64_t);
#define S3R_ACCUM_ROW(X) \
  { accum_tile<X, 1, kFull, CX>, accum_tile<X, 2, kFull, CX>, accum_tile<X, 3, kFull, CX> }
template <bool kFull, int CX>
constexpr AccumFn kAccum[kXt][kNv] = {S3R_ACCUM_ROW(1), S3R_ACCUM_ROW(2), S3R_ACCUM_ROW(3),
                                      S3R_ACCUM_ROW(4)};
#undef S3R_ACCUM_ROW

// As in the AVX-512 twin: which y a row x accumulates over (the diagonal pair's y from yd on).
enum class Range { kAll, kKeysUpToGroup, kRowsFromGroup };

// The coefficients' strides (cx, cy) are (1, 32) or (32, 1): accum_tile has them as constants.
void accum_rows(float* c, int64_t ldc, int64_t nx, const float* coef, int64_t cx,
                [[maybe_unused]] int64_t cy, const float* r, int64_t ldr, int64_t ny, int64_t hd,
                bool init, const float* alpha, Range range, int64_t yd = 0) {
  assert((cx == 1 && cy == kB) || (cx == kB && cy == 1));
  for (int64_t d0 = 0, w = 0; d0 < hd; d0 += w) {
    // Chunks of 24 columns; 32 left are taken as 16 + 16, not 24 + 8 (a one-vector tile's 4
    // chains wait on the FMA's latency).
    w = hd - d0 == 32 ? 16 : std::min<int64_t>(8 * kNv, hd - d0);
    const int64_t nv = (w + 7) / 8;
    const int64_t last_n = w - 8 * (nv - 1);
    for (int64_t x = 0; x < nx; x += kXt) {
      const int64_t xt = std::min<int64_t>(kXt, nx - x);
      const int64_t y0 = range == Range::kRowsFromGroup ? yd + x : 0;
      const int64_t y1 = range == Range::kKeysUpToGroup ? std::min(ny, yd + x + kXt) : ny;
      const bool full = last_n == 8;
      const auto& tiles = cx == 1 ? (full ? kAccum<true, 1> : kAccum<false, 1>)
                                  : (full ? kAccum<true, kB> : kAccum<false, kB>);
      tiles[xt - 1][nv - 1](c + x * ldc + d0, ldc, coef + x * cx, r + d0, ldr, y0, y1, init,
                            alpha != nullptr ? alpha + x : nullptr, last_n);
    }
  }
}

// The forward's online softmax of one block pair for 8 query rows (lanes g .. g + 7; p, ms, ls,
// alpha already offset by g), keys j < jn: p holds the scores p[j * 32 + r] and becomes the
// probabilities; m, l are updated and alpha = exp_poly(m - mnew) written. Key j is masked for
// lane r as lanes_unmasked(g, dj + j, W) says (dj = j0 - i0). kMasked = false: a pair with no
// masked key (below the diagonal, inside the window), whose block maximum is four partial
// maxima (keys j mod 4), then (0, 2), (1, 3), and those two: the same value as the sequential
// maximum (a NaN score is skipped by both; only the sign of a zero maximum can differ, and
// nothing below depends on it: kernels/attention_kernels.hpp).
template <bool kMasked>
void online_softmax_lanes(float* p, float* ms, float* ls, float* alpha, int64_t g, int64_t dj,
                          int64_t jn, int64_t W) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  __m256 mb;
  if constexpr (kMasked) {
    mb = _mm256_set1_ps(-kInf);
    for (int64_t j = 0; j < jn; ++j) {
      const __m256 keep = lanes_unmasked(g, dj + j, W);
      mb = _mm256_blendv_ps(mb, _mm256_max_ps(_mm256_loadu_ps(p + j * kB), mb), keep);
    }
  } else {
    __m256 part[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) part[c] = _mm256_set1_ps(-kInf);
    for (int64_t j = 0; j < jn; j += 4) {  // jn = 32 in a pair with no masked key
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) part[c] = _mm256_max_ps(_mm256_loadu_ps(p + (j + c) * kB), part[c]);
    }
    mb = _mm256_max_ps(_mm256_max_ps(part[1], part[3]), _mm256_max_ps(part[0], part[2]));
  }
  const __m256 m = _mm256_loadu_ps(ms);
  const __m256 mn = _mm256_max_ps(mb, m);
  const __m256 a = exp_poly8(_mm256_sub_ps(m, mn));
  __m256 sum = _mm256_setzero_ps();
  exp_keys(p, kB, mn, jn, [&](int64_t j, __m256 e) {
    if constexpr (kMasked) e = _mm256_and_ps(lanes_unmasked(g, dj + j, W), e);
    _mm256_storeu_ps(p + j * kB, e);
    sum = _mm256_add_ps(sum, e);
  });
  _mm256_storeu_ps(ls, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(ls), a), sum));
  _mm256_storeu_ps(ms, mn);
  _mm256_storeu_ps(alpha, a);
}

// D_i = dout_i . out_i as ref's row_dots: the 8 double lanes (d = l mod 8) as two vectors of 4,
// lanes 0..3 and 4..7; then ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
void row_dots(float* dd, const float* a, const float* b, int64_t rows, int64_t ld, int64_t hd) {
  for (int64_t i = 0; i < rows; ++i) {
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (int64_t c = 0; c < hd; c += 8) {
      const int64_t n = hd - c;
      const __m256 x = load8(a + i * ld + c, n), y = load8(b + i * ld + c, n);
      const __m256d plo = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)),
                                        _mm256_cvtps_pd(_mm256_castps256_ps128(y)));
      const __m256d phi = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)),
                                        _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)));
      if (n >= 8) {
        lo = _mm256_add_pd(lo, plo);
        hi = _mm256_add_pd(hi, phi);
      } else {  // only the lanes below n add (an added +0 could turn a -0 sum into +0)
        const __m256i keep = first_lanes(n);
        const __m256d klo =
            _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(keep)));
        const __m256d khi =
            _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(keep, 1)));
        lo = _mm256_blendv_pd(lo, _mm256_add_pd(lo, plo), klo);
        hi = _mm256_blendv_pd(hi, _mm256_add_pd(hi, phi), khi);
      }
    }
    const __m256d t = _mm256_add_pd(lo, hi);
    const __m128d u = _mm_add_pd(_mm256_castpd256_pd128(t), _mm256_extractf128_pd(t, 1));
    dd[i] = static_cast<float>(_mm_cvtsd_f64(_mm_add_sd(u, _mm_unpackhi_pd(u, u))));
  }
}

// The backward's p and dS of rows [y0, y1) of a block pair, keys [0, 8 NV), in place: the scores
// in p and dP in ds, both [y * ldp + j] (query row y, key j: the keys in the lanes); p =
// exp_poly(s - L_y) and dS = (p (dP - D_y)) scale where key j is unmasked for row y (dj = j0 -
// i0), +0 elsewhere. kMasked = false: a pair with no masked key, whose lane masks are skipped.
// Eight exps at a time (8 / NV rows; six for NV = 3), the rows left one vector at a time.
template <int NV, bool kMasked>
void probs_and_ds_rows(float* p, float* ds, int64_t ldp, const float* L, const float* D,
                       __m256 sc, int64_t dj, int64_t y0, int64_t y1, int64_t W) {
  const auto finish = [&](int64_t y, int c, __m256 e) {
    float* pe = p + y * ldp + 8 * c;
    float* de = ds + y * ldp + 8 * c;
    const __m256 dp = _mm256_sub_ps(_mm256_loadu_ps(de), _mm256_set1_ps(D[y]));
    __m256 d = _mm256_mul_ps(_mm256_mul_ps(e, dp), sc);
    if constexpr (kMasked) {  // key k unmasked for row y: y - dj - W < k <= y - dj
      const __m256 keep = lanes_unmasked(8 * c, y - dj - W + 1, W);
      e = _mm256_and_ps(keep, e);
      d = _mm256_and_ps(keep, d);
    }
    _mm256_storeu_ps(pe, e);
    _mm256_storeu_ps(de, d);
  };
  constexpr int kRows = 8 / NV, kN = kRows * NV;
  int64_t y = y0;
  for (; y + kRows <= y1; y += kRows) {
    __m256 e[kN];
#pragma GCC unroll 8
    for (int t = 0; t < kN; ++t) {
      const int64_t r = y + t / NV;
      e[t] = _mm256_sub_ps(_mm256_loadu_ps(p + r * ldp + 8 * (t % NV)), _mm256_set1_ps(L[r]));
    }
    exp_poly8_n<kN>(e);
#pragma GCC unroll 8
    for (int t = 0; t < kN; ++t) finish(y + t / NV, t % NV, e[t]);
  }
  for (; y < y1; ++y) {
    for (int c = 0; c < NV; ++c) {
      const __m256 s = _mm256_loadu_ps(p + y * ldp + 8 * c);
      finish(y, c, exp_poly8(_mm256_sub_ps(s, _mm256_set1_ps(L[y]))));
    }
  }
}
template <bool kMasked>
void probs_and_ds_rows(int64_t nv, float* p, float* ds, int64_t ldp, const float* L,
                       const float* D, __m256 sc, int64_t dj, int64_t y0, int64_t y1, int64_t W) {
  switch (nv) {
    case 4: return probs_and_ds_rows<4, kMasked>(p, ds, ldp, L, D, sc, dj, y0, y1, W);
    case 3: return probs_and_ds_rows<3, kMasked>(p, ds, ldp, L, D, sc, dj, y0, y1, W);
    case 2: return probs_and_ds_rows<2, kMasked>(p, ds, ldp, L, D, sc, dj, y0, y1, W);
    default: return probs_and_ds_rows<1, kMasked>(p, ds, ldp, L, D, sc, dj, y0, y1, W);
  }
}

// The backward's p and dS of a block pair (ni query rows, nj keys): in the diagonal pair, rows
// 0..15 only for keys 0..15 (the scores score_tile computed).
template <bool kMasked>
void probs_and_ds(float* p, float* ds, int64_t ldp, const float* L, const float* D, __m256 sc,
                  int64_t dj, int64_t ni, int64_t nj, bool diagonal, int64_t W) {
  const int64_t nv = (nj + 7) / 8;
  if (!diagonal) return probs_and_ds_rows<kMasked>(nv, p, ds, ldp, L, D, sc, dj, 0, ni, W);
  const int64_t split = std::min<int64_t>(ni, 16);
  probs_and_ds_rows<kMasked>(std::min<int64_t>(nv, 2), p, ds, ldp, L, D, sc, dj, 0, split, W);
  probs_and_ds_rows<kMasked>(nv, p, ds, ldp, L, D, sc, dj, split, ni, W);
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
  std::fill(ms, ms + kB, std::numeric_limits<float>::lowest());
  std::fill(ls, ls + kB, 0.0f);
  const int64_t pairs = visited_pairs(S, h.window), pair0 = visited_pairs(i0, h.window);
  for (int64_t j0 = jfirst; j0 <= i0; j0 += kB) {
    const int64_t nj = std::min(kB, S - j0);
    const bool diagonal = j0 == i0;
    prefetch_next_block(h, i0, j0, jfirst);
    prefetch_next_call(next, pair0 + (j0 - jfirst) / kB, pairs, 0, 1);
    float* pb = p + (j0 - jfirst) * kB;
    float* ab = alpha + (j0 - jfirst);
    score_tile(pb, kB, h.k + j0 * ldkv, ldkv, qt, kB, HD, nj, diagonal, h.scale);
    const bool full = pair_unmasked(i0, ni, j0, W);
    for (int64_t g = 0; g < kB; g += 8) {  // lanes g..g+7 of the 32 query rows
      // In the diagonal pair, keys past the 16-row half's last row: masked, scores not computed.
      const int64_t jn = diagonal ? std::min(nj, (g / 16) * 16 + 16) : nj;
      if (full) {
        online_softmax_lanes<false>(pb + g, ms + g, ls + g, ab + g, g, j0 - i0, jn, W);
      } else {
        online_softmax_lanes<true>(pb + g, ms + g, ls + g, ab + g, g, j0 - i0, jn, W);
      }
    }
  }
  // acc = p v over all the keys at once, rescaled by each key block's alpha as it starts.
  accum_rows(acc, HD, ni, p, 1, kB, h.v + jfirst * ldkv, ldkv, nk, HD, true, alpha,
             Range::kKeysUpToGroup, i0 - jfirst);
  const bool lines = out_rows_are_lines(out, h);  // then streamed (kernels/attention_rows.hpp)
  for (int64_t r = 0; r < ni; ++r) {
    const __m256 lv = _mm256_set1_ps(ls[r]);
    float* o = out + (i0 + r) * ld;
    for (int64_t d = 0; d < HD; d += 8) {
      const __m256 y = _mm256_div_ps(load8(acc + r * HD + d, HD - d), lv);
      if (lines) {
        _mm256_stream_ps(o + d, y);
      } else {
        store8(o + d, HD - d, y);
      }
    }
    lse[i0 + r] = ref::attention_lse(ms[r], ls[r]);
  }
  if (lines) _mm_sfence();
}

void attention_backward_head(float* dq, float* dk, float* dv, const float* dout, const float* out,
                             const float* lse, const AttnHead& h, float* scratch,
                             const AttnNextRows* next) {
  const int64_t S = h.seq_len, HD = h.head_dim, ld = h.ld, Sp = attention_padded(S);
  const int64_t lddkv = h.ld_dkv, lp = kAttnBackwardPairs * kB;
  float* qc = scratch;         // (Sp, HD): q's rows, contiguous
  float* doc = qc + Sp * HD;   // (Sp, HD): dout's rows
  float* kt = doc + Sp * HD;   // (HD, 32): key block j0's k transposed
  float* vt = kt + HD * kB;    // (HD, 32): its v transposed
  float* kj = vt + HD * kB;    // (32, HD): its k rows
  float* D = kj + kB * HD;     // (Sp)
  float* L = D + Sp;           // (Sp)
  float* p = L + Sp;           // (lp, 32): p[y * 32 + j], y a row of the pairs taken together
  float* ds = p + lp * kB;     // (lp, 32)
  // The keys in the lanes of the pairs' scores: the head's q and dout are read as rows (from
  // contiguous copies: kernels/attention_rows.hpp) and only the current key block's k and v are
  // transposed. The scratch at `small` (S 256, HD 64) is 170 KB, where q and dout transposed as
  // well as copied, and k and v copied, took 402: beside it a 512 KB L2 (AMD Zen 3) now holds
  // the pairs' rows and a share of the next call's (model/attention.cpp). On an AMD Zen 3 (one
  // thread, 64 heads of `small` from memory, alternating in one process) 5-6% less time per
  // backward head than the query rows in the lanes, 4-5% at `wide`'s HD 128; the rows in cache,
  // 70-71% of the FMA limit against 68%.
  compact_rows(qc, h.q, ld, S, HD);
  compact_rows(doc, dout, ld, S, HD);
  row_dots(D, dout, out, S, ld, HD);
  std::copy(lse, lse + S, L);
  // dq, dk, dv are not zeroed: each row's first accumulation starts from +0 (init).

  const __m256 sc = _mm256_set1_ps(h.scale);
  const int64_t W = window_or_all(h.window);
  const int64_t pairs = visited_pairs(S, h.window);
  int64_t kv_block = -1;  // the key block kt, vt, kj hold
  for_each_backward_pair(
      h,
      [&](int64_t j0, int64_t i0, int64_t g0, int64_t pair) {
        const int64_t nj = std::min(kB, S - j0), ni = std::min(kB, S - i0);
        const bool diagonal = i0 == j0;
        float* pp = p + (i0 - g0) * kB;  // p and dS of the pairs taken together: row g0 + y at y
        float* dsp = ds + (i0 - g0) * kB;
        if (j0 != kv_block) {
          transpose_block(kt, kB, h.k + j0 * h.ld_kv, h.ld_kv, nj, HD, kj);
          transpose_block(vt, kB, h.v + j0 * h.ld_kv, h.ld_kv, nj, HD);
          kv_block = j0;
        }
        prefetch_next_call(next, pair, pairs, 0, 4);
        score_tile(pp, kB, qc + i0 * HD, HD, kt, kB, HD, ni, diagonal, h.scale, Lanes::kKeys);
        prefetch_next_call(next, pair, pairs, 1, 4);
        score_tile(dsp, kB, doc + i0 * HD, HD, vt, kB, HD, ni, diagonal, 1.0f, Lanes::kKeys);
        prefetch_next_call(next, pair, pairs, 2, 4);
        if (pair_unmasked(i0, ni, j0, W)) {
          probs_and_ds<false>(pp, dsp, kB, L + i0, D + i0, sc, 0, ni, nj, diagonal, W);
        } else {
          probs_and_ds<true>(pp, dsp, kB, L + i0, D + i0, sc, j0 - i0, ni, nj, diagonal, W);
        }
        prefetch_next_call(next, pair, pairs, 3, 4);
        accum_rows(dq + i0 * ld, ld, ni, dsp, kB, 1, kj, HD, nj, HD,
                   j0 == first_key_block(i0, h.window), nullptr,
                   diagonal ? Range::kKeysUpToGroup : Range::kAll);
      },
      [&](int64_t j0, int64_t g0, int64_t rows) {  // dv, dk over all the pairs' rows at once
        const int64_t nj = std::min(kB, S - j0);
        const bool first = g0 == j0;
        const Range range = first ? Range::kRowsFromGroup : Range::kAll;
        accum_rows(dv + j0 * lddkv, lddkv, nj, p, 1, kB, doc + g0 * HD, HD, rows, HD, first,
                   nullptr, range);
        accum_rows(dk + j0 * lddkv, lddkv, nj, ds, 1, kB, qc + g0 * HD, HD, rows, HD, first,
                   nullptr, range);
      });
}

}  // namespace s3r::kernels::avx2
