// AVX-512 fused backward quantizer; operation for operation the same as kernels/ref
// (bit-exact codes). Thresholds are made in registers: one scalar Threefry word per token for
// s3r/s3r-bcast, 16-lane Threefry for sr. Nothing random is written to memory.
#include "kernels/avx512/common_avx512.hpp"
#include "kernels/grad_dispatch.hpp"
#include "kernels/kernels.hpp"
#include "s3r/quant/thresholds.hpp"

namespace s3r::kernels::avx512 {

namespace {

template <typename G>
float absmax_rows(const G* g, const GradProblem& p, int64_t r0, int64_t r1, bool* nonfinite) {
  const int64_t N = p.channels;
  __m512 vmax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int64_t t = r0; t < r1; ++t) {
    const __m512 vsx = _mm512_set1_ps(p.sx[t]);
    const G* row = g + t * N;
    for_each_vector16(0, N, [&](int64_t n, auto m) {
      const __m512 v = load16(row + n, m);
      bad |= nonfinite_lanes(v);
      const __m512 gp = _mm512_mul_ps(_mm512_mul_ps(vsx, v), _mm512_maskz_loadu_ps(m, p.sw + n));
      vmax = _mm512_max_ps(vmax, _mm512_abs_ps(gp));
    });
  }
  if (bad) *nonfinite = true;
  return _mm512_reduce_max_ps(vmax);
}

// Elements of G ahead of the loop that the second pass prefetches: G comes back from memory (it
// is read once per pass), and the pass's arithmetic did not overlap those misses: `wide`'s dY
// quantization took a median 33.6 against 38.1 ms per step in six alternations on a Zen 4
// (1024 ahead: the same).
constexpr int64_t kAhead = 256;

// Rows [r0, r1) for the quantizations 0..count-1. Mode and statistics are template parameters so
// that the inner loop carries no branches.
template <GradRounding kMode, bool kStats, typename G>
void quantize_rows(const G* g, const GradProblem& p, float step, int64_t r0, int64_t r1,
                   const GradBlockOut& out) {
  const int64_t N = p.channels;
  const __m512 vstep = _mm512_set1_ps(step);
  for (int q = 0; q < p.count; ++q) {
    if constexpr (kStats) {
      for (int64_t n = 0; n < N; ++n) out.col_sums[q][n] = 0.0f;
    }
  }
  for (int64_t t = r0; t < r1; ++t) {
    const __m512 vsx = _mm512_set1_ps(p.sx[t]);
    __m512 shared_r = _mm512_setzero_ps();
    if constexpr (kMode == GradRounding::kS3r) {
      shared_r = _mm512_set1_ps(threshold7(p.keys[0], p.row_id(t)));
    } else if constexpr (kMode == GradRounding::kS3rBcast) {
      shared_r = _mm512_set1_ps(threshold7(p.keys[0], p.example_id(t)));
    }
    const uint64_t base = p.row_id(t) * static_cast<uint64_t>(N);  // global flat index of (t, 0)
    for (int q = 0; q < p.count; ++q) {
      int8_t* codes = out.codes[q] + t * N;
      float* col_sums = kStats ? out.col_sums[q] : nullptr;
      __m512 row_acc = _mm512_setzero_ps();
      for_each_vector16(0, N, [&](int64_t n, auto m) {
        _mm_prefetch(reinterpret_cast<const char*>(g + t * N + n + kAhead), _MM_HINT_T0);
        const __m512 gp = _mm512_mul_ps(_mm512_mul_ps(vsx, load16(g + t * N + n, m)),
                                        _mm512_maskz_loadu_ps(m, p.sw + n));
        const __m512 x = _mm512_div_ps(gp, vstep);  // inactive lanes: 0
        __m512 qf;
        if constexpr (kMode == GradRounding::kRtne) {
          qf = round_nearest_even(x);
        } else if constexpr (kMode == GradRounding::kSr) {
          const __m512i bits = random_bits16(p.keys[q], base + static_cast<uint64_t>(n));
          qf = round_floor(_mm512_add_ps(x, uniform23_16(bits)));
        } else {
          qf = round_floor(_mm512_add_ps(x, shared_r));
        }
        qf = clamp_code16(qf);
        store_codes16(codes + n, m, qf);
        if constexpr (kStats) {
          // Inactive lanes hold x = 0 and qf = floor(0 + r) = 0, so e = 0 there.
          const __m512 e = _mm512_sub_ps(qf, x);
          row_acc = _mm512_add_ps(row_acc, e);
          _mm512_mask_storeu_ps(col_sums + n, m,
                                _mm512_add_ps(_mm512_maskz_loadu_ps(m, col_sums + n), e));
        }
      });
      if constexpr (kStats) out.row_sums[q][t] = _mm512_reduce_add_ps(row_acc);
    }
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
    quantize_rows<kMode, kStats>(g, p, step, r0, r1, out);
  });
}

}  // namespace s3r::kernels::avx512
