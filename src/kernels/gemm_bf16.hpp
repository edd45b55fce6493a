#pragma once
// Kernels of s3r's own bf16 GEMM on CPUs with AVX-512 BF16 (the driver: gemm/bf16_gemm.cpp).
//
// Panels: 16 rows of op(X) (rows of op(A), or columns of op(B)), k in pairs, kp = K rounded up
// to even (for the AMX block below, to a multiple of 32), zero beyond K and beyond the valid rows:
//   out[p * 32 + 2 i + h] = op(X)[i, 2 p + h]      (p < kp / 2, i < 16, h < 2)
// so that each 64-byte row of a panel holds one pair of k for its 16 rows (vdpbf16ps's layout).
// A block is kBf16Block x kBf16Block (32 x 32): 32 rows of op(A) and two consecutive B panels
// (b, b + 16 kp). Each output is one chain of f32 multiply-adds over the pairs in order, from +0,
// the odd k of a pair before the even one (vdpbf16ps's order):
//   acc = +0;  for p < kp / 2: acc = fma(a[i, 2p + 1], b[2p + 1, j], acc);
//                              acc = fma(a[i, 2p], b[2p, j], acc)
// with subnormal operands read as zero and subnormal results written as zero (of their sign), as
// the instruction does whatever MXCSR says; then c[i * ldc + j] = acc for all 32 x 32 (the driver
// adds or trims edges). `stream`: by non-temporal stores, past the caches (c 64-byte aligned,
// ldc a multiple of 16; the AVX-512 block only, the same values; the caller fences before the
// output is read by another thread). The chain of an output depends on nothing but its row of op(A), its
// column of op(B) and kp: the same bits for any blocking and thread count.
#include <cstdint>

#include "s3r/core/bf16.hpp"

namespace s3r::kernels {

inline constexpr int64_t kBf16Rows = 16;  // rows of a panel
inline constexpr int64_t kBf16Block = 2 * kBf16Rows;
inline constexpr int64_t kBf16AmxDepth = 32;  // k per AMX tile: 64 bytes of a row

// Where a block's 32 rows of op(A) are, in bf16 elements: pair p of row i at
// a + (i / 16) * panel + (i % 16) * row + p * pair.
//   op(A) itself (rows contiguous, K even): row = lda, pair = 2, panel = 16 lda
//   packed panels:                          row = 2, pair = 32, panel = 16 kp
struct Bf16Rows {
  const bf16* a;
  int64_t row, pair, panel;
};

// `panels` consecutive panels from op(X)[r, k] = x[r * stride_r + k * stride_k] (x at the first
// panel's first row; one of the strides is 1), rows r < valid (<= 16 panels) and k < K; panel q
// at out + 16 q kp.
// pack_bf16_rows: `rows` rows of op(X) as they are, each kp long: out[r * kp + k] =
// op(X)[r, k] for r < valid and k < K, zero elsewhere (the AMX block's A where op(A)'s rows are
// not contiguous; kp a multiple of 32).
#define S3R_DECLARE_BF16_GEMM                                                                      \
  void pack_bf16_panels(bf16* out, const bf16* x, int64_t stride_r, int64_t stride_k, int64_t valid, \
                        int64_t panels, int64_t K, int64_t kp);                                     \
  void pack_bf16_rows(bf16* out, const bf16* x, int64_t stride_r, int64_t stride_k, int64_t valid,   \
                      int64_t rows, int64_t K, int64_t kp);                                         \
  void gemm_bf16_block(const Bf16Rows& a, const bf16* b, int64_t kp, float* c, int64_t ldc, bool stream);

namespace ref {
S3R_DECLARE_BF16_GEMM
}  // namespace ref
// kernels/avx512/gemm_bf16_avx512.cpp, compiled with -mavx512bf16: only on CPUs with AVX-512 BF16.
namespace avx512 {
S3R_DECLARE_BF16_GEMM
}  // namespace avx512
#undef S3R_DECLARE_BF16_GEMM

// The AMX block (kernels/avx512/gemm_bf16_amx.cpp, compiled with AMX's flags; call only where the
// OS granted AMX-BF16, between amx::amx_tiles_configure() and amx_tiles_release() of
// kernels/gemm_s8.hpp on the calling thread): the same 32 x 32 block from op(A)'s rows as they
// are (a.pair = 2: row i at a.a + (i / 16) * a.panel + (i % 16) * a.row, 64-byte tile rows) and
// the same B panels, kp a multiple of kBf16AmxDepth, each output summed by tdpbf16ps over 32 k
// at a time in order, from +0. The instruction's own arithmetic (not the chain above: on Emerald
// Rapids about 45% of the outputs differ from it in their last bits): deterministic, and an
// output still depends on nothing but its row of op(A), its column of op(B) and kp, so the same
// bits for any blocking and thread count. `stream`: C's rows by non-temporal stores (c 64-byte
// aligned, ldc a multiple of 16; the caller fences), as gemm_bf16_block's.
namespace amx {
void gemm_bf16_amx_block(const Bf16Rows& a, const bf16* b, int64_t kp, float* c, int64_t ldc, bool stream);
}  // namespace amx

}  // namespace s3r::kernels
