// The int8 transpose kernel (kernels/kernels.hpp transpose_s8) of every tier: each byte of the
// result checked against its source byte by index, over shapes that cross every tile edge
// (16 x 16, 16 x 32, 16 x 64) by one, with padded strides whose padding must stay untouched.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/dispatch.hpp"
#include "s3r/core/isa.hpp"
#include "test_util.hpp"

namespace s3r::kernels {
namespace {

constexpr int8_t kGuard = -128;  // never a code of the source (codes are drawn in [-127, 127])

// Transposes rows [r0, r1) of a random (rows, cols) source with `isa`'s kernel into a guarded
// (cols, rows + 5) destination and checks every byte of it.
void check_transpose(Isa isa, int64_t rows, int64_t cols, int64_t r0, int64_t r1, uint32_t seed) {
  const int64_t lds = cols + 3, ldd = rows + 5;
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> code(-127, 127);
  std::vector<int8_t> src(static_cast<size_t>(rows * lds));
  for (auto& v : src) v = static_cast<int8_t>(code(gen));
  std::vector<int8_t> dst(static_cast<size_t>(cols * ldd), kGuard);
  kernels_for(isa).transpose_s8(dst.data(), ldd, src.data(), lds, r0, r1, cols);
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < ldd; ++r) {
      const bool in_band = r >= r0 && r < r1;
      ASSERT_EQ(dst[c * ldd + r], in_band ? src[r * lds + c] : kGuard)
          << isa_name(isa) << ": rows " << rows << " cols " << cols << " band [" << r0 << ", "
          << r1 << "), dst[" << c << ", " << r << "]" << (in_band ? "" : " (not in the band)");
    }
  }
}

TEST(TransposeKernels, EveryTierMovesEveryByteOfItsBand) {
  const std::vector<Isa> tiers = testing::runnable_isas();  // the reference included
  uint32_t seed = 1;
  for (Isa isa : tiers) {
    for (int64_t rows : {1, 15, 16, 17, 33, 64, 70}) {
      for (int64_t cols : {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 130}) {
        check_transpose(isa, rows, cols, 0, rows, seed++);
        if (rows > 17) check_transpose(isa, rows, cols, 3, rows - 2, seed++);  // an inner band
      }
    }
  }
}

// The vector tiers on a shape like the dW products' (T = 2048 stored rows of C = 1024 codes),
// in the bands the GEMM driver uses, against the reference byte for byte.
TEST(TransposeKernels, VectorTiersMatchTheReferenceOnALargeShape) {
  const auto tiers = testing::vector_isas();
  S3R_SKIP_WITHOUT_VECTOR_TIERS(tiers);
  const int64_t rows = 2048, cols = 1024 + 16 + 5;
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> code(-127, 127);
  std::vector<int8_t> src(static_cast<size_t>(rows * cols));
  for (auto& v : src) v = static_cast<int8_t>(code(gen));
  std::vector<int8_t> want(src.size());
  ref::transpose_s8(want.data(), rows, src.data(), cols, 0, rows, cols);
  for (Isa isa : tiers) {
    std::vector<int8_t> got(src.size(), kGuard);
    for (int64_t r0 = 0; r0 < rows; r0 += 64) {
      kernels_for(isa).transpose_s8(got.data(), rows, src.data(), cols, r0, r0 + 64, cols);
    }
    ASSERT_EQ(got, want) << isa_name(isa);
  }
}

}  // namespace
}  // namespace s3r::kernels
