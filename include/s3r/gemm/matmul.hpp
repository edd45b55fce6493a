#pragma once
// Matrix products of every type s3r needs. Which code computes them is chosen per type and per
// CPU (s3r/gemm/backend.hpp): oneDNN where it is exact and fast, s3r's own exact int8 GEMM
// elsewhere, bf16 emulated in f32 on CPUs without bf16 hardware.
//
//   C (M, N) = op(A) (M, K) x op(B) (K, N), row-major storage everywhere.
//   A is stored (M, K), or (K, M) when a_transposed; B is stored (K, N), or (N, K) when
//   b_transposed. Transposes are memory strides, never copies. The three products of a linear
//   layer Y = X W with X (T, K), W (K, N), G (T, N):
//     forward   Y  = X W     {M=T, N=N, K=K}
//     dX        dX = G W^T   {M=T, N=K, K=N, b_transposed}
//     dW        dW = X^T G   {M=K, N=N, K=T, a_transposed}
//
// Accumulation: f32 for f32 and bf16 operands, exact int32 for int8 operands. `accumulate`
// adds the product to C instead of overwriting it (oneDNN's sum post-op).
// Threads: the OpenMP pool (omp_get_max_threads()); called from inside an OpenMP parallel
// region, a product runs on the calling thread (each thread has its own oneDNN stream and
// scratch). Every int8 backend gives the same bits for any thread count.
#include <cstdint>
#include <string>

#include "s3r/core/bf16.hpp"

namespace s3r::gemm {

struct MatmulShape {
  int64_t M = 0, N = 0, K = 0;
  bool a_transposed = false;
  bool b_transposed = false;
  // Leading dimensions (elements between consecutive stored rows); 0: packed (the stored row
  // length). They let a product read a column slice, such as one attention head of (T, C).
  int64_t lda = 0, ldb = 0, ldc = 0;
  // f32 and bf16 products with thread invariance on and A stored by rows: the rows of the fixed
  // tile grid before this product's first row, 0 <= row_phase < kFloatTileRows (tile t holds rows
  // [128 t - row_phase, 128 (t + 1) - row_phase)). Rows that are the same rows of a longer
  // product starting row_phase rows earlier then get its bits (a mixture of experts' ranks each
  // hold a run of an expert's rows). Ignored otherwise.
  int64_t row_phase = 0;
};

void matmul_f32(float* C, const float* A, const float* B, const MatmulShape& shape,
                bool accumulate = false);

// A bf16 operand as stored, and optionally the same values widened to f32 (to_float of each,
// same layout), which the f32-emulated backend then reads instead of widening them on every
// call (a weight used by several products is widened once). Ignored by native backends. An
// operand may hold only its widened values (values null) where the products are emulated; the
// native backend refuses such an operand (s3r::Error).
struct Bf16Operand {
  const bf16* values = nullptr;
  const float* widened = nullptr;
};

// bf16 x bf16 with f32 accumulation, f32 or bf16 output.
void matmul_bf16(float* C, const Bf16Operand& A, const Bf16Operand& B, const MatmulShape& shape,
                 bool accumulate = false);
void matmul_bf16(float* C, const bf16* A, const bf16* B, const MatmulShape& shape,
                 bool accumulate = false);
void matmul_bf16(bf16* C, const bf16* A, const bf16* B, const MatmulShape& shape);

// Thread-count invariance of f32 and bf16 products (on by default): oneDNN's GEMMs split their
// work, K included, by thread count (native bf16 dW products on AVX-512 BF16; f32 dX and dW
// products on its AVX2 kernels), so their f32 sums differ with OMP_NUM_THREADS. With this on,
// products outside an OpenMP parallel region run as fixed 128 x 256 output tiles, each over the
// whole K on one thread, and give the same bits for any thread count. The trainer keeps it on
// (every logged number is the same for any thread count); the benchmarks turn it off so that
// the f32 and bf16 baselines are oneDNN's own (bench step keeps it on for the int8 recipes'
// LM head, as training runs it). It may be switched between products: oneDNN's plans are kept
// per setting. int8 products are exact either way.
// The tiles are planned for one thread (oneDNN would otherwise plan a K split for the threads it
// sees). A row of a product depends on the tile's height too (oneDNN picks other kernels for
// short tiles), so a short edge tile of a product whose A is stored by rows runs as a whole tile
// on a zero-padded copy: a row's bits then do not depend on how many rows come after it. They
// can depend on its place in the tile (oneDNN's AVX2 f32 kernels compute a tile's short last
// block of rows otherwise), so data-parallel ranks see the same rows only when each rank's first
// row falls where it does in one process: kFloatTileRows divides every rank's token count
// (s3r/train/data_parallel.hpp), and a mixture of experts' rows start at MatmulShape::row_phase.
void set_thread_invariant(bool on);
bool thread_invariant();
inline constexpr int64_t kFloatTileRows = 128;

// int8 x int8 -> int32, exact.
void matmul_s8(int32_t* C, const int8_t* A, const int8_t* B, const MatmulShape& shape);

// int8 x int8 with the dequantization fused into the product:
//   C[m, n] (+)= (float(sum) * col_scale[n]) * row_scale[m],  sum = sum_k op(A)[m, k] op(B)[k, n]
// in this order of f32 operations (the same bits in every backend); row_scale (M) and
// col_scale (N) may be null (= 1). The int32 sum is exact. On oneDNN the column scale and the
// accumulation are fused into its kernel (binary-multiply and sum post-ops) and the row scale is
// one extra pass over C (oneDNN 2.6 has no fast kernel for a per-row post-op); s3r's own GEMM
// applies all three in its epilogue.
void matmul_s8_scaled(float* C, const int8_t* A, const int8_t* B, const MatmulShape& shape,
                      const float* row_scale, const float* col_scale, bool accumulate = false);

// "major.minor.patch" of the oneDNN library in use.
std::string onednn_version();

// Number of distinct primitives created so far (for tests of the cache).
int64_t matmul_primitive_count();

}  // namespace s3r::gemm
