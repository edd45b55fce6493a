#pragma once
// The int8 linear layer's dX product with its epilogue fused (internal: src/nn's QuantLinear):
//   dX (T, K) = kernels' dx_epilogue of the exact int32 sums G_q W_q^T   {M=T, N=K, K=N, b_transposed}
// with the terms of kernels::DxTerms (SPEC section 4: the dequantization and S3R-EC's dX term),
// so the (T, K) int32 sums never go through memory. s3r's own GEMMs (AMX, VNNI, AVX2, reference)
// apply it to each output block as the block is summed; oneDNN's int8 product writes the sums
// to a scratch first. The same bits in every backend and for any thread count. d.K == shape.N and
// the output's rows are packed (shape.ldc 0 or N).
#include <cstdint>

#include "kernels/kernels.hpp"
#include "s3r/gemm/matmul.hpp"

namespace s3r::gemm {

void matmul_s8_dx(float* dx, const int8_t* A, const int8_t* B, const MatmulShape& shape,
                  const kernels::DxTerms& d);

}  // namespace s3r::gemm
