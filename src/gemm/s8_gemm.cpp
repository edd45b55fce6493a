// s3r's exact int8 GEMMs (gemm/s8_gemm.hpp): the AVX2 one (int16-pair panels, below), the int8-
// panel one with AMX's or VNNI's 32 x 32 block (gemm_panels), and plain loops; the dequantizing
// epilogue is kernels/gemm_s8.hpp's.
//
// AVX2 blocking (GotoBLAS style, sized for a 32-48 KiB L1 and a >= 512 KiB L2): the whole of op(B) is
// packed once per call (2 bytes per code), in parallel; then every task computes one block of
// C, MC x NC (at most 144 x 256), K in slices of KC = 512 (256 pairs): for each slice, each
// 16-column B micro-panel (16 KiB, L1) meets every 6-row A micro-panel of the block (144 KiB,
// L2). A thread packs the A rows of its blocks itself, once per block row. A task's int32 sums
// live in a per-thread scratch tile that the epilogue turns into the output, so edges (M % 6,
// N % 16) and leading dimensions cost nothing in the kernel.
// Products with few rows and a long K (a weight's gradient: M and N are the layer's widths, K the
// step's tokens) pack by slice instead: a task packs the A and B panels of its block one K slice
// at a time, into buffers that stay in its caches, and its blocks are larger (up to 192 x 384).
// Packed whole, B (twice the bytes of its codes) would go through memory and be read back once
// per block row, and the blocks would be small to give every thread four.
// Integer sums are exact, so the result does not depend on the blocking or the thread count.
#include "gemm/s8_gemm.hpp"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "core/parallel_blocks.hpp"
#include "core/scratch.hpp"
#include "kernels/gemm_s8.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"

namespace s3r::gemm::s8 {

namespace {

using kernels::kS8Mr;
using kernels::kS8Nr;

constexpr int64_t kKcPairs = 256;     // K slice: 512 codes
constexpr int64_t kMcPanels = 24;     // rows of a block: 24 x 6 = 144 (each B micro-panel, from
                                      // memory, serves 24 A panels; with 96 rows, `wide`'s
                                      // products were 1-3% slower)
constexpr int64_t kNcPanels = 16;     // columns of a block: 16 x 16 = 256
constexpr int64_t kSliceMinK = 2048;      // products packed by slice: K >= 2048 (four slices) ...
constexpr int64_t kSliceMaxRows = 768;    // ... and M <= 768 (see gemm_avx2)
constexpr int64_t kSliceMcPanels = 32;    // their blocks: A slices of 192 rows (192 KiB) ...
constexpr int64_t kSliceNcPanels = 24;    // ... by 384 columns (int32 sums: up to 288 KiB)
constexpr int64_t kMaxExactK = 133000;  // K * 127^2 < 2^31
constexpr int64_t kL2PanelBytes = 512 << 10;  // packed B panels kept in L2 by the AMX/VNNI blocks

// op(X)[r, k] of an operand as rows r (of A: m; of B: n) and depth k: X[r * stride_r + k * stride_k].
struct Operand {
  const int8_t* data;
  int64_t stride_r, stride_k;
};

// The AVX2 GEMM's micro-panel packing (kernels/gemm_s8.hpp): the AVX2 tier's where the build has it.
void pack_pairs(uint32_t* out, const Operand& x, int64_t panel, int64_t width, int64_t rows, int64_t K,
                int64_t pairs) {
#ifdef S3R_HAVE_AVX2
  const auto pack = kernels::avx2::pack_s8_pairs;
#else
  const auto pack = kernels::ref::pack_s8_pairs;
#endif
  const int64_t r0 = panel * width, valid = std::clamp<int64_t>(rows - r0, 0, width);
  pack(out, x.data + (valid > 0 ? r0 * x.stride_r : 0), x.stride_r, x.stride_k, valid, width, K, pairs);
}

template <int64_t W>
void pack_all(std::vector<uint32_t>& buf, const Operand& x, int64_t rows, int64_t K, int64_t pairs) {
  const int64_t panels = (rows + W - 1) / W;
  uint32_t* out = scratch(buf, panels * pairs * W);
  parallel_blocks(panels, 1, [&](int64_t panel, int64_t) {
    pack_pairs(out + panel * pairs * W, x, panel, W, rows, K, pairs);
  });
}

// The epilogue's arguments for `out` (kernels/gemm_s8.hpp).
kernels::S8Epilogue epilogue_of(const Output& out, int64_t ldc) {
  return {out.s32, out.f32, ldc, out.row_scale, out.col_scale, out.accumulate, out.dx};
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

// The micro-panels of the largest thread's share when the blocks (mc x nc micro-panels, the
// last ones of a row or column smaller) go in row-major order, one contiguous run per thread.
int64_t largest_share(int64_t m_panels, int64_t n_panels, int64_t mc, int64_t nc, int64_t threads) {
  const int64_t m_blocks = (m_panels + mc - 1) / mc, n_blocks = (n_panels + nc - 1) / nc;
  const int64_t total = m_blocks * n_blocks, run = (total + threads - 1) / threads;
  int64_t largest = 0, share = 0;
  for (int64_t blk = 0; blk < total; ++blk) {
    if (blk % run == 0) share = 0;
    const int64_t ib = blk / n_blocks, jb = blk % n_blocks;
    share += std::min(mc, m_panels - ib * mc) * std::min(nc, n_panels - jb * nc);
    largest = std::max(largest, share);
  }
  return largest;
}

std::pair<int64_t, int64_t> search_avx2_blocks(int64_t m_panels, int64_t n_panels, int64_t threads) {
  // At most kMcPanels x kNcPanels micro-panels; smaller when that leaves fewer than four blocks
  // per thread (dW products have few rows and columns and a long K).
  int64_t mc = std::min(kMcPanels, m_panels), nc = std::min(kNcPanels, n_panels);
  auto blocks = [&] { return ((m_panels + mc - 1) / mc) * ((n_panels + nc - 1) / nc); };
  while (blocks() < 4 * threads && (nc > 2 || mc > 2)) {
    if (nc >= mc) {
      nc = (nc + 1) / 2;
    } else {
      mc = (mc + 1) / 2;
    }
  }
  // Where that leaves a thread more than 3% over an even split, the blocks down to half that
  // size whose largest run is the smallest (the largest such blocks): 9 blocks of `small`'s dW
  // products (43 x 48 micro-panels) left one thread 1280 micro-panels, the other 784 (a fifth of
  // the time idle); 12 blocks of 11 x 16 give 1056 and 1008. Smaller blocks where the split was
  // already even cost time: 9 x 16 instead of 16 x 16 made a 2048 x 2048 x 8192 product 7-12%
  // slower; `wide`'s and W3's 342-panel outputs take 19 x 16 (18 block rows, even), 1-3% faster
  // than 16 x 16.
  const int64_t even = (m_panels * n_panels + threads - 1) / threads;
  int64_t best = largest_share(m_panels, n_panels, mc, nc, threads);
  if (best * 100 <= even * 103) return {mc, nc};
  const int64_t mc0 = mc, nc0 = nc;
  for (int64_t m = mc0; m >= (mc0 + 1) / 2; --m) {
    for (int64_t n = nc0; n >= (nc0 + 1) / 2; --n) {
      const int64_t share = largest_share(m_panels, n_panels, m, n, threads);
      if (share < best) best = share, mc = m, nc = n;
    }
  }
  return {mc, nc};
}

// The slice path's blocks: the (mc, nc) whose largest run of blocks costs least, in cycles per
// pair of k: 8 per 6 x 16 micro-tile (24 vector operations on 3 ports) and about 11 per micro-
// panel packed (each block packs its own; measured on `small`'s dW products). Sizes of the form
// ceil(panels / parts), so that the blocks split each dimension evenly, and at least a quarter of
// the largest in each dimension (smaller ones repeat too much packing; the search stays short).
std::pair<int64_t, int64_t> search_slice_blocks(int64_t m_panels, int64_t n_panels, int64_t threads) {
  const int64_t mc_max = std::min(kSliceMcPanels, m_panels), nc_max = std::min(kSliceNcPanels, n_panels);
  const auto run_cost = [&](int64_t mc, int64_t nc) {
    const int64_t m_blocks = (m_panels + mc - 1) / mc, n_blocks = (n_panels + nc - 1) / nc;
    const int64_t total = m_blocks * n_blocks, run = (total + threads - 1) / threads;
    int64_t largest = 0, cost = 0;
    for (int64_t blk = 0; blk < total; ++blk) {
      if (blk % run == 0) cost = 0;
      const int64_t m = std::min(mc, m_panels - blk / n_blocks * mc), n = std::min(nc, n_panels - blk % n_blocks * nc);
      cost += 8 * m * n + 11 * (m + n);
      largest = std::max(largest, cost);
    }
    return largest;
  };
  // ceil(panels / parts) for parts = 1, 2, ..., each size once, from `largest` down to a quarter
  // of it (never empty: the first size <= largest is more than half of it)
  const auto sizes = [](int64_t panels, int64_t largest) {
    std::vector<int64_t> out;
    for (int64_t parts = 1; parts <= panels; ++parts) {
      const int64_t size = (panels + parts - 1) / parts;
      if (size < (largest + 3) / 4) break;
      if (size <= largest && (out.empty() || size != out.back())) out.push_back(size);
    }
    return out;
  };
  std::pair<int64_t, int64_t> best{0, 0};
  int64_t best_cost = 0;
  for (int64_t mc : sizes(m_panels, mc_max)) {
    for (int64_t nc : sizes(n_panels, nc_max)) {
      const int64_t cost = run_cost(mc, nc);
      if (best.first == 0 || cost < best_cost) best_cost = cost, best = {mc, nc};
    }
  }
  return best;
}

// Plans are kept per thread for the last few shapes (a model has a handful): the searches cost
// up to 1% of a product at `small`'s shapes.
template <class Search>
std::pair<int64_t, int64_t> cached_plan(bool slices, int64_t m_panels, int64_t n_panels, int64_t threads,
                                        Search search) {
  struct Plan {
    bool slices;
    int64_t m_panels, n_panels, threads, mc, nc;
  };
  thread_local std::array<Plan, 8> recent{};
  thread_local size_t next = 0;
  for (const Plan& p : recent) {
    if (p.slices == slices && p.m_panels == m_panels && p.n_panels == n_panels && p.threads == threads) {
      return {p.mc, p.nc};
    }
  }
  const auto [mc, nc] = search(m_panels, n_panels, threads);
  recent[next++ % recent.size()] = Plan{slices, m_panels, n_panels, threads, mc, nc};
  return {mc, nc};
}

}  // namespace

std::pair<int64_t, int64_t> plan_avx2_blocks(int64_t m_panels, int64_t n_panels, int64_t threads) {
  return cached_plan(false, m_panels, n_panels, threads, search_avx2_blocks);
}

std::pair<int64_t, int64_t> plan_avx2_slice_blocks(int64_t m_panels, int64_t n_panels, int64_t threads) {
  return cached_plan(true, m_panels, n_panels, threads, search_slice_blocks);
}

namespace {

// The AVX2 tier's microkernel and epilogue where the build has them (kernels/gemm_s8.hpp).
struct Avx2Kernels {
#ifdef S3R_HAVE_AVX2
  decltype(&kernels::avx2::gemm_s8_tile) tile = kernels::avx2::gemm_s8_tile;
  decltype(&kernels::avx2::gemm_s8_epilogue) epilogue = kernels::avx2::gemm_s8_epilogue;
#else
  decltype(&kernels::ref::gemm_s8_tile) tile = kernels::ref::gemm_s8_tile;
  decltype(&kernels::ref::gemm_s8_epilogue) epilogue = kernels::ref::gemm_s8_epilogue;
#endif
};

// The output's micro-panels cut into blocks of mc x nc of them; block blk of the row-major order.
struct Blocks {
  int64_t M, N, mc, nc, m_panels, n_panels, n_blocks, total;
  Blocks(int64_t M_, int64_t N_, std::pair<int64_t, int64_t> plan)
      : M(M_), N(N_), mc(plan.first), nc(plan.second), m_panels((M + kS8Mr - 1) / kS8Mr),
        n_panels((N + kS8Nr - 1) / kS8Nr), n_blocks((n_panels + nc - 1) / nc),
        total((m_panels + mc - 1) / mc * n_blocks) {}
  // Micro-panel rows [i0, i1) and columns [j0, j1) of block blk.
  struct Range {
    int64_t ib, i0, i1, j0, j1;
  };
  Range operator[](int64_t blk) const {
    const int64_t ib = blk / n_blocks, jb = blk % n_blocks;
    return {ib, ib * mc, std::min(m_panels, (ib + 1) * mc), jb * nc, std::min(n_panels, (jb + 1) * nc)};
  }
  // The epilogue of block r's int32 sums (row stride nc * kS8Nr).
  void finish(const Avx2Kernels& k, const kernels::S8Epilogue& epi, const int32_t* sums, const Range& r) const {
    const int64_t m0 = r.i0 * kS8Mr, n0 = r.j0 * kS8Nr;
    k.epilogue(epi, sums, nc * kS8Nr, m0, std::min(M, r.i1 * kS8Mr) - m0, n0, std::min(N, r.j1 * kS8Nr) - n0);
  }
};

// Pairs [p0, p1) of a packed B micro-panel (one 64-byte line per pair) on their way to L1.
void prefetch_pairs(const uint32_t* panel, int64_t p0, int64_t p1) {
  static_assert(kS8Nr * sizeof(uint32_t) == 64, "a pair of a B micro-panel is one cache line");
  for (int64_t p = p0; p < p1; ++p) __builtin_prefetch(panel + p * kS8Nr, 0, 3);
}

// B packed whole; blocks in row-major order, one contiguous run of them per thread (the blocks
// are cut by the thread count, which is not numerics: integer sums are exact): a task packs the
// A panels of a block row once, into its thread's buffer (hot in its L2), and reuses them for
// the following blocks of the same row. B, packed whole, is mostly in memory: its micro-panels are
// prefetched one ahead (the first A panel to meet a panel waited for it: 1.6-2x the time of the
// others at `wide`'s shapes).
void gemm_avx2_whole_b(const Operands& ops, const MatmulShape& s, const Output& out, int64_t threads) {
  const int64_t M = s.M, N = s.N, K = s.K, pairs = (K + 1) / 2;
  thread_local std::vector<uint32_t> b_packed;  // grown once, reused
  pack_all<kS8Nr>(b_packed, ops.b, N, K, pairs);
  const uint32_t* bp = b_packed.data();
  const Blocks blocks(M, N, plan_avx2_blocks((M + kS8Mr - 1) / kS8Mr, (N + kS8Nr - 1) / kS8Nr, threads));
  const int64_t ld_acc = blocks.nc * kS8Nr;
  const Avx2Kernels k;
  const kernels::S8Epilogue epi = epilogue_of(out, s.ldc);
  parallel_blocks(blocks.total, (blocks.total + threads - 1) / threads, [&](int64_t blk0, int64_t blk1) {
    thread_local std::vector<uint32_t> a_block;
    thread_local std::vector<int32_t> acc;
    int64_t packed_row = -1;
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      const Blocks::Range r = blocks[blk];
      uint32_t* ap = scratch(a_block, blocks.mc * pairs * kS8Mr);
      if (r.ib != packed_row) {
        for (int64_t i = r.i0; i < r.i1; ++i) pack_pairs(ap + (i - r.i0) * pairs * kS8Mr, ops.a, i, kS8Mr, M, K, pairs);
        packed_row = r.ib;
      }
      int32_t* sums = scratch(acc, blocks.mc * kS8Mr * ld_acc);
      for (int64_t p0 = 0; p0 < pairs; p0 += kKcPairs) {
        const int64_t kc = std::min(kKcPairs, pairs - p0);
        for (int64_t j = r.j0; j < r.j1; ++j) {
          const uint32_t* b = bp + (j * pairs + p0) * kS8Nr;
          // the B slice the block needs next, fetched a share before each A panel meets this one
          const bool last_j = j + 1 == r.j1;
          const int64_t next_kc = last_j ? std::clamp<int64_t>(pairs - p0 - kKcPairs, 0, kKcPairs) : kc;
          const uint32_t* next = !last_j     ? b + pairs * kS8Nr
                                 : next_kc > 0 ? bp + (r.j0 * pairs + p0 + kKcPairs) * kS8Nr
                                               : b;
          const int64_t rows = r.i1 - r.i0, share = (next_kc + rows - 1) / rows;
          for (int64_t i = 0; i < rows; ++i) {
            prefetch_pairs(next, i * share, std::min(next_kc, (i + 1) * share));
            k.tile(ap + (i * pairs + p0) * kS8Mr, b, kc, sums + i * kS8Mr * ld_acc + (j - r.j0) * kS8Nr, ld_acc,
                   p0 > 0);
          }
        }
      }
      blocks.finish(k, epi, sums, r);
    }
  });
}

// Packed by slice: for each K slice of its block, a task packs the block's A panels (L2) and
// then each B panel (L1) just before the A panels meet it.
void gemm_avx2_by_slice(const Operands& ops, const MatmulShape& s, const Output& out, int64_t threads) {
  const int64_t M = s.M, N = s.N, K = s.K, pairs = (K + 1) / 2;
  const Blocks blocks(M, N, plan_avx2_slice_blocks((M + kS8Mr - 1) / kS8Mr, (N + kS8Nr - 1) / kS8Nr, threads));
  const int64_t ld_acc = blocks.nc * kS8Nr;
  const Avx2Kernels k;
  const kernels::S8Epilogue epi = epilogue_of(out, s.ldc);
  parallel_blocks(blocks.total, (blocks.total + threads - 1) / threads, [&](int64_t blk0, int64_t blk1) {
    thread_local std::vector<uint32_t> a_slice, b_slice;
    thread_local std::vector<int32_t> acc;
    uint32_t* ap = scratch(a_slice, blocks.mc * kKcPairs * kS8Mr);
    uint32_t* bp = scratch(b_slice, kKcPairs * kS8Nr);
    int32_t* sums = scratch(acc, blocks.mc * kS8Mr * ld_acc);
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      const Blocks::Range r = blocks[blk];
      for (int64_t p0 = 0; p0 < pairs; p0 += kKcPairs) {
        // K slice [k0, k0 + depth): kc pairs (the last one's high half 0 where depth is odd)
        const int64_t kc = std::min(kKcPairs, pairs - p0), k0 = 2 * p0, depth = std::min(2 * kc, K - k0);
        const Operand a{ops.a.data + k0 * ops.a.stride_k, ops.a.stride_r, ops.a.stride_k};
        const Operand b{ops.b.data + k0 * ops.b.stride_k, ops.b.stride_r, ops.b.stride_k};
        for (int64_t i = r.i0; i < r.i1; ++i) pack_pairs(ap + (i - r.i0) * kc * kS8Mr, a, i, kS8Mr, M, depth, kc);
        for (int64_t j = r.j0; j < r.j1; ++j) {
          pack_pairs(bp, b, j, kS8Nr, N, depth, kc);
          for (int64_t i = 0; i < r.i1 - r.i0; ++i) {
            k.tile(ap + i * kc * kS8Mr, bp, kc, sums + i * kS8Mr * ld_acc + (j - r.j0) * kS8Nr, ld_acc, p0 > 0);
          }
        }
      }
      blocks.finish(k, epi, sums, r);
    }
  });
}

}  // namespace

void gemm_avx2(const int8_t* A, const int8_t* B, const MatmulShape& s, const Output& out) {
#ifndef S3R_HAVE_AVX2
  throw Error("int8 GEMM: this build has no AVX2 kernels (configured with -DS3R_AVX2=OFF)");
#endif
  check_depth(s.K);
  const int64_t threads = parallel_threads();
  // By slice where B packed whole would cost more than the packing the blocks repeat: at
  // `small`'s dW products (M 256 or 768, K 4096) 4-16% faster, at `wide`'s (M 1024 or 4096,
  // K 2048) 1-10% slower (2026-12-05, Emerald Rapids under S3R_MAX_ISA=avx2).
  if (s.K >= kSliceMinK && s.M <= kSliceMaxRows) return gemm_avx2_by_slice(operands(A, B, s), s, out, threads);
  gemm_avx2_whole_b(operands(A, B, s), s, out, threads);
}

namespace {

#ifdef S3R_HAVE_AVX512
enum class PanelBlock { kAmx, kVnni };

// The operands of one product as the blocks read them (kernels/gemm_s8.hpp): B packed whole
// (VNNI: codes + 128); A packed unless the blocks can read it in place (VNNI: a k-major A packed
// by quads, like B, which needs no transpose).
struct Panels {
  Operands ops;
  int64_t M, K, kp;
  bool a_direct, a_quads;
  int64_t a_first;  // the first A panel packed (those before are read in place)
  const int8_t* ap;
  const int8_t* bp;

  // Block row m0's 32 rows of A: in op(A) itself, or packed (by rows or by quads).
  kernels::S8Rows a_rows(int64_t m0) const {
    using kernels::kAmxBlock, kernels::kAmxRows;
    if (a_direct && m0 + kAmxBlock <= M) {
      const int64_t lda = ops.a.stride_r;
      return {ops.a.data + m0 * lda, lda, 4, kAmxRows * lda};
    }
    const int8_t* a = ap + (m0 / kAmxRows - a_first) * kAmxRows * kp;
    return a_quads ? kernels::S8Rows{a, 4, 64, kAmxRows * kp} : kernels::S8Rows{a, kp, 4, kAmxRows * kp};
  }
};

// Packs what the blocks cannot read in place, into this thread's buffers.
Panels pack_panels(const Operands& ops, int64_t M, int64_t N, int64_t K, bool vnni) {
  using kernels::kAmxBlock, kernels::kAmxDepth, kernels::kAmxRows;
  namespace k512 = kernels::avx512;
  const int64_t kp = (K + kAmxDepth - 1) / kAmxDepth * kAmxDepth;
  const int64_t m_blocks = (M + kAmxBlock - 1) / kAmxBlock, n_blocks = (N + kAmxBlock - 1) / kAmxBlock;
  // op(A) rows contiguous and K a multiple of 64: the blocks read A itself, and only a last,
  // partial block of rows is packed (zero rows after M).
  // ... and A itself on a 64-byte boundary (its rows then are too): a tile row across two cache
  // lines costs two reads.
  const bool a_direct = ops.a.stride_k == 1 && K % kAmxDepth == 0 && reinterpret_cast<uintptr_t>(ops.a.data) % 64 == 0;
  const bool a_quads = vnni && ops.a.stride_k != 1;
  const int64_t a_first = a_direct ? M / kAmxBlock * 2 : 0;
  const int64_t a_panels = 2 * m_blocks - a_first, b_panels = 2 * n_blocks;
  thread_local AlignedVector<int8_t> a_packed, b_packed;  // grown once, reused; 64-byte rows
  int8_t* ap = scratch(a_packed, a_panels * kAmxRows * kp);
  int8_t* bp = scratch(b_packed, b_panels * kAmxRows * kp);
  const auto pack_a = a_quads ? k512::pack_amx_b : k512::pack_amx_a;
  const auto pack_b = vnni ? k512::pack_vnni_b : k512::pack_amx_b;
  // A k-major operand is packed in one task per thread, in whole fours of panels, so that each
  // task reads long runs of the operand's rows in order; others panel by panel.
  const int64_t threads = parallel_threads();
  const auto group_of = [&](const Operand& x, int64_t panels) -> int64_t {
    if (x.stride_k == 1) return 1;
    return std::max<int64_t>(4, (panels + 4 * threads - 1) / (4 * threads) * 4);
  };
  const int64_t a_group = group_of(ops.a, a_panels), b_group = group_of(ops.b, b_panels);
  const int64_t a_tasks = (a_panels + a_group - 1) / a_group, b_tasks = (b_panels + b_group - 1) / b_group;
  // Handed out one at a time: A's tasks and B's differ in size.
  parallel_blocks_dynamic(a_tasks + b_tasks, 1, [&](int64_t t, int64_t) {
    const bool is_a = t < a_tasks;
    const int64_t group = is_a ? a_group : b_group, total = is_a ? a_panels : b_panels;
    const int64_t panel = (is_a ? t : t - a_tasks) * group, panels = std::min(group, total - panel);
    const int64_t r0 = (is_a ? a_first + panel : panel) * kAmxRows;
    const Operand& x = is_a ? ops.a : ops.b;
    const int64_t valid = std::clamp<int64_t>((is_a ? M : N) - r0, 0, panels * kAmxRows);
    const int8_t* first = x.data + (valid > 0 ? r0 * x.stride_r : 0);
    (is_a ? pack_a : pack_b)((is_a ? ap : bp) + panel * kAmxRows * kp, first, x.stride_r,
                             x.stride_k, valid, panels, K, kp);
  });
  return {ops, M, K, kp, a_direct, a_quads, a_first, ap, bp};
}

// The int8-panel GEMM with AMX's or VNNI's block: the panels, then 32 x 32 blocks, each
// dequantized by the epilogue as soon as it is summed.
void gemm_panels(const int8_t* A, const int8_t* B, const MatmulShape& s, const Output& out,
                 PanelBlock kind) {
  using kernels::kAmxBlock;
  namespace k512 = kernels::avx512;
  const int64_t M = s.M, N = s.N;
  const bool vnni = kind == PanelBlock::kVnni;
  const Panels p = pack_panels(operands(A, B, s), M, N, s.K, vnni);
  const int64_t kp = p.kp;
  const int64_t m_blocks = (M + kAmxBlock - 1) / kAmxBlock, n_blocks = (N + kAmxBlock - 1) / kAmxBlock;
  // One contiguous run of blocks per thread, in the order of block_at: row-major within a chunk
  // of columns, so that consecutive blocks share their A rows.
  // Integer sums are exact, so neither the order nor the split (by thread count) is numerics.
  const int64_t threads = parallel_threads();
  const int64_t total = m_blocks * n_blocks;
  // VNNI: every block row's code sums once, before the blocks: a thread's run of blocks meets
  // each block row once per chunk of B panels, and summing them there each time took 2-3% of
  // the blocks' time at `wide` (up to 8 chunks per product).
  thread_local AlignedVector<int32_t> row_sums;
  int32_t* a_sums = vnni ? scratch(row_sums, m_blocks * kAmxBlock) : nullptr;
  if (vnni) {
    parallel_blocks(m_blocks, 1, [&](int64_t mb, int64_t) {
      k512::row_sums_s8(a_sums + mb * kAmxBlock, p.a_rows(mb * kAmxBlock), kp);
    });
  }
  kernels::S8Epilogue epi = epilogue_of(out, s.ldc);
  // VNNI: an output larger than the threads' share of L2 goes to memory by non-temporal stores,
  // without the read of each line a store to it would cost first: on an AMD Zen 4 the GEMMs of
  // `small` (outputs of 4-12 MB) took 169-198 against 226-268 ms per step, while the host's
  // memory was busy the step 10-15% less; in a calm spell their consumers, reading the outputs
  // from memory, gave most of it back (2026-12-05; docs/TRAINING.md). AMX: the same for every
  // output but dX's. On the Emerald Rapids VM, whose cores write to memory at 18 GB/s with plain
  // stores and 45 non-temporal, the GEMMs of `small` took 71-75 against 80-81 ms per step and the
  // step 285-291 against 288-294 (three alternations, 2026-12-07); streamed too, dX's outputs,
  // which RMSNorm's backward reads next, cost that phase 2-3 ms and gained nothing.
  epi.stream = (vnni || out.dx == nullptr) && M * N * int64_t{sizeof(float)} > threads * kL2PanelBytes;
  // The blocks go by chunks of B panels that stay in L2 (kL2PanelBytes) while every block row of
  // A meets them; sweeping all of B once per block row read it from L3 when it was larger than L2
  // (4 MB for N x K = 4096 x 1024): 1.3-1.4x slower on two threads of the Emerald Rapids VM.
  const int64_t chunk = std::clamp<int64_t>(kL2PanelBytes / (kAmxBlock * kp), 1, n_blocks);
  const auto block_at = [&](int64_t blk) {  // (m0, n0) of the blk-th block in this order
    const int64_t c = blk / (m_blocks * chunk), first = c * chunk;
    const int64_t width = std::min(chunk, n_blocks - first), r = blk - c * m_blocks * chunk;
    return std::pair{r / width * kAmxBlock, (first + r % width) * kAmxBlock};
  };
  // AMX: a block's sums stay in the tiles while the previous block's epilogue runs (the tile unit
  // computes meanwhile; the epilogue's output rows are mostly misses to memory), then go to the
  // other buffer: about 2% less time over the nine products of `wide`'s layers (2048 tokens).
  parallel_blocks(total, (total + threads - 1) / threads, [&](int64_t blk0, int64_t blk1) {
    alignas(64) int32_t acc[2][kAmxBlock * kAmxBlock];
    std::pair<int64_t, int64_t> pending{0, 0};  // (m0, n0) of the AMX block in acc[1 - cur]
    int cur = 0;
    const auto finish = [&](const int32_t* sums, std::pair<int64_t, int64_t> at) {
      const auto [m0, n0] = at;
      k512::gemm_s8_epilogue(epi, sums, kAmxBlock, m0, std::min(kAmxBlock, M - m0), n0,
                             std::min(kAmxBlock, N - n0));
    };
    if (!vnni) kernels::amx::amx_tiles_configure();
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      const auto at = block_at(blk);
      const kernels::S8Rows a = p.a_rows(at.first);
      const int8_t* b = p.bp + at.second * kp;
      if (vnni) {
        k512::gemm_s8_vnni_block(a, a_sums + at.first, b, kp, acc[0], kAmxBlock);
        finish(acc[0], at);
        continue;
      }
      kernels::amx::gemm_s8_amx_sum(a.a, a.row, b, kp);
      if (blk > blk0) finish(acc[1 - cur], pending);
      kernels::amx::gemm_s8_amx_store(acc[cur], kAmxBlock);
      pending = at;
      cur = 1 - cur;
    }
    if (!vnni) {
      if (blk1 > blk0) finish(acc[1 - cur], pending);
      kernels::amx::amx_tiles_release();
    }
    if (epi.stream) _mm_sfence();  // this thread's non-temporal stores done before the join
  });
}

// AMX products with a long K and an output that fits the threads' L2s (a weight's gradient at
// `small`: 256 x 768 or 768 x 256 over the step's 4096 tokens) go by K slices instead, as the
// AVX2 GEMM's do: packed whole, their operands (1-3 MB each, a k-major A transposed) went to
// memory and came back once per chunk of B panels, and the transposing packing ran at 5-6 GB/s
// per thread on the Emerald Rapids VM (15 GB/s when it stays in L2). There, two threads: 768 x
// 256 x 4096 in 0.45-0.47 ms against 0.93-0.97, 256 x 768 0.44-0.45 against 0.58-0.59, 256 x
// 256 0.19 against 0.25; slices of 256, 768, 1024 and 2048 k took 2-35% longer than 512.
constexpr int64_t kAmxSliceK = 512;      // a slice's depth: 16 KB per block row of A (L1)
constexpr int64_t kAmxSliceMinK = 2048;  // two slices at least
// A thread's int32 sums: up to half of an AMX core's 2 MB L2, beside its slices of A and B. With
// 512 KB, one thread (an MPI rank of two on two cores) took 768 x 256 x 4096 the whole way, 1.32
// ms against 0.92 by slices; at 1024 x 1024 x 2048 slices gained nothing (1.22-1.25 ms either
// way, two threads), so larger outputs keep the panels packed whole.
constexpr int64_t kAmxSliceSumsBytes = 1 << 20;

bool amx_by_slice(const MatmulShape& s, int64_t threads) {
  return s.K >= kAmxSliceMinK && s.M * s.N * int64_t{sizeof(int32_t)} <= threads * kAmxSliceSumsBytes;
}

// Each thread takes a contiguous share of the larger dimension's 32-wide blocks and all of the
// other's; per slice of K it packs its A rows and B columns into its own buffers (its L2), then
// adds the slice to each of its blocks' int32 sums (kept in its buffer between slices); the
// epilogue runs on the whole sums at the end. The split is by the thread count, which is not
// numerics: integer sums are exact.
void gemm_amx_by_slice(const Operands& ops, const MatmulShape& s, const Output& out, int64_t threads) {
  using kernels::kAmxBlock, kernels::kAmxDepth, kernels::kAmxRows;
  namespace k512 = kernels::avx512;
  const int64_t M = s.M, N = s.N, K = s.K;
  const int64_t m_blocks = (M + kAmxBlock - 1) / kAmxBlock, n_blocks = (N + kAmxBlock - 1) / kAmxBlock;
  const bool by_rows = m_blocks >= n_blocks;
  const int64_t parts = by_rows ? m_blocks : n_blocks;
  const kernels::S8Epilogue epi = epilogue_of(out, s.ldc);
  parallel_blocks(parts, (parts + threads - 1) / threads, [&](int64_t p0, int64_t p1) {
    const int64_t mb0 = by_rows ? p0 : 0, mb1 = by_rows ? p1 : m_blocks;
    const int64_t nb0 = by_rows ? 0 : p0, nb1 = by_rows ? n_blocks : p1;
    const int64_t m0 = mb0 * kAmxBlock, n0 = nb0 * kAmxBlock;
    const int64_t rows = (mb1 - mb0) * kAmxBlock, cols = (nb1 - nb0) * kAmxBlock;
    thread_local AlignedVector<int8_t> a_slice, b_slice;
    thread_local AlignedVector<int32_t> sums_buffer;
    int8_t* ap = scratch(a_slice, rows * kAmxSliceK);
    int8_t* bp = scratch(b_slice, cols * kAmxSliceK);
    int32_t* sums = scratch(sums_buffer, rows * cols);
    kernels::amx::amx_tiles_configure();
    for (int64_t k0 = 0; k0 < K; k0 += kAmxSliceK) {
      const int64_t depth = std::min(kAmxSliceK, K - k0), kp = (depth + kAmxDepth - 1) / kAmxDepth * kAmxDepth;
      const int64_t a_valid = std::min(rows, M - m0), b_valid = std::min(cols, N - n0);
      k512::pack_amx_a(ap, ops.a.data + k0 * ops.a.stride_k + m0 * ops.a.stride_r, ops.a.stride_r,
                       ops.a.stride_k, a_valid, rows / kAmxRows, depth, kp);
      k512::pack_amx_b(bp, ops.b.data + k0 * ops.b.stride_k + n0 * ops.b.stride_r, ops.b.stride_r,
                       ops.b.stride_k, b_valid, cols / kAmxRows, depth, kp);
      for (int64_t i = 0; i < rows; i += kAmxBlock) {  // a block row of A (L1) meets every B block (L2)
        for (int64_t j = 0; j < cols; j += kAmxBlock) {
          int32_t* c = sums + i * cols + j;
          if (k0 > 0) kernels::amx::gemm_s8_amx_load(c, cols);
          (k0 > 0 ? kernels::amx::gemm_s8_amx_add : kernels::amx::gemm_s8_amx_sum)(ap + i * kp, kp, bp + j * kp, kp);
          kernels::amx::gemm_s8_amx_store(c, cols);
        }
      }
    }
    kernels::amx::amx_tiles_release();
    for (int64_t i = 0; i < rows && m0 + i < M; i += kAmxBlock) {
      for (int64_t j = 0; j < cols && n0 + j < N; j += kAmxBlock) {
        k512::gemm_s8_epilogue(epi, sums + i * cols + j, cols, m0 + i, std::min(kAmxBlock, M - m0 - i), n0 + j,
                               std::min(kAmxBlock, N - n0 - j));
      }
    }
  });
}
#endif

}  // namespace

void gemm_amx(const int8_t* A, const int8_t* B, const MatmulShape& s, const Output& out) {
  check_depth(s.K);
#ifdef S3R_HAVE_AVX512
  const int64_t threads = parallel_threads();
  if (amx_by_slice(s, threads)) return gemm_amx_by_slice(operands(A, B, s), s, out, threads);
  gemm_panels(A, B, s, out, PanelBlock::kAmx);
#else
  (void)A, (void)B, (void)out;
  throw Error("int8 GEMM: this build has no AMX kernels (configured with -DS3R_AVX512=OFF)");
#endif
}

void gemm_vnni(const int8_t* A, const int8_t* B, const MatmulShape& s, const Output& out) {
  check_depth(s.K);
  // vpdpbusd sums codes + 128 times codes: exact in int32 only for K < kVnniMaxK.
  if (s.K >= kernels::kVnniMaxK) return gemm_avx2(A, B, s, out);
#ifdef S3R_HAVE_AVX512
  gemm_panels(A, B, s, out, PanelBlock::kVnni);
#else
  (void)A, (void)B, (void)out;
  throw Error("int8 GEMM: this build has no AVX-512 kernels (configured with -DS3R_AVX512=OFF)");
#endif
}

void gemm_reference(const int8_t* A, const int8_t* B, const MatmulShape& s, const Output& out) {
  check_depth(s.K);
  const int64_t M = s.M, N = s.N;
  constexpr int64_t kRows = 16;
  const kernels::S8Epilogue epi = epilogue_of(out, s.ldc);
  parallel_blocks(M, kRows, [&](int64_t m0, int64_t m1) {
    thread_local std::vector<int32_t> acc;
    int32_t* sums = scratch(acc, kRows * N);
    kernels::ref::gemm_s8_rows(sums, N, A, s.lda, s.a_transposed, B, s.ldb, s.b_transposed, N, s.K, m0, m1);
    kernels::ref::gemm_s8_epilogue(epi, sums, N, m0, m1 - m0, 0, N);
  });
}

}  // namespace s3r::gemm::s8
