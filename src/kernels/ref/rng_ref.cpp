// Scalar reference: random words straight from the constexpr definitions.
#include "kernels/kernels.hpp"

namespace s3r::kernels::ref {

void threefry_bits(Key key, uint64_t first, uint32_t* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = random_bits32(key, first + static_cast<uint64_t>(j));
}

void philox_bits(PhiloxKey key, uint64_t first, uint32_t* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = philox_bits32(key, first + static_cast<uint64_t>(j));
}

}  // namespace s3r::kernels::ref
