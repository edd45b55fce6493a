#pragma once
// Which code computes each type of matrix product (s3r/gemm/matmul.hpp), chosen once per process
// from the CPU's features (s3r/core/cpu_features.hpp):
//
//   int8 x int8 -> int32 (exact in every backend):
//     amx        s3r's own GEMM with AMX tiles (tdpbssd on int8 panels, 32 x 32 output blocks):
//                the choice on CPUs whose AMX-INT8 state the OS grants (Sapphire Rapids and
//                later), where it is faster than oneDNN 2.6's AMX kernels at s3r's shapes
//     vnni       the same panels and blocks with AVX-512 VNNI's vpdpbusd (B as codes + 128,
//                each row corrected by its code sum: exact for K < 66000, longer K runs avx2):
//                the choice on AVX-512 VNNI CPUs without AMX (Zen 4/5, Cascade/Ice Lake), where
//                the step's GEMMs take 0.70-0.85x the time of oneDNN 2.6's VNNI kernels
//     onednn     oneDNN's kernels: chosen only on CPUs with hardware int8 dot products (AVX-512
//                VNNI, AVX-VNNI or AMX), and only after a self-check at first use (below); the
//                choice on CPUs with AVX-VNNI but no AVX-512 (Alder Lake and later clients)
//     avx2       s3r's own GEMM: packed panels, an AVX2 register-tiled microkernel that widens
//                codes to int16 and multiplies with vpmaddwd (exact for codes in [-127, 127]),
//                OpenMP over output blocks; the choice on every other CPU with AVX2
//     reference  plain loops (the oracle of the tests; the fallback without AVX2)
//   bf16 x bf16 -> f32 accumulation:
//     amx        s3r's own GEMM with AMX-BF16 tiles (tdpbf16ps; dpbf16's panels and blocks, op(A)
//                read as rows): the choice where the OS grants AMX-BF16. Each output is summed by
//                the instruction in its own arithmetic (not dpbf16's chain), 32 k at a time in
//                order: the same bits for any thread count without fixed tiles
//     dpbf16     s3r's own GEMM with AVX-512 BF16's vdpbf16ps (bf16 panels, 32 x 32 output
//                blocks, each output one chain over K: the same bits for any thread count
//                without fixed tiles): the choice on AVX-512 BF16 CPUs without AMX-BF16, where
//                the LM head's three products took 0.88-1.03x the time of oneDNN 2.6's own
//                threading and 0.75-0.86x that of its thread-invariant tiles (AMD Zen 4)
//     onednn     oneDNN's native bf16 products (AVX-512 BF16 or AMX-BF16), in fixed tiles where
//                the bits must not depend on the thread count
//     f32        emulated: operands widened to f32 (exact) and multiplied by the f32 GEMM; the
//                same products, summed in f32 in another order
//   f32: oneDNN on every CPU.
//
// oneDNN 2.6's int8 kernels for CPUs without VNNI add pairs of u8 x s8 products in saturating
// int16 (wrong sums, silently), so before oneDNN computes a single int8 product, a self-check
// runs its int8 path on patterns that saturate such a kernel (+127 x +127, +127 x -127,
// -127 x -127, random codes, odd K; the three layouts; every output type and fused op used in
// production) and compares with exact sums; on any mismatch oneDNN int8 is not used in this
// process and the machine line says why.
//
// Overrides (tests, benchmarks): S3R_GEMM_INT8=auto|amx|vnni|onednn|avx2|reference and
// S3R_GEMM_BF16=auto|amx|dpbf16|onednn|f32, read at first use, or set_int8_backend / set_bf16_backend.
// Asking for a backend this CPU cannot run (or whose self-check failed) is an s3r::Error.
#include <string>
#include <string_view>

namespace s3r::gemm {

enum class Int8Backend { kAmx, kVnni, kOnednn, kAvx2, kReference };
enum class Bf16Backend { kAmx, kDpbf16, kOnednn, kF32 };

std::string_view to_string(Int8Backend b);  // "amx" | "vnni" | "onednn" | "avx2" | "reference"
std::string_view to_string(Bf16Backend b);  // "amx" | "dpbf16" | "onednn" | "f32"

// True when this process can use the backend; otherwise *why_not says why. For Int8Backend::
// kOnednn this runs the self-check (once).
bool int8_backend_available(Int8Backend b, std::string* why_not = nullptr);
bool bf16_backend_available(Bf16Backend b, std::string* why_not = nullptr);

// The backends in use (chosen at first call: the environment, else the best available).
Int8Backend int8_backend();
Bf16Backend bf16_backend();

// s3r's own bf16 GEMMs (dpbf16, amx): each output's sum depends only on its row, column and K,
// so they need no fixed tiles for thread invariance.
inline bool own_bf16(Bf16Backend b) { return b == Bf16Backend::kDpbf16 || b == Bf16Backend::kAmx; }

// Process-wide overrides; throw s3r::Error when the backend is not available.
void set_int8_backend(Int8Backend b);
void set_bf16_backend(Bf16Backend b);

// The outcome of oneDNN's int8 self-check (run at most once per process).
struct Int8SelfCheck {
  bool passed = false;
  std::string detail;  // the first mismatch ("layout dW (X^T G), K = 37, +127 x +127: ..."), or
                       // what was checked when it passed
};
const Int8SelfCheck& onednn_int8_self_check();

// "int8 avx2 (oneDNN int8 not exact here: ...), bf16 f32-emulated, f32 onednn".
std::string backends_line();

class ScopedInt8Backend {
 public:
  explicit ScopedInt8Backend(Int8Backend b) : previous_(int8_backend()) { set_int8_backend(b); }
  ~ScopedInt8Backend() { set_int8_backend(previous_); }
  ScopedInt8Backend(const ScopedInt8Backend&) = delete;
  ScopedInt8Backend& operator=(const ScopedInt8Backend&) = delete;

 private:
  Int8Backend previous_;
};

class ScopedBf16Backend {
 public:
  explicit ScopedBf16Backend(Bf16Backend b) : previous_(bf16_backend()) { set_bf16_backend(b); }
  ~ScopedBf16Backend() { set_bf16_backend(previous_); }
  ScopedBf16Backend(const ScopedBf16Backend&) = delete;
  ScopedBf16Backend& operator=(const ScopedBf16Backend&) = delete;

 private:
  Bf16Backend previous_;
};

}  // namespace s3r::gemm
