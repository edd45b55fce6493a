// s3r's exact int8 GEMM: packing into int16-pair panels, cache blocking, OpenMP over output
// blocks, and the dequantizing epilogue (gemm/s8_gemm.hpp).
//
// Blocking (GotoBLAS style, sized for a 32-48 KiB L1 and a >= 512 KiB L2): the whole of op(B) is
// packed once per call (2 bytes per code), in parallel; then every task computes one block of
// C, MC x NC (at most 96 x 256), K in slices of KC = 512 (256 pairs): for each slice, each
// 16-column B micro-panel (16 KiB, L1) meets every 6-row A micro-panel of the block (96 KiB,
// L2). A thread packs the A rows of its blocks itself, once per block row. A task's int32 sums
// live in a per-thread scratch tile that the epilogue turns into the output, so edges (M % 6,
// N % 16) and leading dimensions cost nothing in the kernel.
// Integer sums are exact, so the result does not depend on the blocking or the thread count.
#include "gemm/s8_gemm.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "core/parallel_blocks.hpp"
#include "kernels/gemm_s8.hpp"
#include "s3r/core/error.hpp"

namespace s3r::gemm::s8 {

namespace {

using kernels::kS8Mr;
using kernels::kS8Nr;

constexpr int64_t kKcPairs = 256;     // K slice: 512 codes
constexpr int64_t kMcPanels = 16;     // rows of a block: 16 x 6 = 96
constexpr int64_t kNcPanels = 16;     // columns of a block: 16 x 16 = 256
constexpr int64_t kMaxExactK = 133000;  // K * 127^2 < 2^31

// op(X)[r, k] of an operand as rows r (of A: m; of B: n) and depth k: X[r * stride_r + k * stride_k].
struct Operand {
  const int8_t* data;
  int64_t stride_r, stride_k;
};

inline uint32_t pair_word(int8_t lo, int8_t hi) {
  return static_cast<uint32_t>(static_cast<uint16_t>(int16_t{lo})) |
         (static_cast<uint32_t>(static_cast<uint16_t>(int16_t{hi})) << 16);
}

// Micro-panel `panel` (rows panel*W .. +W, zero beyond `rows`) of `x`: out[p * W + i] for all
// pairs p < pairs (zero beyond K).
template <int64_t W>
void pack_panel(uint32_t* out, const Operand& x, int64_t panel, int64_t rows, int64_t K,
                int64_t pairs) {
  const int64_t r0 = panel * W;
  const int64_t valid = std::min<int64_t>(W, rows - r0);
  const int64_t full_pairs = K / 2;
  if (valid < W) std::memset(out, 0, static_cast<size_t>(pairs * W) * sizeof(uint32_t));
  if (x.stride_k == 1) {
    // Pairs contiguous in memory (a row of a row-major operand): read along k, write at stride W.
    for (int64_t i = 0; i < valid; ++i) {
      const int8_t* row = x.data + (r0 + i) * x.stride_r;
      for (int64_t p = 0; p < full_pairs; ++p) out[p * W + i] = pair_word(row[2 * p], row[2 * p + 1]);
      if (K % 2) out[full_pairs * W + i] = pair_word(row[K - 1], 0);
    }
  } else {
    // Rows contiguous (pairs across two stored rows): interleave two runs of `valid` codes.
    for (int64_t p = 0; p < full_pairs; ++p) {
      const int8_t* lo = x.data + r0 * x.stride_r + 2 * p * x.stride_k;
      const int8_t* hi = lo + x.stride_k;
      uint32_t* o = out + p * W;
      for (int64_t i = 0; i < valid; ++i) o[i] = pair_word(lo[i * x.stride_r], hi[i * x.stride_r]);
    }
    if (K % 2) {
      const int8_t* lo = x.data + r0 * x.stride_r + (K - 1) * x.stride_k;
      uint32_t* o = out + full_pairs * W;
      for (int64_t i = 0; i < valid; ++i) o[i] = pair_word(lo[i * x.stride_r], 0);
    }
  }
}

template <int64_t W>
void pack_all(std::vector<uint32_t>& buf, const Operand& x, int64_t rows, int64_t K, int64_t pairs) {
  const int64_t panels = (rows + W - 1) / W;
  buf.resize(static_cast<size_t>(panels * pairs * W));
  uint32_t* out = buf.data();
  parallel_blocks(panels, 1, [&](int64_t panel, int64_t) {
    pack_panel<W>(out + panel * pairs * W, x, panel, rows, K, pairs);
  });
}

// The epilogue's arguments for `out` (kernels/gemm_s8.hpp).
kernels::S8Epilogue epilogue_of(const Output& out, int64_t ldc) {
  return {out.s32, out.f32, ldc, out.row_scale, out.col_scale, out.accumulate};
}

void check_depth(int64_t K) {
  if (K >= kMaxExactK) {
    throw Error("int8 GEMM: K = " + std::to_string(K) + " products of codes in [-127, 127] may " +
                "overflow int32 (K must be < " + std::to_string(kMaxExactK) + ")");
  }
}

struct Operands {
  Operand a, b;
};

Operands operands(const int8_t* A, const int8_t* B, const MatmulShape& s) {
  // op(A)[m, k] = A[ta ? k * lda + m : m * lda + k]; op(B)[k, n] = B[tb ? n * ldb + k : k * ldb + n]
  return Operands{s.a_transposed ? Operand{A, 1, s.lda} : Operand{A, s.lda, 1},
                  s.b_transposed ? Operand{B, s.ldb, 1} : Operand{B, 1, s.ldb}};
}

}  // namespace

void gemm_avx2(const int8_t* A, const int8_t* B, const MatmulShape& s, const Output& out) {
#ifndef S3R_HAVE_AVX2
  throw Error("int8 GEMM: this build has no AVX2 kernels (configured with -DS3R_AVX2=OFF)");
#endif
  check_depth(s.K);
  const int64_t M = s.M, N = s.N, K = s.K, pairs = (K + 1) / 2;
  const Operands ops = operands(A, B, s);
  thread_local std::vector<uint32_t> b_packed;  // grown once, reused
  pack_all<kS8Nr>(b_packed, ops.b, N, K, pairs);

  const int64_t m_panels = (M + kS8Mr - 1) / kS8Mr, n_panels = (N + kS8Nr - 1) / kS8Nr;
  // Blocks: at most kMcPanels x kNcPanels micro-panels; smaller when that leaves fewer than four
  // blocks per thread (dW products have few rows and columns and a long K).
  int64_t mc = std::min(kMcPanels, m_panels), nc = std::min(kNcPanels, n_panels);
  const int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t want = 4 * threads;
  auto blocks = [&] { return ((m_panels + mc - 1) / mc) * ((n_panels + nc - 1) / nc); };
  while (blocks() < want && (nc > 2 || mc > 2)) {
    if (nc >= mc) {
      nc = (nc + 1) / 2;
    } else {
      mc = (mc + 1) / 2;
    }
  }
  const int64_t m_blocks = (m_panels + mc - 1) / mc, n_blocks = (n_panels + nc - 1) / nc;
  const int64_t ld_acc = nc * kS8Nr;
  const int64_t ldc = s.ldc;
#ifdef S3R_HAVE_AVX2
  const auto tile = kernels::avx2::gemm_s8_tile;
#else
  const auto tile = kernels::ref::gemm_s8_tile;
#endif
  const uint32_t* bp = b_packed.data();
  const kernels::S8Epilogue epi = epilogue_of(out, ldc);

  // Blocks in row-major order, one contiguous run of them per thread (the blocks are cut by
  // the thread count, which is not numerics: integer sums are exact): a task packs the A panels
  // of a block row once, into its thread's buffer (hot in its L2), and reuses them for the
  // following blocks of the same row.
  const int64_t total = m_blocks * n_blocks;
  parallel_blocks(total, (total + threads - 1) / threads, [&](int64_t blk0, int64_t blk1) {
    thread_local std::vector<uint32_t> a_block;
    thread_local std::vector<int32_t> acc;
    int64_t packed_row = -1;
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      const int64_t ib = blk / n_blocks, jb = blk % n_blocks;
      const int64_t i0 = ib * mc, i1 = std::min(m_panels, i0 + mc);
      const int64_t j0 = jb * nc, j1 = std::min(n_panels, j0 + nc);
      if (ib != packed_row) {
        a_block.resize(static_cast<size_t>(mc * pairs * kS8Mr));
        for (int64_t i = i0; i < i1; ++i) {
          pack_panel<kS8Mr>(a_block.data() + (i - i0) * pairs * kS8Mr, ops.a, i, M, K, pairs);
        }
        packed_row = ib;
      }
      acc.resize(static_cast<size_t>(mc * kS8Mr * ld_acc));
      const uint32_t* ap = a_block.data();
      for (int64_t p0 = 0; p0 < pairs; p0 += kKcPairs) {
        const int64_t kc = std::min(kKcPairs, pairs - p0);
        for (int64_t j = j0; j < j1; ++j) {
          const uint32_t* b = bp + (j * pairs + p0) * kS8Nr;
          for (int64_t i = 0; i < i1 - i0; ++i) {
            tile(ap + (i * pairs + p0) * kS8Mr, b, kc,
                 acc.data() + i * kS8Mr * ld_acc + (j - j0) * kS8Nr, ld_acc, p0 > 0);
          }
        }
      }
      const int64_t m0 = i0 * kS8Mr, n0 = j0 * kS8Nr;
      kernels::ref::gemm_s8_epilogue(epi, acc.data(), ld_acc, m0, std::min(M, i1 * kS8Mr) - m0,
                                     n0, std::min(N, j1 * kS8Nr) - n0);
    }
  });
}

void gemm_amx(const int8_t* A, const int8_t* B, const MatmulShape& s, const Output& out) {
#ifndef S3R_HAVE_AVX512
  (void)A, (void)B, (void)s, (void)out;
  throw Error("int8 GEMM: this build has no AMX kernels (configured with -DS3R_AVX512=OFF)");
#else
  using kernels::kAmxBlock, kernels::kAmxDepth, kernels::kAmxRows;
  check_depth(s.K);
  const int64_t M = s.M, N = s.N, K = s.K;
  const int64_t kp = (K + kAmxDepth - 1) / kAmxDepth * kAmxDepth;
  const Operands ops = operands(A, B, s);
  const int64_t m_blocks = (M + kAmxBlock - 1) / kAmxBlock, n_blocks = (N + kAmxBlock - 1) / kAmxBlock;
  // op(A) rows contiguous and K a multiple of 64: the tiles load A itself, and only a last,
  // partial block of rows is packed (zero rows after M); otherwise every A panel is packed.
  const bool a_direct = ops.a.stride_k == 1 && K % kAmxDepth == 0;
  const int64_t a_first = a_direct ? M / kAmxBlock * 2 : 0;  // the first panel packed
  thread_local std::vector<int8_t> a_packed, b_packed;  // grown once, reused
  a_packed.resize(static_cast<size_t>((m_blocks * 2 - a_first) * kAmxRows * kp));
  b_packed.resize(static_cast<size_t>(n_blocks * kAmxBlock * kp));
  int8_t* ap = a_packed.data();
  int8_t* bp = b_packed.data();
  const int64_t a_panels = 2 * m_blocks - a_first, b_panels = 2 * n_blocks;
  parallel_blocks(a_panels + b_panels, 1, [&](int64_t t, int64_t) {
    const bool is_a = t < a_panels;
    const int64_t panel = is_a ? t : t - a_panels, r0 = (is_a ? a_first + panel : panel) * kAmxRows;
    const Operand& x = is_a ? ops.a : ops.b;
    const int64_t valid = std::clamp<int64_t>((is_a ? M : N) - r0, 0, kAmxRows);
    const int8_t* first = x.data + (valid > 0 ? r0 * x.stride_r : 0);
    (is_a ? kernels::amx::pack_amx_a : kernels::amx::pack_amx_b)(
        (is_a ? ap : bp) + panel * kAmxRows * kp, first, x.stride_r, x.stride_k, valid, K, kp);
  });
  // Block row ib's A: in op(A) itself, or packed.
  const auto a_rows = [&](int64_t m0) -> std::pair<const int8_t*, int64_t> {
    if (a_direct && m0 + kAmxBlock <= M) return {ops.a.data + m0 * ops.a.stride_r, ops.a.stride_r};
    return {ap + (m0 / kAmxRows - a_first) * kAmxRows * kp, kp};
  };
  // Blocks in row-major order, one contiguous run per thread: consecutive blocks share their
  // A panels. Integer sums are exact, so the split (by thread count) is not numerics.
  const int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t total = m_blocks * n_blocks;
  const kernels::S8Epilogue epi = epilogue_of(out, s.ldc);
  parallel_blocks(total, (total + threads - 1) / threads, [&](int64_t blk0, int64_t blk1) {
    alignas(64) int32_t acc[kAmxBlock * kAmxBlock];
    kernels::amx::amx_tiles_configure();
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      const int64_t m0 = blk / n_blocks * kAmxBlock, n0 = blk % n_blocks * kAmxBlock;
      const auto [a, lda] = a_rows(m0);
      kernels::amx::gemm_s8_amx_block(a, lda, bp + n0 * kp, kp, acc, kAmxBlock);
      kernels::amx::gemm_s8_epilogue(epi, acc, kAmxBlock, m0, std::min(kAmxBlock, M - m0), n0,
                                     std::min(kAmxBlock, N - n0));
    }
    kernels::amx::amx_tiles_release();
  });
#endif
}

void gemm_reference(const int8_t* A, const int8_t* B, const MatmulShape& s, const Output& out) {
  check_depth(s.K);
  const int64_t M = s.M, N = s.N;
  constexpr int64_t kRows = 16;
  const kernels::S8Epilogue epi = epilogue_of(out, s.ldc);
  parallel_blocks(M, kRows, [&](int64_t m0, int64_t m1) {
    thread_local std::vector<int32_t> acc;
    acc.resize(static_cast<size_t>(kRows * N));
    kernels::ref::gemm_s8_rows(acc.data(), N, A, s.lda, s.a_transposed, B, s.ldb,
                               s.b_transposed, N, s.K, m0, m1);
    kernels::ref::gemm_s8_epilogue(epi, acc.data(), N, m0, m1 - m0, 0, N);
  });
}

}  // namespace s3r::gemm::s8
