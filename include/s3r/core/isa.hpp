#pragma once
// Run-time kernel selection: one dispatch point for every vectorized kernel family.
//
// Isa::kReference is the scalar reference twin of every kernel (plain loops: the executable
// spec); it is also the fallback on a CPU without AVX-512. Isa::kAvx512 needs AVX-512 F/BW/VL.
// The active ISA is the best the CPU supports, unless overridden by set_isa() (tests force the
// fallback this way) or by the environment variable S3R_ISA=reference|avx512 read at first use.
#include <string_view>

namespace s3r {

enum class Isa { kReference, kAvx512 };

// True when this CPU (and this build) can run the AVX-512 kernels.
bool cpu_has_avx512();

// The ISA that dispatching functions use now.
Isa active_isa();

// Overrides the active ISA (process-wide). Throws s3r::Error if the CPU cannot run `isa`.
void set_isa(Isa isa);

std::string_view isa_name(Isa isa);

// RAII override, for tests and benchmarks: restores the previous ISA on scope exit.
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
