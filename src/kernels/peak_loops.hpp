#pragma once
// Register-only loops of the instructions s3r's products run on each tier: the limits of the
// roofline (s3r/gemm/roofline.hpp) and of the GEMM benchmarks (bench/gemm_bench.cpp). Each runs
// `iterations` rounds of 12 independent chains (8 for the sign trick; enough to cover each
// instruction's latency), keeps its operands in registers, and returns the multiply-adds it did
// (bytes for the stream_read loops). The loops are assembly (exactly the instructions named),
// so the compiler can neither hoist nor merge them.
// Single-threaded; the caller runs one per thread. Each exists only in the tier whose flags it
// needs; callers check the CPU first (cpu_features()).
#include <cstdint>

namespace s3r::kernels::peak {

// Baseline x86-64 (SSE2): mulps + addps on xmm, 4 lanes: the reference tier's f32 limit.
uint64_t mul_add_f32_xmm(int64_t iterations);
// Reads n uint32 words (n a multiple of kStreamWords) as four streams, one per quarter, adding
// them up (xmm loads and paddd); returns n * 4 bytes and stores a sum in *sink.
inline constexpr int64_t kStreamWords = 256;
uint64_t stream_read_xmm(const uint32_t* words, int64_t n, uint32_t* sink);

namespace avx2 {
uint64_t fma_f32_ymm(int64_t iterations);     // vfmadd231ps ymm: 8 multiply-adds
// fma_f32_ymm's loop with an integer add after each FMA (returns the same count): the core check
uint64_t fma_f32_busy_ymm(int64_t iterations);
uint64_t madd_s16_ymm(int64_t iterations);    // vpmaddwd + vpaddd ymm: 16 (s3r's AVX2 int8 GEMM)
// vpsignb + vpmaddubsw + vpmaddwd + vpaddd ymm: ggml's sign trick, 32 per vpmaddubsw (8 chains)
uint64_t maddubs_sign_ymm(int64_t iterations);
uint64_t stream_read_ymm(const uint32_t* words, int64_t n, uint32_t* sink);  // as stream_read_xmm
}  // namespace avx2

namespace avx512 {
uint64_t fma_f32_zmm(int64_t iterations);     // vfmadd231ps zmm: 16 multiply-adds
uint64_t dpbusd_zmm(int64_t iterations);      // vpdpbusd zmm (AVX-512 VNNI): 64
uint64_t dpbf16_zmm(int64_t iterations);      // vdpbf16ps zmm (AVX-512 BF16): 32
uint64_t amx_int8(int64_t iterations);        // tdpbssd, 16 x 16 x 64 = 16384 per instruction
uint64_t amx_bf16(int64_t iterations);        // tdpbf16ps, 16 x 16 x 32 = 8192
uint64_t stream_read_zmm(const uint32_t* words, int64_t n, uint32_t* sink);  // as stream_read_xmm
}  // namespace avx512

}  // namespace s3r::kernels::peak
