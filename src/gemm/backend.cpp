// Choice of the GEMM backends and oneDNN's int8 self-check (s3r/gemm/backend.hpp).
#include "s3r/gemm/backend.hpp"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <random>
#include <sstream>
#include <vector>

#include "gemm/onednn_matmul.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/cpu_features.hpp"
#include "s3r/core/error.hpp"

namespace s3r::gemm {

namespace {

// ---- oneDNN's int8 self-check ----------------------------------------------------------------

struct Layout {
  const char* name;
  bool ta, tb;
};
constexpr Layout kLayouts[] = {{"Y = X W", false, false},
                               {"dX = G W^T", false, true},
                               {"dW = X^T G", true, false}};

struct Pattern {
  const char* name;
  int a, b;  // constant codes, or 0 for random codes
};
constexpr Pattern kPatterns[] = {{"+127 x +127", 127, 127},
                                 {"+127 x -127", 127, -127},
                                 {"-127 x -127", -127, -127},
                                 {"random codes", 0, 0}};

// The outputs and fused operations production uses: int32 (dX), f32 with the column scale
// (forward, dW), and the accumulating variants the API offers.
struct OutputKind {
  const char* name;
  bool s32, col_scale, accumulate;
};
constexpr OutputKind kOutputs[] = {{"s32", true, false, false},
                                   {"f32", false, false, false},
                                   {"f32 * column scale", false, true, false},
                                   {"f32 += product", false, false, true},
                                   {"f32 += column scale * product", false, true, true}};

std::vector<int8_t> codes(size_t n, int value, uint32_t seed) {
  std::vector<int8_t> v(n, static_cast<int8_t>(value));
  if (value == 0) {
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int> d(-127, 127);
    for (auto& x : v) x = static_cast<int8_t>(d(gen));
  }
  return v;
}

// Runs every case; the first mismatch (or oneDNN error) becomes the detail of a failed check.
Int8SelfCheck run_self_check() {
  constexpr int64_t M = 7, N = 19;
  int cases = 0;
  for (const Layout& layout : kLayouts) {
    for (int64_t K : {int64_t{37}, int64_t{259}}) {
      MatmulShape s{M, N, K, layout.ta, layout.tb};
      s.lda = layout.ta ? M : K;
      s.ldb = layout.tb ? K : N;
      s.ldc = N;
      AlignedVector<float> col(N);
      for (int64_t n = 0; n < N; ++n) col[n] = 0.25f * static_cast<float>(n % 5 + 1);
      for (const Pattern& pat : kPatterns) {
        const auto a = codes(static_cast<size_t>(M * K), pat.a, 11);
        const auto b = codes(static_cast<size_t>(K * N), pat.b, 12);
        std::vector<int64_t> exact(static_cast<size_t>(M * N), 0);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < N; ++n) {
            for (int64_t k = 0; k < K; ++k) {
              exact[m * N + n] += int64_t{a[layout.ta ? k * M + m : m * K + k]} *
                                  b[layout.tb ? n * K + k : k * N + n];
            }
          }
        }
        for (const OutputKind& o : kOutputs) {
          ++cases;
          onednn::Call call{onednn::Type::kS8, onednn::Type::kS8,
                            o.s32 ? onednn::Type::kS32 : onednn::Type::kF32, s,
                            o.col_scale ? col.data() : nullptr, o.accumulate};
          std::vector<int32_t> c32(static_cast<size_t>(M * N), 0);
          AlignedVector<float> cf(static_cast<size_t>(M * N), 1.0f);
          std::ostringstream where;
          where << "layout " << layout.name << ", M x N x K = " << M << " x " << N << " x " << K
                << ", " << pat.name << ", output " << o.name;
          try {
            onednn::run(call, o.s32 ? static_cast<void*>(c32.data()) : cf.data(), a.data(), b.data());
          } catch (const std::exception& e) {
            return {false, where.str() + ": " + e.what()};
          }
          for (int64_t i = 0; i < M * N; ++i) {
            const double want = static_cast<double>(exact[i]) * (o.col_scale ? col[i % N] : 1.0) +
                                (o.accumulate ? 1.0 : 0.0);
            const double got = o.s32 ? c32[i] : cf[i];
            // f32 outputs: one rounding of the sum and one of each scaling and addition.
            const double tol = o.s32 ? 0.0 : 4.0 * 0x1p-24 * (std::fabs(want) + 1.0);
            if (!(std::fabs(got - want) <= tol)) {
              std::ostringstream msg;
              msg << where.str() << ": C[" << i / N << ", " << i % N << "] = " << got
                  << ", exact " << want;
              return {false, msg.str()};
            }
          }
        }
      }
    }
  }
  std::ostringstream ok;
  ok << cases << " cases exact (3 layouts, K = 37 and 259, saturating and random codes, "
     << "s32 and f32 outputs with the fused column scale and accumulation)";
  return {true, ok.str()};
}

// ---- availability and choice -----------------------------------------------------------------

bool int8_available(Int8Backend b, std::string* why) {
  const CpuFeatures& f = cpu_features();
  switch (b) {
    case Int8Backend::kReference: return true;
    case Int8Backend::kAvx2:
#ifndef S3R_HAVE_AVX2
      if (why) *why = "this build has no AVX2 kernels (configured with -DS3R_AVX2=OFF)";
      return false;
#endif
      if (f.has_avx2_tier()) return true;
      if (why) *why = "this CPU lacks AVX2 + FMA (it has: " + describe(f) + ")";
      return false;
    case Int8Backend::kAmx:
#ifndef S3R_HAVE_AVX512
      if (why) *why = "this build has no AVX-512 kernels (configured with -DS3R_AVX512=OFF)";
      return false;
#endif
      if (f.amx_int8) return true;
      if (why) *why = "this CPU (or the OS, or S3R_MAX_ISA) gives no AMX-INT8 (it has: " + describe(f) + ")";
      return false;
    case Int8Backend::kVnni:
#ifndef S3R_HAVE_AVX512
      if (why) *why = "this build has no AVX-512 kernels (configured with -DS3R_AVX512=OFF)";
      return false;
#endif
      if (f.has_avx512_tier() && f.avx512_vnni) return true;
      if (why) *why = "this CPU (or S3R_MAX_ISA) gives no AVX-512 VNNI (it has: " + describe(f) + ")";
      return false;
    case Int8Backend::kOnednn: {
      const Int8SelfCheck& check = onednn_int8_self_check();
      if (check.passed) return true;
      if (why) *why = "oneDNN's int8 matmul is not exact on this CPU: " + check.detail;
      return false;
    }
  }
  return false;
}

bool bf16_available(Bf16Backend b, std::string* why) {
  const CpuFeatures& f = cpu_features();
  if (b == Bf16Backend::kF32) return true;
  if (own_bf16(b)) {  // in the AVX-512 tier
#ifndef S3R_HAVE_AVX512
    if (why) *why = "this build has no AVX-512 kernels (configured with -DS3R_AVX512=OFF)";
    return false;
#endif
    const bool amx = b == Bf16Backend::kAmx;
    if (f.has_avx512_tier() && (amx ? f.amx_bf16 : f.avx512_bf16)) return true;
    if (why) {
      *why = std::string(amx ? "this CPU (or the OS, or S3R_MAX_ISA) gives no AMX-BF16"
                             : "this CPU (or S3R_MAX_ISA) gives no AVX-512 BF16") +
             " (it has: " + describe(f) + ")";
    }
    return false;
  }
  // oneDNN 2.6 runs bf16 matmuls on avx512_core and above (emulated there without BF16).
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) return true;
  if (why) *why = "oneDNN 2.6 has bf16 matmuls only on AVX-512 CPUs (this one has: " + describe(f) + ")";
  return false;
}

template <typename B>
B parse_backend(const char* env_name, std::string_view value, std::initializer_list<B> all) {
  for (B b : all) {
    if (value == to_string(b)) return b;
  }
  std::string names = "auto";
  for (B b : all) names += ", " + std::string(to_string(b));
  throw Error(std::string(env_name) + "='" + std::string(value) + "' is not a backend; use " + names);
}

// The backend chosen at first use and why (for the machine line).
struct Int8Choice {
  Int8Backend backend;
  std::string note;
};

Int8Choice choose_int8() {
  const char* env = std::getenv("S3R_GEMM_INT8");
  if (env != nullptr && *env != '\0' && std::string_view(env) != "auto") {
    const Int8Backend b = parse_backend("S3R_GEMM_INT8", env,
                                        {Int8Backend::kAmx, Int8Backend::kVnni, Int8Backend::kOnednn,
                                         Int8Backend::kAvx2, Int8Backend::kReference});
    std::string why;
    if (!int8_available(b, &why)) throw Error("S3R_GEMM_INT8=" + std::string(env) + ": " + why);
    return {b, "set by S3R_GEMM_INT8"};
  }
  const CpuFeatures& f = cpu_features();
  if (int8_available(Int8Backend::kAmx, nullptr)) return {Int8Backend::kAmx, "AMX-INT8 tiles"};
  // s3r's own panels with the vpdpbusd block, ahead of oneDNN's VNNI kernels: under
  // S3R_MAX_ISA=avx512_bf16 the step's GEMMs took 0.70x (`small`) and 0.85x (`wide`) their time
  // (docs/BENCHMARKS.md); the dX epilogue is fused and the panels are 64-byte aligned.
  if (int8_available(Int8Backend::kVnni, nullptr)) return {Int8Backend::kVnni, "AVX-512 VNNI panels"};
  std::string note;
  if (f.has_int8_dot()) {  // AVX-VNNI without AVX-512 (or an AVX-512-less build)
    const Int8SelfCheck& check = onednn_int8_self_check();
    if (check.passed) return {Int8Backend::kOnednn, "VNNI, self-check passed"};
    note = "oneDNN int8 failed its self-check: " + check.detail;
  } else {
    note = "no VNNI/AMX: oneDNN's int8 would saturate int16 sums";
  }
  return {int8_available(Int8Backend::kAvx2, nullptr) ? Int8Backend::kAvx2 : Int8Backend::kReference,
          note};
}

const Int8Choice& initial_int8() {
  static const Int8Choice choice = choose_int8();
  return choice;
}

Bf16Backend initial_bf16() {
  const char* env = std::getenv("S3R_GEMM_BF16");
  if (env != nullptr && *env != '\0' && std::string_view(env) != "auto") {
    const Bf16Backend b =
        parse_backend("S3R_GEMM_BF16", env,
                      {Bf16Backend::kAmx, Bf16Backend::kDpbf16, Bf16Backend::kOnednn, Bf16Backend::kF32});
    std::string why;
    if (!bf16_available(b, &why)) throw Error("S3R_GEMM_BF16=" + std::string(env) + ": " + why);
    return b;
  }
  // s3r's own AMX-BF16 GEMM where the OS grants AMX; without it, s3r's own vdpbf16ps GEMM.
  const CpuFeatures& f = cpu_features();
  if (bf16_available(Bf16Backend::kAmx, nullptr)) return Bf16Backend::kAmx;
  if (bf16_available(Bf16Backend::kDpbf16, nullptr)) return Bf16Backend::kDpbf16;
  return f.has_native_bf16() ? Bf16Backend::kOnednn : Bf16Backend::kF32;
}

std::atomic<Int8Backend>& int8_slot() {
  static std::atomic<Int8Backend> slot{initial_int8().backend};
  return slot;
}
std::atomic<Bf16Backend>& bf16_slot() {
  static std::atomic<Bf16Backend> slot{initial_bf16()};
  return slot;
}

}  // namespace

std::string_view to_string(Int8Backend b) {
  switch (b) {
    case Int8Backend::kAmx: return "amx";
    case Int8Backend::kVnni: return "vnni";
    case Int8Backend::kOnednn: return "onednn";
    case Int8Backend::kAvx2: return "avx2";
    case Int8Backend::kReference: return "reference";
  }
  return "?";
}

std::string_view to_string(Bf16Backend b) {
  switch (b) {
    case Bf16Backend::kAmx: return "amx";
    case Bf16Backend::kDpbf16: return "dpbf16";
    case Bf16Backend::kOnednn: return "onednn";
    case Bf16Backend::kF32: return "f32";
  }
  return "?";
}

bool int8_backend_available(Int8Backend b, std::string* why_not) { return int8_available(b, why_not); }
bool bf16_backend_available(Bf16Backend b, std::string* why_not) { return bf16_available(b, why_not); }

const Int8SelfCheck& onednn_int8_self_check() {
  static const Int8SelfCheck check = run_self_check();
  return check;
}

Int8Backend int8_backend() { return int8_slot().load(std::memory_order_relaxed); }
Bf16Backend bf16_backend() { return bf16_slot().load(std::memory_order_relaxed); }

void set_int8_backend(Int8Backend b) {
  std::string why;
  if (!int8_available(b, &why)) throw Error("int8 GEMM backend " + std::string(to_string(b)) + ": " + why);
  int8_slot().store(b, std::memory_order_relaxed);
}

void set_bf16_backend(Bf16Backend b) {
  std::string why;
  if (!bf16_available(b, &why)) throw Error("bf16 GEMM backend " + std::string(to_string(b)) + ": " + why);
  bf16_slot().store(b, std::memory_order_relaxed);
}

std::string backends_line() {
  const Int8Backend i8 = int8_backend();
  const Bf16Backend b16 = bf16_backend();
  std::ostringstream s;
  s << "GEMM int8 " << to_string(i8) << " ("
    << (i8 == initial_int8().backend ? initial_int8().note : "overridden in this process") << "), bf16 ";
  if (b16 == Bf16Backend::kF32) {
    s << "f32-emulated";
  } else if (b16 == Bf16Backend::kDpbf16) {
    s << "dpbf16 (s3r's vdpbf16ps panels)";
  } else if (b16 == Bf16Backend::kAmx) {
    s << "amx (s3r's AMX-BF16 tiles)";
  } else {
    s << "onednn (" << (cpu_features().has_native_bf16() ? "native" : "emulated by oneDNN") << ")";
  }
  s << ", f32 onednn";
  return s.str();
}

}  // namespace s3r::gemm
