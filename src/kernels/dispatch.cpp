// The one place that chooses a kernel tier: which tiers this build and CPU can run, the S3R_ISA
// override, and the table of each tier.
#include "kernels/dispatch.hpp"

#include <atomic>
#include <cstdlib>
#include <string>

#include "s3r/core/cpu_features.hpp"
#include "s3r/core/error.hpp"

namespace s3r {

namespace {

Isa initial_isa() {
  const char* env = std::getenv("S3R_ISA");
  if (env == nullptr || *env == '\0') return best_isa();
  const Isa isa = parse_isa(env);
  std::string why;
  if (!isa_supported(isa, &why)) throw Error("S3R_ISA=" + std::string(env) + ": " + why);
  return isa;
}

std::atomic<Isa>& isa_slot() {
  static std::atomic<Isa> slot{initial_isa()};
  return slot;
}

}  // namespace

std::vector<Isa> all_isas() { return {Isa::kReference, Isa::kAvx2, Isa::kAvx512}; }

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kReference: return "reference";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

Isa parse_isa(std::string_view name) {
  for (Isa isa : all_isas()) {
    if (name == isa_name(isa)) return isa;
  }
  throw Error("'" + std::string(name) + "' is not a kernel tier; use reference, avx2 or avx512");
}

bool isa_supported(Isa isa, std::string* why_not) {
  const CpuFeatures& f = cpu_features();
  const char* missing = nullptr;
  bool built = true;
  switch (isa) {
    case Isa::kReference: return true;
    case Isa::kAvx2:
#ifndef S3R_HAVE_AVX2
      built = false;
#endif
      if (!f.has_avx2_tier()) missing = "AVX2 + FMA";
      break;
    case Isa::kAvx512:
#ifndef S3R_HAVE_AVX512
      built = false;
#endif
      if (!f.has_avx512_tier()) missing = "AVX-512 F/BW/VL";
      break;
  }
  if (built && missing == nullptr) return true;
  if (why_not != nullptr) {
    *why_not = !built ? "this build has no " + std::string(isa_name(isa)) +
                            " kernels (configured with -DS3R_" +
                            (isa == Isa::kAvx2 ? "AVX2" : "AVX512") + "=OFF)"
                      : "this CPU lacks " + std::string(missing) + " (it has: " + describe(f) + ")";
  }
  return false;
}

Isa best_isa() {
  if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
  if (isa_supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kReference;
}

Isa active_isa() { return isa_slot().load(std::memory_order_relaxed); }

void set_isa(Isa isa) {
  std::string why;
  if (!isa_supported(isa, &why)) throw Error("kernel tier " + std::string(isa_name(isa)) + ": " + why);
  isa_slot().store(isa, std::memory_order_relaxed);
}

namespace kernels {
const KernelTable& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::kReference: return ref::table();
#ifdef S3R_HAVE_AVX2
    case Isa::kAvx2: return avx2::table();
#endif
#ifdef S3R_HAVE_AVX512
    case Isa::kAvx512: return avx512::table();
#endif
    default: break;
  }
  throw Error("kernels_for: this build has no " + std::string(isa_name(isa)) + " kernels");
}
}  // namespace kernels

}  // namespace s3r
