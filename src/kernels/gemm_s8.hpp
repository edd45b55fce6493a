#pragma once
// Kernels of s3r's own exact int8 GEMM (the driver: gemm/s8_gemm.cpp).
//
// Packed operands: codes in [-127, 127] widened to int16, two consecutive k in one 32-bit word
// (low half k = 2p, high half k = 2p + 1; when K is odd the last word's high half is 0).
//   A micro-panel: kS8Mr rows of op(A), word [p * kS8Mr + i] = (A[i, 2p], A[i, 2p + 1])
//   B micro-panel: kS8Nr columns of op(B), word [p * kS8Nr + j] = (B[2p, j], B[2p + 1, j])
// A product of two words is a[lo] b[lo] + a[hi] b[hi]: |.| <= 2 * 127^2, exact in int32, and a
// sum over pairs stays exact while K * 127^2 < 2^31 (K < 133000; the driver checks).
#include <cstdint>

namespace s3r::kernels {

inline constexpr int64_t kS8Mr = 6;   // rows of A per micro-panel
inline constexpr int64_t kS8Nr = 16;  // columns of B per micro-panel

// The packed-panel microkernel of every tier that has one:
//   c[i * ldc + j] (+)= sum_{p < pairs} dot2(a[p * kS8Mr + i], b[p * kS8Nr + j])
// for i < kS8Mr, j < kS8Nr; `accumulate` adds to c instead of overwriting it.
#define S3R_DECLARE_S8_TILE                                                                  \
  void gemm_s8_tile(const uint32_t* a, const uint32_t* b, int64_t pairs, int32_t* c,          \
                    int64_t ldc, bool accumulate);                                              \
  S3R_DECLARE_S8_PAIRS

// One micro-panel of `width` (kS8Mr or kS8Nr) rows of op(X)[r, k] = x[r * stride_r + k * stride_k]
// (x at the panel's first row; one of the strides is 1), rows r < valid (<= width), k < K, as the
// microkernel reads it: out[p * width + i] = (X[i, 2p], X[i, 2p + 1]) for p < pairs, the high
// half 0 where 2p + 1 == K; words of rows i >= valid and of pairs p >= (K + 1) / 2 are 0.
#define S3R_DECLARE_S8_PAIRS                                                                 \
  void pack_s8_pairs(uint32_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k,      \
                     int64_t valid, int64_t width, int64_t K, int64_t pairs);

// The dequantizing epilogue of a block of int32 sums acc (rows x cols, stride ld_acc) whose
// element (i, j) is C's (m0 + i, n0 + j): with s32 set, C = sum; else, in this order of f32
// operations (a null scale being 1 and its multiplication skipped),
//   C[m, n] = (float(sum) * col_scale[n]) * row_scale[m]        (+ C[m, n] first when accumulating:
//   C[m, n] = C[m, n] + ((float(sum) * col_scale[n]) * row_scale[m]))
// With dx set (f32 output, no scales), C is the dX of kernels.hpp's DxTerms instead: the tier's
// dx_epilogue on the block.
struct DxTerms;
struct S8Epilogue {
  int32_t* s32 = nullptr;            // exactly one of s32 / f32
  float* f32 = nullptr;
  int64_t ldc = 0;
  const float* row_scale = nullptr;  // (M) or null
  const float* col_scale = nullptr;  // (N) or null
  bool accumulate = false;           // f32 only
  const DxTerms* dx = nullptr;       // f32 only, without scales (then `accumulate` is dx's)
  // f32 without accumulating: whole 64-byte lines of C may go by non-temporal stores, past the
  // caches (the AVX-512 epilogue only; the same values). The caller fences (sfence) before the
  // output is read by another thread.
  bool stream = false;
};
#define S3R_DECLARE_S8_EPILOGUE                                                                 \
  void gemm_s8_epilogue(const S8Epilogue& e, const int32_t* acc, int64_t ld_acc, int64_t m0,    \
                        int64_t rows, int64_t n0, int64_t cols);

// s3r's int8-panel GEMM (on CPUs with AMX-INT8 or AVX-512 VNNI): codes stay int8.
//   A panel: kAmxRows rows of op(A), kp bytes each (kp = K rounded up to 64, zero beyond K):
//            a[i * kp + k]
//   B panel: kAmxRows columns of op(B), k in groups of four (AMX's and VNNI's layout), kp / 4 rows
//            of 64 bytes (zero beyond K): b[(k / 4) * 64 + 4 j + k % 4] = op(B)[k, j]
// A block is kAmxBlock x kAmxBlock: 32 rows of A at stride lda (two panels at a and a + 16 lda:
// packed, lda = kp; or op(A) itself where its rows are contiguous and K is a multiple of 64) and
// two consecutive B panels (b, b + 16 kp):
//   c[i * ldc + j] = sum_{k < kp} a[i * lda + k] Bpanel(j / 16)[k, j % 16], overwritten
// gemm_s8_amx_block: four 16 x 16 tdpbssd accumulator tiles. gemm_s8_vnni_block: vpdpbusd
// multiplies u8 by s8, so its B panels hold code + 128 (each byte ^ 0x80: pack_vnni_b) and it
// subtracts 128 a_sums[i] from row i (a_sums[i] = sum_k of row i's codes, row_sums_s8): the same
// exact sums, while K < kVnniMaxK (|sum_k a (b + 128)| <= K 127 255 < 2^31). It reads A by quads
// (four codes of a row, broadcast), so its A may also be packed like a B panel (S8Rows), which a
// k-major op(A) needs no transpose for. The reference twin of both blocks is
// ref::gemm_s8_amx_block.
inline constexpr int64_t kAmxRows = 16;
inline constexpr int64_t kAmxBlock = 2 * kAmxRows;
inline constexpr int64_t kAmxDepth = 64;  // bytes of k per tile row
inline constexpr int64_t kVnniMaxK = 66000;
// Where the 32 rows of a VNNI block's A are: quad q of row i (codes 4q .. 4q + 3) at
// a + (i / 16) * panel + (i % 16) * row + q * quad.
//   rows of codes (A panels, or op(A) itself): row = lda, quad = 4, panel = 16 lda
//   quads (A panels packed by pack_amx_b):      row = 4, quad = 64, panel = 16 kp
struct S8Rows {
  const int8_t* a;
  int64_t row, quad, panel;
};
// `panels` consecutive panels are packed from op(X)[r, k] = x[r * stride_r + k * stride_k] (x at
// the first panel's first row; one of the strides is 1), rows r < valid (<= 16 panels) and k < K;
// panel p's row i is op(X)'s row 16 p + i, at out + 16 p kp; every other byte is zero:
//   pack_amx_a:  out[r * kp + k] = op(X)[r, k]                 (A panel; X = op(A))
//   pack_amx_b:  out[(k / 4) * 64 + 4 r + k % 4] = op(X)[r, k] (B panel; X = op(B)^T, r = column)
//   pack_vnni_b: pack_amx_b's bytes ^ 0x80 (padding included)
// row_sums_s8: sums[i] = the sum of the kp codes of row i of a, i < 32.
#define S3R_DECLARE_S8_PANELS                                                                  \
  void pack_amx_a(int8_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k,             \
                  int64_t valid, int64_t panels, int64_t K, int64_t kp);                        \
  void pack_amx_b(int8_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k,             \
                  int64_t valid, int64_t panels, int64_t K, int64_t kp);                        \
  void pack_vnni_b(int8_t* out, const int8_t* x, int64_t stride_r, int64_t stride_k,            \
                   int64_t valid, int64_t panels, int64_t K, int64_t kp);                       \
  void row_sums_s8(int32_t* sums, const S8Rows& a, int64_t kp);                                \
  S3R_DECLARE_S8_EPILOGUE

namespace ref {
S3R_DECLARE_S8_TILE
S3R_DECLARE_S8_PANELS
void gemm_s8_amx_block(const int8_t* a, int64_t lda, const int8_t* b, int64_t kp, int32_t* c,
                       int64_t ldc);
// Plain loops, the oracle: c[(m - m0) * ldc + n] = sum_k op(A)[m, k] op(B)[k, n] for rows m in
// [m0, m1), all n < N; op(A)[m, k] = A[ta ? k * lda + m : m * lda + k],
// op(B)[k, n] = B[tb ? n * ldb + k : k * ldb + n].
void gemm_s8_rows(int32_t* c, int64_t ldc, const int8_t* A, int64_t lda, bool ta, const int8_t* B,
                  int64_t ldb, bool tb, int64_t N, int64_t K, int64_t m0, int64_t m1);
}  // namespace ref
namespace avx2 {
S3R_DECLARE_S8_TILE
S3R_DECLARE_S8_EPILOGUE  // kernels/avx2/gemm_s8_avx2.cpp (the AVX2 GEMM's, gemm/s8_gemm.cpp)
}  // namespace avx2
namespace avx512 {
S3R_DECLARE_S8_PANELS  // kernels/avx512/gemm_s8_avx512.cpp (row sums: gemm_s8_vnni.cpp)
// kernels/avx512/gemm_s8_vnni.cpp, compiled with -mavx512vnni: only on CPUs with AVX-512 VNNI.
void gemm_s8_vnni_block(const S8Rows& a, const int32_t* a_sums, const int8_t* b, int64_t kp,
                        int32_t* c, int64_t ldc);
}  // namespace avx512
// Compiled with AMX's flags (kernels/avx512/gemm_s8_amx.cpp); call only on a CPU whose AMX-INT8
// state the OS granted (s3r/core/cpu_features.hpp), between amx_tiles_configure() and
// amx_tiles_release() on the calling thread.
namespace amx {
void gemm_s8_amx_block(const int8_t* a, int64_t lda, const int8_t* b, int64_t kp, int32_t* c,
                       int64_t ldc);
// The block in two halves: gemm_s8_amx_sum leaves the block's sums in tiles 0..3 (tiles 4..7
// are scratch), gemm_s8_amx_store writes them to c as gemm_s8_amx_block does. Code between the
// two that uses no tiles runs while the tile unit computes.
void gemm_s8_amx_sum(const int8_t* a, int64_t lda, const int8_t* b, int64_t kp);
void gemm_s8_amx_store(int32_t* c, int64_t ldc);
// Sums carried over K slices: gemm_s8_amx_load puts a block's int32 sums (as _store wrote them)
// back in tiles 0..3, gemm_s8_amx_add adds kp more k to them (_sum is _add from zero tiles).
// Integer sums are exact, so a block summed slice by slice has the bits of one summed at once.
void gemm_s8_amx_load(const int32_t* c, int64_t ldc);
void gemm_s8_amx_add(const int8_t* a, int64_t lda, const int8_t* b, int64_t kp);
void amx_tiles_configure();  // palette 1: eight tiles of 16 rows x 64 bytes
void amx_tiles_release();
}  // namespace amx
#undef S3R_DECLARE_S8_TILE
#undef S3R_DECLARE_S8_PAIRS
#undef S3R_DECLARE_S8_PANELS
#undef S3R_DECLARE_S8_EPILOGUE

}  // namespace s3r::kernels
