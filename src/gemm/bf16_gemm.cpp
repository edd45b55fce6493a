// s3r's bf16 GEMM (gemm/bf16_gemm.hpp): 32 x 32 blocks of vdpbf16ps or AMX's tdpbf16ps
// (kernels/gemm_bf16.hpp) over B's 16-column panels of k pairs, packed by each thread for the chunk
// of columns it works on, and A read in place where its rows are contiguous (else packed once, as
// panels or, for AMX, as rows). The blocking of s3r's VNNI GEMM (gemm/s8_gemm.cpp), whose block
// runs at 94% of its instruction's rate.
#include "gemm/bf16_gemm.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/parallel_blocks.hpp"
#include "core/scratch.hpp"
#include "kernels/gemm_bf16.hpp"
#include "kernels/gemm_s8.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"

namespace s3r::gemm::bf16_panels {

namespace {

using kernels::kBf16Block;
using kernels::kBf16Rows;

constexpr int64_t kL2PanelBytes = 512 << 10;  // B panels kept in L2 while the block rows meet them

// op(X)[r, k] = data[r * stride_r + k * stride_k]
struct Operand {
  const bf16* data;
  int64_t stride_r, stride_k;
};

// Packs `panels` panels of x from panel `first` on, rows < rows, into out (panel 0 of out is x's
// panel `first`), in tasks of whole groups of panels over the threads: A's, once per product. As
// pairs (vdpbf16ps), or with `amx` as 16 rows each kp long.
void pack(bf16* out, const Operand& x, int64_t first, int64_t panels, int64_t rows, int64_t K, int64_t kp, bool amx) {
#ifdef S3R_HAVE_AVX512
  // A k-major operand goes in one task per thread (long runs of its rows in order); others by panel.
  const int64_t threads = parallel_threads();
  const int64_t group = x.stride_r == 1 ? std::max<int64_t>(1, (panels + threads - 1) / threads) : 1;
  parallel_blocks(panels, group, [&](int64_t q0, int64_t q1) {
    const int64_t r0 = (first + q0) * kBf16Rows;
    const int64_t valid = std::clamp<int64_t>(rows - r0, 0, (q1 - q0) * kBf16Rows);
    const bf16* from = x.data + (valid > 0 ? r0 * x.stride_r : 0);
    if (amx) {
      kernels::avx512::pack_bf16_rows(out + q0 * kBf16Rows * kp, from, x.stride_r, x.stride_k, valid,
                                      (q1 - q0) * kBf16Rows, K, kp);
    } else {
      kernels::avx512::pack_bf16_panels(out + q0 * kBf16Rows * kp, from, x.stride_r, x.stride_k, valid, q1 - q0, K, kp);
    }
  });
#else
  (void)out, (void)x, (void)first, (void)panels, (void)rows, (void)K, (void)kp, (void)amx;
  throw Error("bf16 GEMM: this build has no AVX-512 kernels (configured with -DS3R_AVX512=OFF)");
#endif
}

// c[i, j] = sums[i, j], or c[i, j] + sums[i, j] when accumulating (i < rows, j < cols).
void add_or_copy(float* c, int64_t ldc, const float* sums, int64_t rows, int64_t cols, bool accumulate) {
  for (int64_t i = 0; i < rows; ++i) {
    float* ci = c + i * ldc;
    const float* si = sums + i * kBf16Block;
    if (accumulate) {
      for (int64_t j = 0; j < cols; ++j) ci[j] = ci[j] + si[j];
    } else {
      std::copy(si, si + cols, ci);
    }
  }
}

// Where each block's 32 rows of op(A) are: read in place where op(A)'s rows are contiguous (and
// K even, or with AMX a multiple of its tiles' 32), else packed once (a last, partial block of
// rows always: zero rows after M). vdpbf16ps reads them as panels of pairs, AMX as rows.
class ARows {
 public:
  ARows(const bf16* A, const MatmulShape& s, const Operand& a, int64_t kp, bool amx) : amx_(amx), kp_(kp) {
    const int64_t M = s.M, m_blocks = (M + kBf16Block - 1) / kBf16Block;
    const bool direct = a.stride_k == 1 && s.K % (amx ? kernels::kBf16AmxDepth : 2) == 0;
    first_ = direct ? M / kBf16Block * 2 : 0;  // the first panel (16 rows) packed
    direct_ = Operand{A, s.lda, 1};
    thread_local AlignedVector<bf16> packed;
    packed_ = scratch(packed, (2 * m_blocks - first_) * kBf16Rows * kp);
    if (first_ < 2 * m_blocks) pack(packed_, a, first_, 2 * m_blocks - first_, M, s.K, kp, amx);
  }
  kernels::Bf16Rows at(int64_t m0) const {
    if (m0 / kBf16Rows < first_) return {direct_.data + m0 * direct_.stride_r, direct_.stride_r, 2, kBf16Rows * direct_.stride_r};
    const bf16* p = packed_ + (m0 / kBf16Rows - first_) * kBf16Rows * kp_;
    if (amx_) return {p, kp_, 2, kBf16Rows * kp_};
    return {p, 2, 2 * kBf16Rows, kBf16Rows * kp_};
  }

 private:
  bool amx_;
  int64_t kp_, first_;
  Operand direct_{};
  bf16* packed_;
};

// The block of the backend, into c (ldc) or streamed past the caches.
void block(bool amx, const kernels::Bf16Rows& a, const bf16* b, int64_t kp, float* c, int64_t ldc, bool stream) {
  if (amx) return kernels::amx::gemm_bf16_amx_block(a, b, kp, c, ldc, stream);
  kernels::avx512::gemm_bf16_block(a, b, kp, c, ldc, stream);
}

}  // namespace

void gemm(float* C, const bf16* A, const bf16* B, const MatmulShape& s, bool accumulate, bool amx) {
#ifdef S3R_HAVE_AVX512
  const int64_t M = s.M, N = s.N, K = s.K;
  const int64_t kp = amx ? (K + kernels::kBf16AmxDepth - 1) / kernels::kBf16AmxDepth * kernels::kBf16AmxDepth : K + K % 2;
  if (M == 0 || N == 0) return;
  const Operand a = s.a_transposed ? Operand{A, 1, s.lda} : Operand{A, s.lda, 1};
  const Operand b = s.b_transposed ? Operand{B, s.ldb, 1} : Operand{B, 1, s.ldb};
  const int64_t m_blocks = (M + kBf16Block - 1) / kBf16Block, n_blocks = (N + kBf16Block - 1) / kBf16Block;
  const ARows a_rows(A, s, a, kp, amx);
  // Blocks by chunks of B's columns whose panels stay in L2 while every block row meets them,
  // row-major within a chunk (consecutive blocks share their A rows); one contiguous run per
  // thread, which packs the B panels of each chunk it enters into its own buffer (in its L2, not
  // through memory). Each output's sum is its own, so neither the order nor the split is numerics.
  const int64_t chunk = std::clamp<int64_t>(kL2PanelBytes / (kBf16Block * kp * 2), 1, n_blocks);
  const int64_t total = m_blocks * n_blocks, threads = parallel_threads();
  // An output larger than the threads' share of L2 goes to memory by non-temporal stores (as the
  // VNNI GEMM's), where its lines are whole. AMX too: `small`'s LM head (its 64 MB of logits)
  // took 25.0-25.3 against 27.4-28.5 ms per step on the Emerald Rapids VM (three alternations,
  // 2026-12-07), the cross-entropy that reads them next 7.0-7.2 ms either way.
  const bool stream = !accumulate && M * N * int64_t{sizeof(float)} > threads * kL2PanelBytes &&
                      reinterpret_cast<uintptr_t>(C) % 64 == 0 && s.ldc % 16 == 0;
  parallel_blocks(total, (total + threads - 1) / threads, [&](int64_t blk0, int64_t blk1) {
    thread_local AlignedVector<bf16> b_chunk;
    bf16* bp = scratch(b_chunk, chunk * kBf16Block * kp);
    alignas(64) float sums[kBf16Block * kBf16Block];
    int64_t packed = -1;  // the chunk in bp
    if (amx) kernels::amx::amx_tiles_configure();
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      const int64_t c = blk / (m_blocks * chunk), first = c * chunk;
      const int64_t width = std::min(chunk, n_blocks - first), r = blk - c * m_blocks * chunk;
      const int64_t m0 = r / width * kBf16Block, n0 = (first + r % width) * kBf16Block;
      if (c != packed) {
        const int64_t col0 = first * kBf16Block;
        kernels::avx512::pack_bf16_panels(bp, b.data + col0 * b.stride_r, b.stride_r, b.stride_k,
                                          std::min(width * kBf16Block, N - col0), 2 * width, K, kp);
        packed = c;
      }
      const bf16* bn = bp + (n0 - first * kBf16Block) * kp;
      const int64_t rows = std::min(kBf16Block, M - m0), cols = std::min(kBf16Block, N - n0);
      float* out = C + m0 * s.ldc + n0;
      if (!accumulate && rows == kBf16Block && cols == kBf16Block) {  // straight into C
        block(amx, a_rows.at(m0), bn, kp, out, s.ldc, stream);
        continue;
      }
      block(amx, a_rows.at(m0), bn, kp, sums, kBf16Block, false);
      add_or_copy(out, s.ldc, sums, rows, cols, accumulate);
    }
    if (amx) kernels::amx::amx_tiles_release();
    if (stream) _mm_sfence();  // this thread's non-temporal stores done before the join
  });
#else
  (void)C, (void)A, (void)B, (void)s, (void)accumulate, (void)amx;
  throw Error("bf16 GEMM: this build has no AVX-512 kernels (configured with -DS3R_AVX512=OFF)");
#endif
}

}  // namespace s3r::gemm::bf16_panels
