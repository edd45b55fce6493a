// AVX-512 packing and epilogue of s3r's int8-panel GEMM (kernels/gemm_s8.hpp), shared by its AMX
// and VNNI blocks: interleaves of four 16-byte rows into quads and a 16 x 16 transpose of 32-bit
// words for the k-major operands; the epilogue is the reference's f32 operations on 16 columns
// at a time. Byte for byte (and bit for bit) the reference's (kernels/ref/gemm_s8_ref.cpp).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/avx512/common_avx512.hpp"
#include "kernels/gemm_s8.hpp"
#include "kernels/kernels.hpp"

namespace s3r::kernels::avx512 {

namespace {

// Bytes [4 j + t] = r_t[j] of four rows of 16 codes: the quads of 16 columns (AMX's B rows).
inline __m512i interleave4(__m128i r0, __m128i r1, __m128i r2, __m128i r3) {
  const __m128i t0 = _mm_unpacklo_epi8(r0, r1), t1 = _mm_unpackhi_epi8(r0, r1);
  const __m128i t2 = _mm_unpacklo_epi8(r2, r3), t3 = _mm_unpackhi_epi8(r2, r3);
  const __m512i lo = _mm512_castsi128_si512(_mm_unpacklo_epi16(t0, t2));
  const __m512i v = _mm512_inserti32x4(lo, _mm_unpackhi_epi16(t0, t2), 1);
  const __m512i w = _mm512_inserti32x4(v, _mm_unpacklo_epi16(t1, t3), 2);
  return _mm512_inserti32x4(w, _mm_unpackhi_epi16(t1, t3), 3);
}

// r[i] dword j becomes r[j] dword i (a 16 x 16 transpose of 32-bit words): 4 x 4 blocks inside
// each 128-bit lane, then the lanes.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 4) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    t[i + 2] = _mm512_unpacklo_epi32(r[i + 2], r[i + 3]);
    t[i + 3] = _mm512_unpackhi_epi32(r[i + 2], r[i + 3]);
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);      // lane L: rows i..i+3 of column 4L
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);  // column 4L + 1
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // X_g = r[4 g + c]: out[4 L + c] = (X_0.lane L, .., X_3.lane L)
    const __m512i u0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44);
    const __m512i u1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xEE);
    const __m512i u2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
    const __m512i u3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xEE);
    t[c] = _mm512_shuffle_i32x4(u0, u2, 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
    t[8 + c] = _mm512_shuffle_i32x4(u1, u3, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

inline __mmask16 first16(int64_t n) {
  return n >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << n) - 1);
}
inline __mmask64 first64(int64_t n) { return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1; }

// The 16 codes of row k (columns r < valid) of a k-major operand, zero from k = K on.
inline __m128i row16(const int8_t* x, int64_t stride_k, int64_t k, int64_t K, __mmask16 valid) {
  return k < K ? _mm_maskz_loadu_epi8(valid, x + k * stride_k) : _mm_setzero_si128();
}

// The quads (k0 + 4q .. + 3, q < 16) of the 16 columns of a k-major operand (stride_r = 1).
inline void quads_of_rows(__m512i q[16], const int8_t* x, int64_t stride_k, int64_t k0, int64_t K,
                          __mmask16 valid) {
  for (int i = 0; i < 16; ++i) {
    const int64_t k = k0 + 4 * i;
    q[i] = interleave4(row16(x, stride_k, k, K, valid), row16(x, stride_k, k + 1, K, valid),
                       row16(x, stride_k, k + 2, K, valid), row16(x, stride_k, k + 3, K, valid));
  }
}

// Quad q (codes k = 4q .. 4q + 3) of 64 columns of a k-major operand (stride_r = 1), zero from
// k = K and for columns not in `valid`: out[p] is the quad row of panel p (columns 16 p ..).
inline void quads64(__m512i out[4], const int8_t* x, int64_t stride_k, int64_t q, int64_t K,
                    __mmask64 valid) {
  __m512i r[4];
  for (int t = 0; t < 4; ++t) {
    const int64_t k = 4 * q + t;
    r[t] = k < K ? _mm512_maskz_loadu_epi8(valid, x + k * stride_k) : _mm512_setzero_si512();
    // The same columns 64 rows on: strided rows defeat the hardware prefetchers (a prefetch
    // past the operand's end does not fault).
    _mm_prefetch(reinterpret_cast<const char*>(x + (k + 64) * stride_k), _MM_HINT_T0);
  }
  const __m512i t0 = _mm512_unpacklo_epi8(r[0], r[1]), t1 = _mm512_unpackhi_epi8(r[0], r[1]);
  const __m512i t2 = _mm512_unpacklo_epi8(r[2], r[3]), t3 = _mm512_unpackhi_epi8(r[2], r[3]);
  // lane L of u_c: the quads of columns 16 L + 4 c .. 16 L + 4 c + 3
  const __m512i u0 = _mm512_unpacklo_epi16(t0, t2), u1 = _mm512_unpackhi_epi16(t0, t2);
  const __m512i u2 = _mm512_unpacklo_epi16(t1, t3), u3 = _mm512_unpackhi_epi16(t1, t3);
  const __m512i a0 = _mm512_shuffle_i32x4(u0, u1, 0x44), a1 = _mm512_shuffle_i32x4(u0, u1, 0xEE);
  const __m512i a2 = _mm512_shuffle_i32x4(u2, u3, 0x44), a3 = _mm512_shuffle_i32x4(u2, u3, 0xEE);
  out[0] = _mm512_shuffle_i32x4(a0, a2, 0x88);  // (u0, u1, u2, u3).lane 0
  out[1] = _mm512_shuffle_i32x4(a0, a2, 0xDD);
  out[2] = _mm512_shuffle_i32x4(a1, a3, 0x88);
  out[3] = _mm512_shuffle_i32x4(a1, a3, 0xDD);
}

// 64 codes k0 .. k0 + 63 of each of the 16 rows of an r-major operand (stride_k = 1).
inline void rows64(__m512i r[16], const int8_t* x, int64_t stride_r, int64_t k0, int64_t K, int64_t valid) {
  const __mmask64 m = first64(K - k0);
  for (int64_t i = 0; i < 16; ++i) {
    r[i] = i < valid ? _mm512_maskz_loadu_epi8(m, x + i * stride_r + k0) : _mm512_setzero_si512();
  }
}

}  // namespace

namespace {
void pack_a_panel(int8_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k, int64_t valid,
                  int64_t K, int64_t kp) {
  if (stride_k == 1) {  // rows contiguous: copied, the rest zeroed
    for (int64_t r = 0; r < kAmxRows; ++r) {
      const int64_t n = r < valid ? K : 0;
      if (n > 0) std::memcpy(out + r * kp, x + r * stride_r, static_cast<size_t>(n));
      std::memset(out + r * kp + n, 0, static_cast<size_t>(kp - n));
    }
    return;
  }
  // k-major (a transposed A, stride_r = 1): quads of 16 rows, transposed into rows of 16 quads.
  __m512i q[16];
  for (int64_t k0 = 0; k0 < kp; k0 += kAmxDepth) {
    quads_of_rows(q, x, stride_k, k0, K, first16(valid));
    transpose16(q);
    for (int64_t r = 0; r < kAmxRows; ++r) _mm512_storeu_si512(out + r * kp + k0, q[r]);
  }
}

}  // namespace

void pack_amx_a(int8_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k, int64_t valid,
                int64_t panels, int64_t K, int64_t kp) {
  // k-major: four panels (64 columns) at a time, whole 64-byte rows read once, the groups of
  // four side by side within each step of 64 codes (rows of the operand read in order); each
  // panel's 16 quad rows then transposed into its 16 rows.
  const int64_t fours = stride_r == 1 ? panels / 4 : 0;
  for (int64_t k0 = 0; k0 < kp && fours > 0; k0 += kAmxDepth) {
    for (int64_t p = 0; p < 4 * fours; p += 4) {
      const __mmask64 cols = first64(std::max<int64_t>(valid - p * kAmxRows, 0));
      const int8_t* xp = x + (valid > p * kAmxRows ? p * kAmxRows : 0);
      __m512i q[4][16];
      for (int64_t i = 0; i < 16; ++i) {
        __m512i four[4];
        quads64(four, xp, stride_k, k0 / 4 + i, K, cols);
        for (int g = 0; g < 4; ++g) q[g][i] = four[g];
      }
      for (int g = 0; g < 4; ++g) {
        transpose16(q[g]);
        int8_t* panel = out + (p + g) * kAmxRows * kp;
        for (int64_t r = 0; r < kAmxRows; ++r) _mm512_storeu_si512(panel + r * kp + k0, q[g][r]);
      }
    }
  }
  int64_t p = 4 * fours;
  for (; p < panels; ++p) {
    const int64_t rows = std::clamp<int64_t>(valid - p * kAmxRows, 0, kAmxRows);
    pack_a_panel(out + p * kAmxRows * kp, x + (rows > 0 ? p * kAmxRows * stride_r : 0), stride_r,
                 stride_k, rows, K, kp);
  }
}

namespace {
// One B panel (16 columns), each byte ^ flip.
void pack_b_panel(int8_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k, int64_t valid,
                  int64_t K, int64_t kp, __m512i flip) {
  __m512i q[16];
  for (int64_t k0 = 0; k0 < kp; k0 += kAmxDepth) {
    if (stride_r == 1) {  // B by rows: four rows of 16 columns make one 64-byte row
      quads_of_rows(q, x, stride_k, k0, K, first16(valid));
    } else {  // a transposed B: each column's 16 quads, transposed into 16 rows of columns
      rows64(q, x, stride_r, k0, K, valid);
      transpose16(q);
    }
    for (int64_t i = 0; i < 16; ++i) _mm512_storeu_si512(out + (k0 / 4 + i) * 64, _mm512_xor_si512(q[i], flip));
  }
}

// pack_amx_b, each byte ^ flip: a k-major operand four panels at a time (whole 64-byte rows
// read once, the groups of four side by side: the operand's rows read in order), the rest panel
// by panel.
void pack_b(int8_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k, int64_t valid,
            int64_t panels, int64_t K, int64_t kp, __m512i flip) {
  const int64_t fours = stride_r == 1 ? panels / 4 : 0;
  for (int64_t quad = 0; quad < kp / 4 && fours > 0; ++quad) {  // rows of the operand in order
    for (int64_t p = 0; p < 4 * fours; p += 4) {
      const __mmask64 cols = first64(std::max<int64_t>(valid - p * kAmxRows, 0));
      const int8_t* xp = x + (valid > p * kAmxRows ? p * kAmxRows : 0);
      __m512i q[4];
      quads64(q, xp, stride_k, quad, K, cols);
      for (int64_t i = 0; i < 4; ++i) {
        _mm512_storeu_si512(out + (p + i) * kAmxRows * kp + quad * 64, _mm512_xor_si512(q[i], flip));
      }
    }
  }
  int64_t p = 4 * fours;
  for (; p < panels; ++p) {
    const int64_t rows = std::clamp<int64_t>(valid - p * kAmxRows, 0, kAmxRows);
    pack_b_panel(out + p * kAmxRows * kp, x + (rows > 0 ? p * kAmxRows * stride_r : 0), stride_r,
                 stride_k, rows, K, kp, flip);
  }
}
}  // namespace

void pack_amx_b(int8_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k, int64_t valid,
                int64_t panels, int64_t K, int64_t kp) {
  pack_b(out, x, stride_r, stride_k, valid, panels, K, kp, _mm512_setzero_si512());
}

void pack_vnni_b(int8_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k, int64_t valid,
                 int64_t panels, int64_t K, int64_t kp) {
  pack_b(out, x, stride_r, stride_k, valid, panels, K, kp, _mm512_set1_epi8(static_cast<char>(0x80)));
}

namespace {
// Rows of gemm_s8_epilogue's f32 output; kCs, kRow, kAcc, kStream: the terms known per call, so
// that the loop over a row tests nothing (with them read from `e` in the loop, GCC reloaded each
// flag per vector: a store through c may alias them).
template <bool kCs, bool kRow, bool kAcc, bool kStream>
void f32_rows(float* f32, int64_t ldc, const float* row_scale, const float* col_scale,
              const int32_t* acc, int64_t ld_acc, int64_t m0, int64_t rows, int64_t n0, int64_t cols) {
  const float* cs = kCs ? col_scale + n0 : nullptr;
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t* a = acc + i * ld_acc;
    float* c = f32 + (m0 + i) * ldc + n0;
    const __m512 rs = _mm512_set1_ps(kRow ? row_scale[m0 + i] : 1.0f);
    for_each_vector16(0, cols, [&](int64_t j, auto k) {
      __m512 v = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(k, a + j));
      if constexpr (kCs) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, cs + j));
      if constexpr (kRow) v = _mm512_mul_ps(v, rs);
      if constexpr (kAcc) v = _mm512_add_ps(_mm512_maskz_loadu_ps(k, c + j), v);
      store_ps(c + j, k, v, kStream);
    });
  }
}
}  // namespace

void gemm_s8_epilogue(const S8Epilogue& e, const int32_t* acc, int64_t ld_acc, int64_t m0,
                      int64_t rows, int64_t n0, int64_t cols) {
  if (e.dx != nullptr) return dx_epilogue_rows(e.f32, e.ldc, acc, ld_acc, m0, m0 + rows, n0, n0 + cols, *e.dx, e.stream);
  if (e.s32 != nullptr) {
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(e.s32 + (m0 + i) * e.ldc + n0, acc + i * ld_acc, static_cast<size_t>(cols) * sizeof(int32_t));
    }
    return;
  }
  using Rows = decltype(&f32_rows<false, false, false, false>);
#define S3R_F32_ROWS(CS, ROW) \
  { {f32_rows<CS, ROW, false, false>, f32_rows<CS, ROW, false, true>}, \
    {f32_rows<CS, ROW, true, false>, f32_rows<CS, ROW, true, false>} }
  // [col scale][row scale][accumulate][stream]: a stream only without accumulating.
  static constexpr Rows kRows[2][2][2][2] = {{S3R_F32_ROWS(false, false), S3R_F32_ROWS(false, true)},
                                             {S3R_F32_ROWS(true, false), S3R_F32_ROWS(true, true)}};
#undef S3R_F32_ROWS
  kRows[e.col_scale != nullptr][e.row_scale != nullptr][e.accumulate][e.stream](
      e.f32, e.ldc, e.row_scale, e.col_scale, acc, ld_acc, m0, rows, n0, cols);
}

}  // namespace s3r::kernels::avx512
