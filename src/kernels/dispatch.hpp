#pragma once
// The one dispatch point: the kernel table of a tier (s3r/core/isa.hpp).
#include "kernels/kernels.hpp"
#include "s3r/core/isa.hpp"

namespace s3r::kernels {

// The table of `isa`; throws s3r::Error if this build has no such tier.
const KernelTable& kernels_for(Isa isa);
inline const KernelTable& active_kernels() { return kernels_for(active_isa()); }

}  // namespace s3r::kernels
