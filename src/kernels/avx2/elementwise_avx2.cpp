// AVX2 element-wise and row kernels (SwiGLU, GeGLU, softmax cross-entropy, RMSNorm, bf16 rounding);
// operation for operation the same as kernels/ref
// (bit-exact, no FMA), including the polynomial exp.
#include <cmath>

#include "kernels/avx2/common_avx2.hpp"
#include "kernels/kernels.hpp"
#include "kernels/ref/numerics.hpp"

namespace s3r::kernels::avx2 {

namespace {

// 1 / (1 + exp(-z)); -z by flipping the sign bit, exactly the reference's negation.
inline __m256 sigmoid8(__m256 z) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp_poly8(_mm256_xor_ps(z, _mm256_set1_ps(-0.0f)))));
}

// kernels/ref's gelu_clamp, gelu_gate and gelu_slope. max(-10, z) then min(10, .): a NaN lane
// is the second operand of each, so it stays NaN as in the reference.
inline __m256 gelu_clamp8(__m256 z) {
  return _mm256_min_ps(_mm256_set1_ps(ref::kGeluClamp), _mm256_max_ps(_mm256_set1_ps(-ref::kGeluClamp), z));
}
inline __m256 gelu_gate8(__m256 c) {
  const __m256 c2 = _mm256_mul_ps(c, c);
  const __m256 poly = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(_mm256_set1_ps(ref::kGeluA), c2));
  return sigmoid8(_mm256_mul_ps(_mm256_mul_ps(c, _mm256_set1_ps(ref::kGeluK)), poly));
}
inline __m256 gelu_slope8(__m256 c, __m256 s) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 poly = _mm256_add_ps(one, _mm256_mul_ps(_mm256_set1_ps(ref::kGelu3A), _mm256_mul_ps(c, c)));
  const __m256 t = _mm256_mul_ps(c, _mm256_mul_ps(s, _mm256_sub_ps(one, s)));
  return _mm256_add_ps(s, _mm256_mul_ps(t, _mm256_mul_ps(_mm256_set1_ps(ref::kGeluK), poly)));
}

}  // namespace

void geglu_forward_ew(float* hidden, const float* h1, const float* h3, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; i += 8) {
    const int64_t m = i1 - i;
    const __m256 a = load8(h1 + i, m);
    store8(hidden + i, m, _mm256_mul_ps(_mm256_mul_ps(a, gelu_gate8(gelu_clamp8(a))), load8(h3 + i, m)));
  }
}

void geglu_backward_ew(float* dh1, float* dh3, const float* dh, const float* h1, const float* h3,
                       int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; i += 8) {
    const int64_t m = i1 - i;
    const __m256 a = load8(h1 + i, m);
    const __m256 g = load8(dh + i, m);
    const __m256 c = gelu_clamp8(a);
    const __m256 s = gelu_gate8(c);
    store8(dh3 + i, m, _mm256_mul_ps(g, _mm256_mul_ps(a, s)));
    store8(dh1 + i, m, _mm256_mul_ps(_mm256_mul_ps(g, load8(h3 + i, m)), gelu_slope8(c, s)));
  }
}

void swiglu_forward_ew(float* hidden, const float* h1, const float* h3, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; i += 8) {
    const int64_t m = i1 - i;  // load8 / store8 touch the first min(m, 8) lanes only
    const __m256 a = load8(h1 + i, m);
    store8(hidden + i, m, _mm256_mul_ps(_mm256_mul_ps(a, sigmoid8(a)), load8(h3 + i, m)));
  }
}

void swiglu_backward_ew(float* dh1, float* dh3, const float* dh, const float* h1, const float* h3,
                        int64_t i0, int64_t i1) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t i = i0; i < i1; i += 8) {
    const int64_t m = i1 - i;
    const __m256 a = load8(h1 + i, m);
    const __m256 g = load8(dh + i, m);
    const __m256 s = sigmoid8(a);
    store8(dh3 + i, m, _mm256_mul_ps(g, _mm256_mul_ps(a, s)));
    const __m256 dsilu =
        _mm256_mul_ps(s, _mm256_add_ps(one, _mm256_mul_ps(a, _mm256_sub_ps(one, s))));
    store8(dh1 + i, m, _mm256_mul_ps(_mm256_mul_ps(g, load8(h3 + i, m)), dsilu));
  }
}

bool softmax_xent_rows(float* z, double* loss, const int32_t* targets, int64_t r0, int64_t r1,
                       int64_t vocab, float grad_scale) {
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t r = r0; r < r1; ++r) {
    float* row = z + r * vocab;
    const int32_t y = targets[r];
    __m256 vmax = _mm256_set1_ps(row[0]);
    __m256 finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for_each_vector8(0, vocab, [&](int64_t i, auto m) {
      const __m256 v = _mm256_blendv_ps(vmax, maskload8(row + i, m), _mm256_castsi256_ps(m));
      finite = _mm256_and_ps(finite, _mm256_cmp_ps(_mm256_sub_ps(v, v), zero, _CMP_EQ_OQ));  // x - x == 0 iff finite
      vmax = _mm256_max_ps(vmax, v);
    });
    if (_mm256_movemask_ps(finite) != 0xFF) return false;
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float mx = lanes[0];
    for (float v : lanes) mx = v > mx ? v : mx;  // max is exact in any order
    const float zy = row[y];
    const __m256 vm = _mm256_set1_ps(mx);
    // Partials 0..15 of the reference: i = 16 c + j adds to partial j.
    __m256d p0 = _mm256_setzero_pd(), p1 = _mm256_setzero_pd(), p2 = _mm256_setzero_pd(), p3 = _mm256_setzero_pd();
    // The next row's lines are fetched while its exps run (the AVX-512 tier's note).
    const float* next = r + 1 < r1 ? row + vocab : nullptr;
    for_each_vector8_pair(0, vocab, [&](int64_t i, auto m0, auto m1) {
      if (next != nullptr) _mm_prefetch(reinterpret_cast<const char*>(next + i), _MM_HINT_T0);
      const __m256 e0 = _mm256_and_ps(exp_poly8(_mm256_sub_ps(maskload8(row + i, m0), vm)), _mm256_castsi256_ps(m0));
      const __m256 e1 = _mm256_and_ps(exp_poly8(_mm256_sub_ps(maskload8(row + i + 8, m1), vm)), _mm256_castsi256_ps(m1));
      maskstore8(row + i, m0, e0);
      maskstore8(row + i + 8, m1, e1);
      p0 = _mm256_add_pd(p0, _mm256_cvtps_pd(_mm256_castps256_ps128(e0)));
      p1 = _mm256_add_pd(p1, _mm256_cvtps_pd(_mm256_extractf128_ps(e0, 1)));
      p2 = _mm256_add_pd(p2, _mm256_cvtps_pd(_mm256_castps256_ps128(e1)));
      p3 = _mm256_add_pd(p3, _mm256_cvtps_pd(_mm256_extractf128_ps(e1, 1)));
    });
    alignas(32) double partial[16];
    _mm256_store_pd(partial, p0);
    _mm256_store_pd(partial + 4, p1);
    _mm256_store_pd(partial + 8, p2);
    _mm256_store_pd(partial + 12, p3);
    double sum = 0.0;
    for (double p : partial) sum += p;
    loss[r] = (std::log(sum) + static_cast<double>(mx)) - static_cast<double>(zy);
    const float inv = static_cast<float>(1.0 / sum);
    const float ey = row[y];
    const __m256 vinv = _mm256_set1_ps(inv), vscale = _mm256_set1_ps(grad_scale);
    for_each_vector8(0, vocab, [&](int64_t i, auto m) {
      const __m256 e = maskload8(row + i, m);
      maskstore8(row + i, m, _mm256_mul_ps(_mm256_mul_ps(e, vinv), vscale));
    });
    row[y] = (ey * inv - 1.0f) * grad_scale;  // the one-hot term (e * inv - 0 = e * inv elsewhere)
  }
  return true;
}

namespace {

// The reference's 16 interleaved double partial sums: p[q] holds partials 4q..4q+3.
struct Partials16 {
  __m256d p[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  void add_pd(int q, __m256d v) { p[q] = _mm256_add_pd(p[q], v); }
  double sum() const {
    alignas(32) double partial[16];
    for (int q = 0; q < 4; ++q) _mm256_store_pd(partial + 4 * q, p[q]);
    double s = 0.0;
    for (double x : partial) s += x;
    return s;
  }
};

// The four doubles of lanes 4q..4q+3 of the 16 floats (v0 lanes 0..7, v1 lanes 8..15).
inline __m256d quarter_pd(__m256 v0, __m256 v1, int q) {
  const __m256 v = q < 2 ? v0 : v1;
  return _mm256_cvtps_pd(q % 2 == 0 ? _mm256_castps256_ps128(v) : _mm256_extractf128_ps(v, 1));
}

}  // namespace

void rmsnorm_rows(float* out, float* rstd, const float* x, const float* weight, int64_t r0,
                  int64_t r1, int64_t width, float eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * width;
    Partials16 acc;
    for_each_vector8_pair(0, width, [&](int64_t c, auto m0, auto m1) {
      const __m256 v0 = maskload8(xr + c, m0);  // tail lanes add 0
      const __m256 v1 = maskload8(xr + c + 8, m1);
      for (int q = 0; q < 4; ++q) {
        const __m256d d = quarter_pd(v0, v1, q);
        acc.add_pd(q, _mm256_mul_pd(d, d));
      }
    });
    const double ss = acc.sum();
    const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(width) + static_cast<double>(eps)));
    rstd[r] = rs;
    const __m256 vr = _mm256_set1_ps(rs);
    for_each_vector8(0, width, [&](int64_t c, auto m) {
      const __m256 v = _mm256_mul_ps(_mm256_mul_ps(maskload8(xr + c, m), vr), maskload8(weight + c, m));
      maskstore8(out + r * width + c, m, v);
    });
  }
}

void rmsnorm_backward_rows(float* dx, const float* dy, const float* x, const float* weight,
                           const float* rstd, int64_t r0, int64_t r1, int64_t width) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * width;
    const float* g = dy + r * width;
    Partials16 acc;
    for_each_vector8_pair(0, width, [&](int64_t c, auto m0, auto m1) {
      const __m256 x0 = maskload8(xr + c, m0), x1 = maskload8(xr + c + 8, m1);
      const __m256 w0 = maskload8(weight + c, m0), w1 = maskload8(weight + c + 8, m1);
      const __m256 g0 = maskload8(g + c, m0), g1 = maskload8(g + c + 8, m1);
      for (int q = 0; q < 4; ++q) {
        acc.add_pd(q, _mm256_mul_pd(_mm256_mul_pd(quarter_pd(x0, x1, q), quarter_pd(w0, w1, q)), quarter_pd(g0, g1, q)));
      }
    });
    const double dot = acc.sum();
    const double rr = rstd[r];
    const double k = rr * rr * rr * dot / static_cast<double>(width);
    const __m256d vr = _mm256_set1_pd(rr), vk = _mm256_set1_pd(k);
    const auto update = [&](const float* w4, const float* g4, const float* x4, float* d4) {
      const __m256d v = _mm256_sub_pd(
          _mm256_mul_pd(_mm256_mul_pd(vr, _mm256_cvtps_pd(_mm_loadu_ps(w4))), _mm256_cvtps_pd(_mm_loadu_ps(g4))),
          _mm256_mul_pd(vk, _mm256_cvtps_pd(_mm_loadu_ps(x4))));
      _mm_storeu_ps(d4, _mm_add_ps(_mm_loadu_ps(d4), _mm256_cvtpd_ps(v)));
    };
    float* d = dx + r * width;
    int64_t c = 0;
    for (; c + 4 <= width; c += 4) update(weight + c, g + c, xr + c, d + c);
    if (c < width) {  // the last 1..3 columns through a zero-padded buffer
      float wb[4] = {}, gb[4] = {}, xb[4] = {}, db[4] = {};
      for (int64_t j = 0; c + j < width; ++j) {
        wb[j] = weight[c + j];
        gb[j] = g[c + j];
        xb[j] = xr[c + j];
        db[j] = d[c + j];
      }
      update(wb, gb, xb, db);
      for (int64_t j = 0; c + j < width; ++j) d[c + j] = db[j];
    }
  }
}

namespace {

// to_bf16 of 8 floats' bits, each in the low half of its 32-bit lane: a NaN (|u| > Inf's bits)
// keeps its top half with the quiet bit set; otherwise u + 0x7FFF + (bit 16 of u), top half.
inline __m256i bf16_bits8(__m256i u) {
  const __m256i top = _mm256_srli_epi32(u, 16);
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                            _mm256_set1_epi32(0x7F800000));
  const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), _mm256_and_si256(top, _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  return _mm256_blendv_epi8(rounded, _mm256_or_si256(top, _mm256_set1_epi32(0x40)), is_nan);
}

}  // namespace

void round_bf16(bf16* out, float* widened, const float* x, int64_t i0, int64_t i1) {
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    const __m256i a = bf16_bits8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
    const __m256i b = bf16_bits8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)));
    if (out != nullptr) {  // 32 -> 16 bits (no value exceeds 0xFFFF), lanes back in order
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
    }
    if (widened != nullptr) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(widened + i), _mm256_slli_epi32(a, 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(widened + i + 8), _mm256_slli_epi32(b, 16));
    }
  }
  ref::round_bf16(out, widened, x, i, i1);
}

}  // namespace s3r::kernels::avx2
