#include "kernels/dispatch.hpp"

#include <atomic>
#include <cstdlib>
#include <string>

#include "s3r/core/error.hpp"

namespace s3r {

namespace {

constexpr kernels::KernelTable kRefTable = {
    kernels::ref::threefry_bits,      kernels::ref::philox_bits, kernels::ref::quantize_rows_rtne,
    kernels::ref::absmax_cols,        kernels::ref::quantize_cols_rtne,
    kernels::ref::grad_absmax,        kernels::ref::grad_quantize,
    kernels::ref::gemv_s8_f32,        kernels::ref::dx_epilogue,
    kernels::ref::swiglu_forward_ew,  kernels::ref::swiglu_backward_ew,
};

#ifdef S3R_HAVE_AVX512
constexpr kernels::KernelTable kAvx512Table = {
    kernels::avx512::threefry_bits,   kernels::avx512::philox_bits,
    kernels::avx512::quantize_rows_rtne, kernels::avx512::absmax_cols,
    kernels::avx512::quantize_cols_rtne, kernels::avx512::grad_absmax,
    kernels::avx512::grad_quantize,      kernels::avx512::gemv_s8_f32,
    kernels::avx512::dx_epilogue,        kernels::avx512::swiglu_forward_ew,
    kernels::avx512::swiglu_backward_ew,
};
#endif

Isa initial_isa() {
  const char* env = std::getenv("S3R_ISA");
  if (env != nullptr && *env != '\0') {
    const std::string name(env);
    if (name == "reference") return Isa::kReference;
    if (name == "avx512") {
      if (!cpu_has_avx512()) {
        throw Error("S3R_ISA=avx512, but this CPU (or build) has no AVX-512 F/BW/VL support");
      }
      return Isa::kAvx512;
    }
    throw Error("S3R_ISA='" + name + "' is not an ISA; use 'reference' or 'avx512'");
  }
  return cpu_has_avx512() ? Isa::kAvx512 : Isa::kReference;
}

std::atomic<Isa>& isa_slot() {
  static std::atomic<Isa> slot{initial_isa()};
  return slot;
}

}  // namespace

bool cpu_has_avx512() {
#ifdef S3R_HAVE_AVX512
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
#else
  return false;
#endif
}

Isa active_isa() { return isa_slot().load(std::memory_order_relaxed); }

void set_isa(Isa isa) {
  if (isa == Isa::kAvx512 && !cpu_has_avx512()) {
    throw Error("set_isa(avx512): this CPU (or build) has no AVX-512 F/BW/VL support");
  }
  isa_slot().store(isa, std::memory_order_relaxed);
}

std::string_view isa_name(Isa isa) { return isa == Isa::kAvx512 ? "avx512" : "reference"; }

namespace kernels {
const KernelTable& kernels_for(Isa isa) {
#ifdef S3R_HAVE_AVX512
  if (isa == Isa::kAvx512) return kAvx512Table;
#endif
  (void)isa;
  return kRefTable;
}
}  // namespace kernels

}  // namespace s3r
