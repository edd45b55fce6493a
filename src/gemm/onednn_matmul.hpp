#pragma once
// oneDNN's matmul primitive behind s3r::gemm (internal): one call for every type combination,
// primitives cached per (types, shape, layout, fused ops). Shapes are validated by the caller
// (gemm/matmul.cpp); leading dimensions arrive resolved (never 0).
//
// Before its first primitive the engine caps oneDNN's ISA at the S3R_MAX_ISA cap
// (s3r/core/cpu_features.hpp), so that a capped process runs oneDNN as that CPU would.
#include <cstdint>
#include <string>

#include "s3r/gemm/matmul.hpp"

namespace s3r::gemm::onednn {

enum class Type { kF32, kBf16, kS8, kS32 };

struct Call {
  Type a = Type::kF32, b = Type::kF32, c = Type::kF32;
  MatmulShape shape;           // lda, ldb, ldc resolved
  const float* col_scale = nullptr;  // (N): C = col_scale[n] * product, a binary-mul post-op
  bool accumulate = false;     // C += product (sum post-op)
};

// Runs the product through the primitive cache (`cached`) or through a primitive made for this
// call alone (the int8 self-check, which must not show in the cache statistics).
void run(const Call& call, void* C, const void* A, const void* B, bool cached = true);

// An int8 product (A and B s8) as `run`, with M and K not multiples of 32 split into chunks of
// 32 * 2^j and a zero-padded last one (gemm/onednn_buckets.cpp): the same bits, from a bounded
// set of primitives however the counts vary from call to call.
void run_int8_bucketed(const Call& call, void* C, const void* A, const void* B);

// Number of distinct cached primitives.
int64_t primitive_count();

// "major.minor.patch".
std::string version();

}  // namespace s3r::gemm::onednn
