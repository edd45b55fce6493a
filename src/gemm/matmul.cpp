// s3r::gemm's public products: shape checks, then the backend of each type
// (s3r/gemm/backend.hpp): oneDNN, s3r's own int8 GEMM, or f32-emulated bf16.
#include "s3r/gemm/matmul.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "core/parallel_blocks.hpp"
#include "gemm/bf16_gemm.hpp"
#include "gemm/matmul_dx.hpp"
#include "gemm/onednn_matmul.hpp"
#include "gemm/s8_gemm.hpp"
#include "kernels/dispatch.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/cpu_features.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/work.hpp"
#include "s3r/gemm/backend.hpp"

namespace s3r::gemm {

namespace {

using onednn::Type;

// Checks the dimensions and resolves leading dimensions of 0 to the packed row length.
MatmulShape resolved(const MatmulShape& s) {
  if (s.M < 1 || s.N < 1 || s.K < 1) {
    std::ostringstream msg;
    msg << "matmul: every dimension must be >= 1, got M x N x K = " << s.M << " x " << s.N << " x "
        << s.K;
    throw Error(msg.str());
  }
  MatmulShape r = s;
  r.lda = s.lda ? s.lda : (s.a_transposed ? s.M : s.K);
  r.ldb = s.ldb ? s.ldb : (s.b_transposed ? s.K : s.N);
  r.ldc = s.ldc ? s.ldc : s.N;
  if (s.row_phase < 0 || s.row_phase >= kFloatTileRows) {
    throw Error("matmul: row_phase must be in [0, " + std::to_string(kFloatTileRows) + "), got " +
                std::to_string(s.row_phase));
  }
  if (r.lda < (s.a_transposed ? s.M : s.K) || r.ldb < (s.b_transposed ? s.K : s.N) || r.ldc < s.N) {
    std::ostringstream msg;
    msg << "matmul: leading dimensions (" << r.lda << ", " << r.ldb << ", " << r.ldc
        << ") are shorter than the stored rows";
    throw Error(msg.str());
  }
  return r;
}

// Elements from the first to the last stored element of an operand of `rows` stored rows of
// `cols` values at stride `ld`.
int64_t stored_extent(int64_t rows, int64_t cols, int64_t ld) { return (rows - 1) * ld + cols; }

std::atomic<bool> g_thread_invariant{true};

// oneDNN's f32 and bf16 GEMMs split their work, K included, by thread count, and then add the
// partial sums in an order that depends on it: the results, and so every logged loss, change
// with OMP_NUM_THREADS. Seen with 1 vs 2 threads for native bf16 dW products on AVX-512 BF16
// (C = 256, F = 768, T = 1024), and with 1 vs 3 threads for f32 dX and dW products under oneDNN's
// AVX2 kernels (the same shapes). With thread invariance on (the default), products outside a
// parallel region run as fixed output tiles, each over the whole K on one thread (oneDNN runs
// single-threaded inside a parallel region; each thread passes its own scratchpad): the same
// bits for any thread count.
//
// A short edge tile (fewer than kFloatTileRows rows) whose A is stored by rows runs as a whole
// tile: its rows copied into a zero-padded buffer of kFloatTileRows rows at A's stride, the
// product into one at C's stride, and its rows copied back. Every tile of such a product then
// has one shape and a row's bits do not depend on how many rows come after it (a mixture of
// experts' ranks hold different numbers of an expert's rows); nor is a primitive made per row
// count. (A transposed: M is then a weight's dimension, the same on every rank.)
// `lead`: the tile's rows before the product's first (its row_phase, in the first tile).
void padded_tile(Type type, float* C, const char* a, const void* b, MatmulShape tile, int64_t lead, bool accumulate) {
  constexpr int64_t kTileM = kFloatTileRows;
  const int64_t bytes = type == Type::kF32 ? 4 : 2, rows = tile.M;
  thread_local std::vector<char> a_pad;
  thread_local AlignedVector<float> c_pad;
  a_pad.assign(static_cast<size_t>(bytes * kTileM * tile.lda), 0);
  std::memcpy(a_pad.data() + bytes * lead * tile.lda, a, static_cast<size_t>(bytes * ((rows - 1) * tile.lda + tile.K)));
  c_pad.resize(static_cast<size_t>(kTileM * tile.ldc));
  float* c_rows = c_pad.data() + lead * tile.ldc;
  const auto row_bytes = static_cast<size_t>(tile.N) * sizeof(float);
  if (accumulate) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(c_rows + r * tile.ldc, C + r * tile.ldc, row_bytes);
  }
  tile.M = kTileM;
  tile.row_phase = 0;
  onednn::run({type, type, Type::kF32, tile, nullptr, accumulate}, c_pad.data(), a_pad.data(), b);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(C + r * tile.ldc, c_rows + r * tile.ldc, row_bytes);
}

// The full tiles of a strided f32 operand, each stored contiguously from `offset` floats into
// `buf`: tile t's row r (of `rows`, `width` values each) read from src + r * ld + t * width.
const float* contiguous_tiles(AlignedVector<float>& buf, const float* src, int64_t tiles, int64_t rows,
                              int64_t width, int64_t ld, int64_t offset) {
  buf.resize(static_cast<size_t>(offset + tiles * rows * width));
  float* out = buf.data() + offset;
  work::add_bytes(static_cast<uint64_t>(8 * tiles * rows * width));  // read once, written once
  parallel_blocks(tiles * rows, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      std::memcpy(out + i * width, src + (i % rows) * ld + (i / rows) * width, static_cast<size_t>(width) * sizeof(float));
    }
  });
  return out;
}

void float_product(Type type, float* C, const void* A, const void* B, const MatmulShape& s, bool accumulate) {
  constexpr int64_t kTileM = kFloatTileRows, kTileN = 256, kBTilesOffset = 4;
  const int64_t phase = s.a_transposed ? 0 : s.row_phase;  // the grid's rows before row 0
  const int64_t tiles_m = (phase + s.M + kTileM - 1) / kTileM, tiles_n = (s.N + kTileN - 1) / kTileN;
  // One tile still runs inside the parallel region (on one thread): outside it, oneDNN would
  // split K over the threads.
  if (!g_thread_invariant || omp_in_parallel()) {
    onednn::run({type, type, Type::kF32, s, nullptr, accumulate}, C, A, B);
    return;
  }
  const int64_t bytes = type == Type::kF32 ? 4 : 2;
  const auto* a_bytes = static_cast<const char*>(A);
  const auto* b_bytes = static_cast<const char*>(B);
  // oneDNN's AVX2 f32 kernels run at half speed or less when a tile's operand rows lie far
  // apart: the 256 rows of a B of 4096 columns, 16 KB apart, share a few cache sets and fall out
  // of L2 between uses. Such an operand's full tiles, when several tiles read each, are first
  // copied one after another; edge tiles read the operand in place. On AVX2 the sums keep their
  // bits (the same kernel on the same values: a Zen 3's training steps gave the same losses, and
  // the LM head took a third less time); oneDNN's AVX-512 kernels, fast on such operands already,
  // may choose another kernel for another stride, so they read them in place as before. B's copy
  // starts 16 bytes past a 32-byte boundary: with its rows 32-byte aligned the same kernel took
  // 9% longer over the LM head's dW (X^T G, leaves of 512 tokens, `small`'s C 256) and 19%
  // longer at `wide`'s C 1024 (a Zen 3, in one process alternating; offsets of 2, 4 and 12
  // floats alike, 0 and 8 slow; the same bits). A's copy gained nothing from an offset.
  thread_local AlignedVector<float> a_tiles, b_tiles;
  const bool avx2_kernels = type == Type::kF32 && !cpu_features().avx512f;
  const bool tile_a = avx2_kernels && s.a_transposed && s.lda > kTileM && s.M >= kTileM && tiles_n > 1;
  const bool tile_b = avx2_kernels && !s.b_transposed && s.ldb > kTileN && s.N >= kTileN && tiles_m > 1;
  const float* a_tiled = tile_a ? contiguous_tiles(a_tiles, static_cast<const float*>(A), s.M / kTileM, s.K, kTileM, s.lda, 0) : nullptr;
  const float* b_tiled = tile_b ? contiguous_tiles(b_tiles, static_cast<const float*>(B), s.N / kTileN, s.K, kTileN, s.ldb, kBTilesOffset) : nullptr;
  // Tiles one at a time to whichever thread is free: edge tiles cost less than full ones.
  parallel_blocks_dynamic(tiles_m * tiles_n, 1, [&](int64_t t, int64_t) {
    const int64_t g0 = (t / tiles_n) * kTileM - phase, n0 = (t % tiles_n) * kTileN;  // the tile's rows [g0, g0 + 128)
    const int64_t m0 = std::max<int64_t>(g0, 0), lead = m0 - g0;
    MatmulShape tile = s;
    tile.row_phase = 0;
    tile.M = std::min(g0 + kTileM, s.M) - m0;
    tile.N = std::min(kTileN, s.N - n0);
    // op(A) rows m0.. are stored columns when A is transposed; op(B) columns n0.. likewise rows.
    const char* a = a_bytes + bytes * (s.a_transposed ? m0 : m0 * s.lda);
    const char* b = b_bytes + bytes * (s.b_transposed ? n0 * s.ldb : n0);
    if (a_tiled != nullptr && tile.M == kTileM) {
      a = reinterpret_cast<const char*>(a_tiled + m0 * s.K);
      tile.lda = kTileM;
    }
    if (b_tiled != nullptr && tile.N == kTileN) {
      b = reinterpret_cast<const char*>(b_tiled + n0 * s.K);
      tile.ldb = kTileN;
    }
    if (tile.M < kTileM && !s.a_transposed) return padded_tile(type, C + m0 * s.ldc + n0, a, b, tile, lead, accumulate);
    onednn::run({type, type, Type::kF32, tile, nullptr, accumulate}, C + m0 * s.ldc + n0, a, b);
  });
}

// The stored values widened to f32 (exact), into `buf` unless the caller holds them widened.
const float* widened(AlignedVector<float>& buf, const Bf16Operand& x, int64_t extent) {
  if (x.widened != nullptr) return x.widened;
  buf.resize(static_cast<size_t>(extent));
  float* out = buf.data();
  const bf16* in = x.values;
  parallel_blocks(extent, int64_t{1} << 14, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = to_float(in[i]);
  });
  return out;
}

// op(A) op(B) of bf16 operands as the f32 product of their widened values: each product of two
// bf16 values is exact in f32, so this is bf16 x bf16 with f32 accumulation (in oneDNN's f32
// summation order).
void emulated_bf16(float* C, const Bf16Operand& A, const Bf16Operand& B, const MatmulShape& s,
                   bool accumulate) {
  thread_local AlignedVector<float> a_buf, b_buf;
  const float* a = widened(a_buf, A, s.a_transposed ? stored_extent(s.K, s.M, s.lda)
                                                    : stored_extent(s.M, s.K, s.lda));
  const float* b = widened(b_buf, B, s.b_transposed ? stored_extent(s.N, s.K, s.ldb)
                                                    : stored_extent(s.K, s.N, s.ldb));
  float_product(Type::kF32, C, a, b, s, accumulate);
}

// The dX epilogue after oneDNN's int32 product, which goes to a scratch (grown once, reused).
void onednn_dx(const int8_t* A, const int8_t* B, const MatmulShape& s, const s8::Output& out) {
  thread_local std::vector<int32_t> sums;
  if (sums.size() < static_cast<size_t>(s.M * s.N)) sums.resize(static_cast<size_t>(s.M * s.N));
  MatmulShape product = s;
  product.ldc = s.N;
  onednn::run_int8_bucketed({Type::kS8, Type::kS8, Type::kS32, product}, sums.data(), A, B);
  const auto epilogue = kernels::active_kernels().dx_epilogue;
  const int32_t* acc = sums.data();
  parallel_blocks(s.M, 16, [&](int64_t m0, int64_t m1) {
    epilogue(out.f32, s.ldc, acc + m0 * s.N, s.N, m0, m1, 0, s.N, *out.dx);
  });
}

void int8_product(const int8_t* A, const int8_t* B, const MatmulShape& s, const s8::Output& out) {
  switch (int8_backend()) {
    case Int8Backend::kAmx: return s8::gemm_amx(A, B, s, out);
    case Int8Backend::kVnni: return s8::gemm_vnni(A, B, s, out);
    case Int8Backend::kAvx2: return s8::gemm_avx2(A, B, s, out);
    case Int8Backend::kReference: return s8::gemm_reference(A, B, s, out);
    case Int8Backend::kOnednn: break;
  }
  if (out.s32 != nullptr) {
    onednn::run_int8_bucketed({Type::kS8, Type::kS8, Type::kS32, s}, out.s32, A, B);
    return;
  }
  if (out.dx != nullptr) return onednn_dx(A, B, s, out);
  if (out.row_scale == nullptr) {  // fully fused: column scale and accumulation are post-ops
    onednn::run_int8_bucketed({Type::kS8, Type::kS8, Type::kF32, s, out.col_scale, out.accumulate}, out.f32, A, B);
    return;
  }
  // oneDNN 2.6 (Debian 12) runs a per-row (M x 1) binary post-op only in its reference int8
  // kernel, about 1000x slower than its brgemm kernels, so the row scale is one extra pass:
  // C (+)= row_scale[m] * (float(sum) * col_scale[n]), the order of the other backends.
  const int64_t M = s.M, N = s.N, ldc = s.ldc;
  float* C = out.f32;
  const bool accumulate = out.accumulate;
  thread_local AlignedVector<float> scratch;  // grown once, reused: no per-call allocation
  float* o = C;  // without accumulation the unscaled product goes to C and is scaled in place
  MatmulShape product = s;
  if (accumulate) {
    if (scratch.size() < static_cast<size_t>(M * N)) scratch.resize(static_cast<size_t>(M * N));
    o = scratch.data();
    product.ldc = N;
  }
  const int64_t ldo = product.ldc;
  onednn::run_int8_bucketed({Type::kS8, Type::kS8, Type::kF32, product, out.col_scale, false}, o, A, B);
  const float* row_scale = out.row_scale;
  parallel_blocks(M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float r = row_scale[m];
      float* c = C + m * ldc;
      const float* om = o + m * ldo;
      for (int64_t n = 0; n < N; ++n) {
        const float v = om[n] * r;
        c[n] = accumulate ? c[n] + v : v;
      }
    }
  });
}


// The work of one product (s3r/core/work.hpp): M N K multiply-adds of its type, and its
// operands' bytes (C twice when accumulated into).
void count_work(const MatmulShape& s, void (*add_macs)(uint64_t), uint64_t element_bytes_ab, uint64_t element_bytes_c,
                bool accumulate) {
  const auto M = static_cast<uint64_t>(s.M), N = static_cast<uint64_t>(s.N), K = static_cast<uint64_t>(s.K);
  add_macs(M * N * K);
  work::add_bytes(element_bytes_ab * (M * K + K * N) + element_bytes_c * M * N * (accumulate ? 2 : 1));
}

}  // namespace

void set_thread_invariant(bool on) { g_thread_invariant = on; }
bool thread_invariant() { return g_thread_invariant; }

void matmul_f32(float* C, const float* A, const float* B, const MatmulShape& shape,
                bool accumulate) {
  const MatmulShape s = resolved(shape);
  count_work(s, work::add_mac_f32, 4, 4, accumulate);
  float_product(Type::kF32, C, A, B, s, accumulate);
}

void matmul_bf16(float* C, const Bf16Operand& A, const Bf16Operand& B, const MatmulShape& shape,
                 bool accumulate) {
  const MatmulShape s = resolved(shape);
  count_work(s, work::add_mac_bf16, 2, 4, accumulate);
  if (bf16_backend() == Bf16Backend::kF32) {
    emulated_bf16(C, A, B, s, accumulate);
    return;
  }
  if (A.values == nullptr || B.values == nullptr) {
    throw Error("matmul_bf16: an operand holds only its f32-widened values (prepared while bf16 "
                "products were emulated, S3R_GEMM_BF16=f32), but the native bf16 backend reads "
                "bf16 values");
  }
  // s3r's own: the same bits for any split, no fixed tiles.
  if (own_bf16(bf16_backend())) {
    return bf16_panels::gemm(C, A.values, B.values, s, accumulate, bf16_backend() == Bf16Backend::kAmx);
  }
  float_product(Type::kBf16, C, A.values, B.values, s, accumulate);
}

void matmul_bf16(float* C, const bf16* A, const bf16* B, const MatmulShape& shape,
                 bool accumulate) {
  matmul_bf16(C, Bf16Operand{A}, Bf16Operand{B}, shape, accumulate);
}

void matmul_bf16(bf16* C, const bf16* A, const bf16* B, const MatmulShape& shape) {
  const MatmulShape s = resolved(shape);
  count_work(s, work::add_mac_bf16, 2, 2, false);
  if (bf16_backend() == Bf16Backend::kOnednn) {
    onednn::run({Type::kBf16, Type::kBf16, Type::kBf16, s}, C, A, B);
    return;
  }
  thread_local AlignedVector<float> out;
  out.resize(static_cast<size_t>(s.M * s.N));
  MatmulShape packed = s;
  packed.ldc = s.N;
  if (own_bf16(bf16_backend())) {
    bf16_panels::gemm(out.data(), A, B, packed, false, bf16_backend() == Bf16Backend::kAmx);
  } else {
    emulated_bf16(out.data(), Bf16Operand{A}, Bf16Operand{B}, packed, false);
  }
  for (int64_t m = 0; m < s.M; ++m) {
    for (int64_t n = 0; n < s.N; ++n) C[m * s.ldc + n] = to_bf16(out[m * s.N + n]);
  }
}

void matmul_s8(int32_t* C, const int8_t* A, const int8_t* B, const MatmulShape& shape) {
  s8::Output out;
  out.s32 = C;
  const MatmulShape s = resolved(shape);
  count_work(s, work::add_mac_s8, 1, 4, false);
  int8_product(A, B, s, out);
}

void matmul_s8_scaled(float* C, const int8_t* A, const int8_t* B, const MatmulShape& shape,
                      const float* row_scale, const float* col_scale, bool accumulate) {
  s8::Output out;
  out.f32 = C;
  out.row_scale = row_scale;
  out.col_scale = col_scale;
  out.accumulate = accumulate;
  const MatmulShape s = resolved(shape);
  count_work(s, work::add_mac_s8, 1, 4, accumulate);
  int8_product(A, B, s, out);
}

void matmul_s8_dx(float* dx, const int8_t* A, const int8_t* B, const MatmulShape& shape,
                  const kernels::DxTerms& d) {
  const MatmulShape s = resolved(shape);
  if (d.K != s.N || s.ldc != s.N) {
    throw Error("matmul_s8_dx: the terms' K (" + std::to_string(d.K) + ") and the output's row stride (" +
                std::to_string(s.ldc) + ") must be the product's N (" + std::to_string(s.N) + ")");
  }
  s8::Output out;
  out.f32 = dx;
  out.dx = &d;
  count_work(s, work::add_mac_s8, 1, 4, d.accumulate);
  int8_product(A, B, s, out);
}

std::string onednn_version() { return onednn::version(); }

int64_t matmul_primitive_count() { return onednn::primitive_count(); }

}  // namespace s3r::gemm
