#pragma once
// Run-time kernel tiers: one dispatch point for every vectorized kernel family.
//
// Every kernel exists once per tier (src/kernels/<tier>/, one table each); the active tier picks
// the table. Tiers, from the fallback up:
//   Isa::kReference  scalar loops: the executable spec, and the fallback on any x86-64 CPU
//   Isa::kAvx2       AVX2 + FMA (8 f32 lanes)
//   Isa::kAvx512     AVX-512 F/BW/VL (16 f32 lanes)
// Integer and random-bit results are bit-identical across tiers (tests/ check it per tier).
//
// The active tier is the best the CPU supports (s3r/core/cpu_features.hpp), unless overridden by
// the environment variable S3R_ISA=reference|avx2|avx512 (read at first use) or by set_isa()
// (tests and benchmarks). Asking for a tier the CPU (or the S3R_MAX_ISA cap, or the build)
// lacks is an s3r::Error that names what is missing.
#include <string>
#include <string_view>
#include <vector>

namespace s3r {

enum class Isa { kReference, kAvx2, kAvx512 };

// Every tier this build knows, fallback first.
std::vector<Isa> all_isas();

// "reference" | "avx2" | "avx512".
std::string_view isa_name(Isa isa);
// Parses the names above; throws s3r::Error listing them otherwise.
Isa parse_isa(std::string_view name);

// True when this CPU and this build can run the tier; otherwise *why_not (if given) says what
// is missing, e.g. "this CPU lacks AVX-512 F/BW/VL (it has: avx2 fma)".
bool isa_supported(Isa isa, std::string* why_not = nullptr);

// The best tier this CPU supports.
Isa best_isa();

// The tier that dispatching functions use now.
Isa active_isa();

// Overrides the active tier (process-wide). Throws s3r::Error if the CPU cannot run `isa`.
void set_isa(Isa isa);

// RAII override, for tests and benchmarks: restores the previous tier on scope exit.
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa) : previous_(active_isa()) { set_isa(isa); }
  ~ScopedIsa() { set_isa(previous_); }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  Isa previous_;
};

}  // namespace s3r
