#pragma once
// s3r's own bf16 GEMM on CPUs with AVX-512 BF16 (internal; s3r/gemm/backend.hpp says when it is
// used): C (+)= op(A) op(B), bf16 operands, each output one f32 chain of vdpbf16ps over K in
// order (kernels/gemm_bf16.hpp), so the same bits for any thread count without fixed tiles.
#include "s3r/core/bf16.hpp"
#include "s3r/gemm/matmul.hpp"

namespace s3r::gemm::bf16_panels {

// `shape` has its leading dimensions resolved. Only where the CPU has AVX-512 BF16; with `amx`
// (only where the OS granted AMX-BF16) the blocks are AMX's tdpbf16ps (kernels/gemm_bf16.hpp),
// whose sums are the instruction's own, not vdpbf16ps's chain, and as thread-invariant.
void gemm(float* C, const bf16* A, const bf16* B, const MatmulShape& shape, bool accumulate, bool amx = false);

}  // namespace s3r::gemm::bf16_panels
