#pragma once
// s3r's own exact int8 GEMM (internal; s3r/gemm/backend.hpp says when it is used):
//   sum[m, n] = sum_k op(A)[m, k] op(B)[k, n]   exactly, in int32
// then the epilogue of s3r/gemm/matmul.hpp: C = sum (int32 output) or
//   C[m, n] (+)= (float(sum) * col_scale[n]) * row_scale[m]   (f32 output; a null scale is 1)
// in this order of f32 operations, the same in every backend.
#include <cstdint>
#include <utility>

#include "s3r/gemm/matmul.hpp"

namespace s3r::kernels {
struct DxTerms;
}

namespace s3r::gemm::s8 {

struct Output {
  int32_t* s32 = nullptr;  // exactly one of s32 / f32
  float* f32 = nullptr;
  const float* row_scale = nullptr;  // (M) or null
  const float* col_scale = nullptr;  // (N) or null
  bool accumulate = false;           // f32 only
  const kernels::DxTerms* dx = nullptr;  // f32 only: the dX epilogue instead of the scales
};

// Packed panels and the AVX2 microkernel (kernels/gemm_s8.hpp), OpenMP over output blocks; B
// packed whole, or, where M <= 768 and K >= 2048 (a weight's gradient), both operands packed by
// K slice within each block. Bit-identical for any thread count. `shape` has its leading
// dimensions resolved.
void gemm_avx2(const int8_t* A, const int8_t* B, const MatmulShape& shape, const Output& out);

// The AVX2 GEMM's blocks (mc, nc), in 6-row and 16-column micro-panels, for an output of
// m_panels x n_panels of them on `threads` threads (each thread takes one contiguous run of the
// blocks in row-major order): at most 24 x 16, at least four blocks per thread where the output
// allows, and among sizes down to half of that the ones whose largest run is the smallest.
std::pair<int64_t, int64_t> plan_avx2_blocks(int64_t m_panels, int64_t n_panels, int64_t threads);
// The blocks of the products packed by slice: at most 32 x 24 micro-panels, each dimension cut
// evenly (sizes ceil(panels / parts)), the largest run of blocks the cheapest by a cost model of
// the microkernel and the packing that every block repeats.
std::pair<int64_t, int64_t> plan_avx2_slice_blocks(int64_t m_panels, int64_t n_panels, int64_t threads);

// int8 panels and AMX tiles (kernels/gemm_s8.hpp's AMX block), OpenMP over 32 x 32 output
// blocks; only on a CPU whose AMX-INT8 state the OS granted. Bit-identical for any thread count.
void gemm_amx(const int8_t* A, const int8_t* B, const MatmulShape& shape, const Output& out);

// The same panels and blocks with AVX-512 VNNI's vpdpbusd (kernels/gemm_s8.hpp); only on a CPU
// with AVX-512 VNNI. K >= 66000 (where vpdpbusd's u8 x s8 sums could overflow) runs gemm_avx2.
void gemm_vnni(const int8_t* A, const int8_t* B, const MatmulShape& shape, const Output& out);

// Plain loops, OpenMP over rows: the fallback without AVX2, and the oracle of the tests.
void gemm_reference(const int8_t* A, const int8_t* B, const MatmulShape& shape, const Output& out);

}  // namespace s3r::gemm::s8
