// AVX2 fused backward quantizer; operation for operation the same as kernels/ref (bit-exact
// codes). The AVX-512 twin on 8 lanes, two vectors (16 elements) per iteration: thresholds are
// made in registers (one scalar Threefry word per token for s3r/s3r-bcast; for sr, 8-lane
// Threefry, the two vectors' chains interleaved and both products in the same iteration);
// nothing random is written to memory. No FMA: every product and sum is rounded where the
// reference rounds it. Row tails of 1..15 channels use masked / buffered loads and stores.
#include "kernels/avx2/common_avx2.hpp"
#include "kernels/grad_dispatch.hpp"
#include "kernels/kernels.hpp"
#include "s3r/quant/thresholds.hpp"


namespace s3r::kernels::avx2 {

namespace {

// sr thresholds uniform23(random_bits32(key, base + lane)) of the 16 elements base .. base + 15.
S3R_ALWAYS_INLINE void sr_thresholds16(Key key, uint64_t base, __m256* r0, __m256* r1) {
  __m256i y[2];
  random_bits8xN<2>(key, base, y);  // two chains interleaved: one alone is latency-bound
  *r0 = uniform23_8(y[0]);
  *r1 = uniform23_8(y[1]);
}

// x = ((sx * g) * sw) / step of the first m lanes (m >= 8: all); the others read g = sw = 0, so
// x = 0 there.
template <typename G>
S3R_ALWAYS_INLINE __m256 scaled8(const G* g, const float* sw, __m256 vsx, __m256 vstep,
                                 int64_t m) {
  return _mm256_div_ps(_mm256_mul_ps(_mm256_mul_ps(vsx, load8(g, m)), load8(sw, m)), vstep);
}

// The clamped code (as f32) of x with threshold r: rne(x) under rtne (r unused), else
// floor(x + r) (one f32 add, then floor), then the clamp: ref::rtne_code / ref::sr_code.
template <GradRounding kMode>
S3R_ALWAYS_INLINE __m256 code8(__m256 x, __m256 r) {
  if constexpr (kMode == GradRounding::kRtne) {
    return clamp_code8(round_nearest_even(x));
  } else {
    return clamp_code8(round_floor(_mm256_add_ps(x, r)));
  }
}

// The 16 int8 codes of two integer-valued vectors in [-127, 127] (a: 0..7, b: 8..15).
S3R_ALWAYS_INLINE void store_codes16(int8_t* dst, __m256 a, __m256 b) {
  // packs_epi32 works per 128-bit half: [a0-3 b0-3 | a4-7 b4-7]; reorder to [a0-7 | b0-7].
  const __m256i i16 = _mm256_permute4x64_epi64(
      _mm256_packs_epi32(_mm256_cvtps_epi32(a), _mm256_cvtps_epi32(b)), _MM_SHUFFLE(3, 1, 2, 0));
  const __m128i i8 =
      _mm_packs_epi16(_mm256_castsi256_si128(i16), _mm256_extracti128_si256(i16, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), i8);
}

// e = Q - x into the row accumulator and into the column sums of the first m lanes. Inactive
// lanes hold x = 0 and Q = rne(0) = floor(0 + r) = 0 (r in [0, 1)), so e = 0 there.
S3R_ALWAYS_INLINE void add_errors8(__m256 qf, __m256 x, __m256* row_acc, float* col_sums,
                                   int64_t m) {
  const __m256 e = _mm256_sub_ps(qf, x);
  *row_acc = _mm256_add_ps(*row_acc, e);
  store8(col_sums, m, _mm256_add_ps(load8(col_sums, m), e));
}

template <typename G>
float absmax_rows(const G* g, const GradProblem& p, int64_t r0, int64_t r1, bool* nonfinite) {
  const int64_t N = p.channels;
  const float* sw = p.sw;
  __m256 vmax0 = _mm256_setzero_ps();
  __m256 vmax1 = _mm256_setzero_ps();
  __m256i bad = _mm256_setzero_si256();
  for (int64_t t = r0; t < r1; ++t) {
    const __m256 vsx = _mm256_set1_ps(p.sx[t]);
    const G* row = g + t * N;
    int64_t n = 0;
    for (; n + 16 <= N; n += 16) {
      const __m256 v0 = load8(row + n, 8);
      const __m256 v1 = load8(row + n + 8, 8);
      bad = _mm256_or_si256(bad, _mm256_or_si256(nonfinite_lanes(v0), nonfinite_lanes(v1)));
      const __m256 gp0 = _mm256_mul_ps(_mm256_mul_ps(vsx, v0), load8(sw + n, 8));
      const __m256 gp1 = _mm256_mul_ps(_mm256_mul_ps(vsx, v1), load8(sw + n + 8, 8));
      vmax0 = _mm256_max_ps(vmax0, abs8(gp0));
      vmax1 = _mm256_max_ps(vmax1, abs8(gp1));
    }
    for (; n < N; n += 8) {  // the last 1..15 channels: one or two vectors, the last partial
      const __m256 v = load8(row + n, N - n);  // inactive lanes read as 0
      bad = _mm256_or_si256(bad, nonfinite_lanes(v));
      const __m256 gp = _mm256_mul_ps(_mm256_mul_ps(vsx, v), load8(sw + n, N - n));
      vmax0 = _mm256_max_ps(vmax0, abs8(gp));
    }
  }
  if (any_lane(bad)) *nonfinite = true;
  return reduce_max8(_mm256_max_ps(vmax0, vmax1));
}

// Rows [r0, r1) for the quantizations 0..kCount-1, fused: x is formed once per element and
// rounded once per quantization (sr: its own key per product; the other modes: the shared
// threshold of key 0, as in the reference). Mode, statistics and count are template parameters
// so that the inner loop carries no branches. The row sum of a quantization is accumulated in
// 16 f32 lanes (two vectors: channels n with n % 16 < 8, and the others) and reduced once per
// row; column sums are updated row after row, in the reference's order (bit-identical).
template <GradRounding kMode, bool kStats, int kCount, typename G>
void quantize_rows(const G* g, const GradProblem& p, float step, int64_t r0, int64_t r1,
                   const GradBlockOut& out) {
  const int64_t N = p.channels;
  const float* sw = p.sw;
  const __m256 vstep = _mm256_set1_ps(step);
  if constexpr (kStats) {
    for (int q = 0; q < kCount; ++q) {
      for (int64_t n = 0; n < N; ++n) out.col_sums[q][n] = 0.0f;
    }
  }
  for (int64_t t = r0; t < r1; ++t) {
    const __m256 vsx = _mm256_set1_ps(p.sx[t]);
    __m256 shared_r = _mm256_setzero_ps();
    if constexpr (kMode == GradRounding::kS3r) {
      shared_r = _mm256_set1_ps(threshold7(p.keys[0], p.row_id(t)));
    } else if constexpr (kMode == GradRounding::kS3rBcast) {
      shared_r = _mm256_set1_ps(threshold7(p.keys[0], p.example_id(t)));
    }
    const G* grow = g + t * N;
    const uint64_t base = p.row_id(t) * static_cast<uint64_t>(N);  // global flat index of (t, 0)
    int8_t* codes[kCount];
    float* col_sums[kCount];
    __m256 acc0[kCount], acc1[kCount];
#pragma GCC unroll 2
    for (int q = 0; q < kCount; ++q) {
      codes[q] = out.codes[q] + t * N;
      col_sums[q] = kStats ? out.col_sums[q] : nullptr;
      acc0[q] = _mm256_setzero_ps();
      acc1[q] = _mm256_setzero_ps();
    }
    int64_t n = 0;
    for (; n + 16 <= N; n += 16) {
      const __m256 x0 = scaled8(grow + n, sw + n, vsx, vstep, 8);
      const __m256 x1 = scaled8(grow + n + 8, sw + n + 8, vsx, vstep, 8);
#pragma GCC unroll 2
      for (int q = 0; q < kCount; ++q) {
        __m256 th0 = shared_r, th1 = shared_r;
        if constexpr (kMode == GradRounding::kSr) {
          sr_thresholds16(p.keys[q], base + static_cast<uint64_t>(n), &th0, &th1);
        }
        const __m256 qf0 = code8<kMode>(x0, th0);
        const __m256 qf1 = code8<kMode>(x1, th1);
        store_codes16(codes[q] + n, qf0, qf1);
        if constexpr (kStats) {
          add_errors8(qf0, x0, &acc0[q], col_sums[q] + n, 8);
          add_errors8(qf1, x1, &acc1[q], col_sums[q] + n + 8, 8);
        }
      }
    }
    // The last 1..15 channels: a vector at n (into acc0) and, past 8 of them, one at n + 8
    // (acc1), the last one partial (load8 / store8 / store_codes8 touch min(m, 8) lanes).
    const auto tail_vector = [&](int64_t n0, int64_t m,
                                  __m256* acc) __attribute__((always_inline)) {
      const __m256 x = scaled8(grow + n0, sw + n0, vsx, vstep, m);
#pragma GCC unroll 2
      for (int q = 0; q < kCount; ++q) {
        __m256 th = shared_r;
        if constexpr (kMode == GradRounding::kSr) {
          __m256i bits;
          random_bits8xN<1>(p.keys[q], base + static_cast<uint64_t>(n0), &bits);
          th = uniform23_8(bits);
        }
        const __m256 qf = code8<kMode>(x, th);
        store_codes8(codes[q] + n0, m, qf);
        if constexpr (kStats) add_errors8(qf, x, &acc[q], col_sums[q] + n0, m);
      }
    };
    if (n < N) {
      tail_vector(n, N - n, acc0);
      if (N - n > 8) tail_vector(n + 8, N - n - 8, acc1);
    }
    if constexpr (kStats) {
#pragma GCC unroll 2
      for (int q = 0; q < kCount; ++q) {
        out.row_sums[q][t] = reduce_add8(_mm256_add_ps(acc0[q], acc1[q]));
      }
    }
  }
}

template <GradRounding kMode, bool kStats, typename G>
void quantize_dispatch_count(const G* g, const GradProblem& p, float step, int64_t r0, int64_t r1,
                             const GradBlockOut& out) {
  if (p.count == 2) {
    quantize_rows<kMode, kStats, 2>(g, p, step, r0, r1, out);
  } else {
    quantize_rows<kMode, kStats, 1>(g, p, step, r0, r1, out);
  }
}

}  // namespace

float grad_absmax(const GradProblem& p, int64_t r0, int64_t r1, bool* nonfinite) {
  return p.g_f32 ? absmax_rows(p.g_f32, p, r0, r1, nonfinite)
                 : absmax_rows(p.g_bf16, p, r0, r1, nonfinite);
}

void grad_quantize(const GradProblem& p, float step, int64_t r0, int64_t r1,
                   const GradBlockOut& out) {
  for_grad_variant(p, out, [&]<GradRounding kMode, bool kStats>(const auto* g) {
    quantize_dispatch_count<kMode, kStats>(g, p, step, r0, r1, out);
  });
}

}  // namespace s3r::kernels::avx2

#undef S3R_ALWAYS_INLINE
