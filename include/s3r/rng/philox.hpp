#pragma once
// Philox-4x32-10 (Salmon et al., Random123; the generator of cuRAND and PyTorch), offered beside
// Threefry so that the cost of the generator itself can be compared (SPEC section 3).
#include <array>
#include <cstdint>
#include <span>

namespace s3r {

struct PhiloxKey {
  uint32_t k0, k1;
};

namespace philox_detail {
inline constexpr uint32_t kMul0 = 0xD2511F53u;
inline constexpr uint32_t kMul1 = 0xCD9E8D57u;
inline constexpr uint32_t kWeyl0 = 0x9E3779B9u;
inline constexpr uint32_t kWeyl1 = 0xBB67AE85u;
}  // namespace philox_detail

// Philox-4x32 with `rounds` rounds (10 is the standard; 7 only for Random123's known answers).
constexpr std::array<uint32_t, 4> philox4x32_rounds(PhiloxKey key, std::array<uint32_t, 4> ctr,
                                                    int rounds) {
  using namespace philox_detail;
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int r = 0; r < rounds; ++r) {
    if (r > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    const uint64_t p0 = uint64_t{kMul0} * ctr[0];
    const uint64_t p1 = uint64_t{kMul1} * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ k0, static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ k1, static_cast<uint32_t>(p0)};
  }
  return ctr;
}

constexpr std::array<uint32_t, 4> philox4x32(PhiloxKey key, std::array<uint32_t, 4> ctr) {
  return philox4x32_rounds(key, ctr, 10);
}

// Word i of the Philox stream: output word (i % 4) of philox4x32(key, (lo32(i/4), hi32(i/4), 0, 0)).
constexpr uint32_t philox_bits32(PhiloxKey key, uint64_t flat_index) {
  const uint64_t block = flat_index >> 2;
  const auto y = philox4x32(
      key, {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u});
  return y[flat_index & 3];
}

// out[j] = philox_bits32(key, first_index + j); vectorized and OpenMP-threaded.
void philox_bits32(PhiloxKey key, uint64_t first_index, std::span<uint32_t> out);

}  // namespace s3r
