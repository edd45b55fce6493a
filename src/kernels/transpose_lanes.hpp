#pragma once
// The byte-transpose network of the vector tiers' transpose_s8 (kernels/kernels.hpp): four
// rounds of unpacks (bytes, words, dwords, qwords) interleave 2, 4, 8 and then 16 rows. x86
// unpacks work within each 128-bit lane, so on 16 row vectors of W bytes the network transposes
// W / 16 tiles of 16 x 16 at once, lane L holding columns 16L .. 16L + 15.
//
// Include only from tier translation units. Everything here has internal linkage on purpose:
// each tier compiles its own copy with its own -m flags (a shared inline function would let the
// linker keep, say, the AVX-512-encoded copy for the AVX2 tier too).
#include <immintrin.h>

#include <cstdint>

namespace s3r::kernels {
namespace {  // NOLINT(build/namespaces): internal linkage per tier, see above

constexpr int kTransposeRows = 16;

// r[i] = row i, in; out[j] = column j of every 128-bit lane's 16 x 16 tile, out. Ops supplies
// the eight unpacks for the vector type V.
template <class V, class Ops>
void transpose_lanes(const V (&r)[kTransposeRows], V (&out)[kTransposeRows]) {
  V s[kTransposeRows], t[kTransposeRows], u[kTransposeRows];
  // s[8h + i]: rows 2i, 2i + 1 byte-interleaved; columns 8h .. 8h + 7 (one per word).
  for (int i = 0; i < 8; ++i) {
    s[i] = Ops::lo8(r[2 * i], r[2 * i + 1]);
    s[8 + i] = Ops::hi8(r[2 * i], r[2 * i + 1]);
  }
  // t[4q + i]: columns 4q .. 4q + 3 (one per dword), rows 4i .. 4i + 3.
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 4; ++i) {
      t[8 * h + i] = Ops::lo16(s[8 * h + 2 * i], s[8 * h + 2 * i + 1]);
      t[8 * h + 4 + i] = Ops::hi16(s[8 * h + 2 * i], s[8 * h + 2 * i + 1]);
    }
  }
  // u[4q + 2p + i]: columns 4q + 2p, 4q + 2p + 1 (one per qword), rows 8i .. 8i + 7.
  for (int q = 0; q < 4; ++q) {
    for (int i = 0; i < 2; ++i) {
      u[4 * q + i] = Ops::lo32(t[4 * q + 2 * i], t[4 * q + 2 * i + 1]);
      u[4 * q + 2 + i] = Ops::hi32(t[4 * q + 2 * i], t[4 * q + 2 * i + 1]);
    }
  }
  // out[4q + 2p + e]: column 4q + 2p + e, rows 0 .. 15.
  for (int qp = 0; qp < 8; ++qp) {
    out[2 * qp] = Ops::lo64(u[2 * qp], u[2 * qp + 1]);
    out[2 * qp + 1] = Ops::hi64(u[2 * qp], u[2 * qp + 1]);
  }
}

struct UnpackOps128 {
  static __m128i lo8(__m128i a, __m128i b) { return _mm_unpacklo_epi8(a, b); }
  static __m128i hi8(__m128i a, __m128i b) { return _mm_unpackhi_epi8(a, b); }
  static __m128i lo16(__m128i a, __m128i b) { return _mm_unpacklo_epi16(a, b); }
  static __m128i hi16(__m128i a, __m128i b) { return _mm_unpackhi_epi16(a, b); }
  static __m128i lo32(__m128i a, __m128i b) { return _mm_unpacklo_epi32(a, b); }
  static __m128i hi32(__m128i a, __m128i b) { return _mm_unpackhi_epi32(a, b); }
  static __m128i lo64(__m128i a, __m128i b) { return _mm_unpacklo_epi64(a, b); }
  static __m128i hi64(__m128i a, __m128i b) { return _mm_unpackhi_epi64(a, b); }
};

// dst[(c + j) * ldd + r + i] = src[(r + i) * lds + c + j] for i, j < 16.
inline void transpose_tile_16x16(int8_t* dst, int64_t ldd, const int8_t* src, int64_t lds,
                                 int64_t r, int64_t c) {
  __m128i rows[kTransposeRows], columns[kTransposeRows];
  for (int i = 0; i < kTransposeRows; ++i) {
    rows[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (r + i) * lds + c));
  }
  transpose_lanes<__m128i, UnpackOps128>(rows, columns);
  for (int j = 0; j < kTransposeRows; ++j) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (c + j) * ldd + r), columns[j]);
  }
}

// The bytes that fill no tile: rows [r0, r1) x columns [c0, c1), as in kernels/ref.
inline void transpose_edge(int8_t* dst, int64_t ldd, const int8_t* src, int64_t lds, int64_t r0,
                           int64_t r1, int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t r = r0; r < r1; ++r) dst[c * ldd + r] = src[r * lds + c];
  }
}

// The tier's transpose_s8: the rows that fill bands of 16 in tiles of 16 x W bytes (the tier's
// widest vector), then of 16 x 16, then byte by byte; the last rows byte by byte. Columns are the
// outer loop, so the W destination rows of a tile column are completed (all r1 - r0 bytes) before
// the next: a power-of-two ldd maps them to few cache sets, and lines left half written would be
// evicted and fetched again.
template <int64_t W, class WideTile>
void transpose_bands(int8_t* dst, int64_t ldd, const int8_t* src, int64_t lds, int64_t r0,
                     int64_t r1, int64_t cols, WideTile wide_tile) {
  const int64_t wide_cols = cols / W * W, tiled_cols = cols / 16 * 16;
  const int64_t banded_r1 = r0 + (r1 - r0) / kTransposeRows * kTransposeRows;
  int64_t c = 0;
  for (; c < wide_cols; c += W) {
    for (int64_t r = r0; r < banded_r1; r += kTransposeRows) wide_tile(dst, ldd, src, lds, r, c);
  }
  for (; c < tiled_cols; c += 16) {
    for (int64_t r = r0; r < banded_r1; r += kTransposeRows) {
      transpose_tile_16x16(dst, ldd, src, lds, r, c);
    }
  }
  transpose_edge(dst, ldd, src, lds, r0, banded_r1, tiled_cols, cols);
  transpose_edge(dst, ldd, src, lds, banded_r1, r1, 0, cols);
}

}  // namespace
}  // namespace s3r::kernels
