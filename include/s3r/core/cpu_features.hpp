#pragma once
// What this CPU (and its operating system) can run, detected once per process with CPUID and
// XGETBV. Every choice of kernels and GEMM backends starts here (s3r/core/isa.hpp,
// s3r/gemm/backend.hpp).
//
// A feature counts only when the OS saves its register state: AVX2/FMA need the YMM state
// (XCR0 bits 1-2), AVX-512 the opmask and ZMM state (bits 5-7), AMX the tile state (bits 17-18)
// and, on Linux, the per-process permission (arch_prctl ARCH_REQ_XCOMP_PERM), which is
// requested here as oneDNN would.
//
// S3R_MAX_ISA=reference|avx2|avx512|avx512_bf16 caps what the process believes the CPU has, so
// that an AVX-512 machine can behave as a lesser one (tests and benchmarks of the other tiers):
//   reference  no AVX at all: scalar kernels, the scalar int8 GEMM, f32-emulated bf16
//   avx2       AVX2 + FMA (+ F16C), no VNNI of any kind: like AMD Zen 2/3 or an Intel client CPU
//   avx512     AVX-512 F/BW/VL/DQ without VNNI, BF16 or AMX: like Intel Skylake-SP
//   avx512_bf16  avx512 + AVX-512 VNNI and BF16, no AMX: like AMD Zen 4/5 or Intel Cooper Lake
// The cap also limits oneDNN (s3r/gemm sets its max ISA to match before its first primitive).
// An unknown value is an s3r::Error at first use.
#include <string>

namespace s3r {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false;  // vpdpbusd/vpdpwssd on zmm: exact int8 products in oneDNN
  bool avx512_bf16 = false;  // vdpbf16ps: native bf16 products
  bool avx_vnni = false;     // the VEX (ymm) form of VNNI (Alder Lake, Zen 5 ...)
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;  // reported and granted by the OS
  std::string cap;           // the S3R_MAX_ISA value applied ("" when none)

  bool has_avx2_tier() const { return avx2 && fma; }
  bool has_avx512_tier() const { return has_avx2_tier() && avx512f && avx512bw && avx512vl; }
  // Hardware int8 dot products that accumulate in int32 without saturation (VNNI or AMX).
  bool has_int8_dot() const { return avx512_vnni || avx_vnni || amx_int8; }
  // Hardware bf16 products (AVX-512 BF16 or AMX-BF16).
  bool has_native_bf16() const { return avx512_bf16 || amx_bf16; }
};

// The features of this process, detected once (thread-safe); the S3R_MAX_ISA cap applied.
const CpuFeatures& cpu_features();

// "avx2 fma avx512(f bw vl dq) avx512_vnni avx512_bf16 avx_vnni amx(int8 bf16)", the features
// present, followed by "[capped at X by S3R_MAX_ISA]" when a cap applies; "no AVX2" when none.
std::string describe(const CpuFeatures& f);

}  // namespace s3r
