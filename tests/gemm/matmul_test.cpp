// int8 matrix products of every backend against exact sums computed here, for the three layouts
// of a linear layer, around the tiles of s3r's own int8 GEMM; the backends' choice and refusals.
// f32 and bf16 products: matmul_float_test.cpp.
#include "s3r/gemm/matmul.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gemm/backends.hpp"
#include "gemm/onednn_matmul.hpp"
#include "gemm/product_cases.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/gemm/backend.hpp"
#include "test_util.hpp"

namespace s3r::gemm {
namespace {

using namespace product_cases;  // Case, cases(), describe, at_a, at_b, shape_of
using testing::bf16_backends;
using testing::int8_backends;
using testing::random_s8;

// Shapes around s3r's own GEMMs' tiles and blocks (AVX2: 6 x 16 micro-tiles, blocks of up to 144 x 256, K
// slices of 512; AMX: 32 x 32 blocks, k in steps of 64, A read in place when its rows are
// contiguous and K is a multiple of 64, but for a last partial block: M = 64 and 77 at K = 192):
// crossing each edge by one, with odd K. N = 515: on a CPU with AMX int8, oneDNN's
// products with a transposed A and N >= 512 run on a row-major copy of A (gemm/onednn_matmul.cpp).
// Outputs of 300 x 1001 and 300 x 1040: over 1 MB, stored past the caches by the VNNI and AMX
// GEMMs.
std::vector<Case> blocked_cases() {
  std::vector<Case> c;
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{6, 16, 2}, {7, 17, 3}, {5, 15, 511},
                         {97, 257, 513}, {145, 40, 513}, {7, 17, 1031}, {12, 32, 1024}, {33, 515, 70},
                         {64, 33, 192}, {77, 31, 192},
                         // several chunks of B panels of the VNNI blocks (512 KB each: 7 and 4
                         // blocks of 32 columns at these K), with edges in every dimension; AMX:
                         // by K slices of 512 (K >= 2048, outputs within the threads' L2), the
                         // last one partial, the blocks split by columns (and below by rows)
                         {40, 300, 2100}, {40, 200, 4096},
                         // AVX2: packed by K slice (M <= 768, K >= 2048), odd K, blocks split over
                         // the threads
                         {101, 40, 2049},
                         // VNNI: outputs over the threads' L2 share (512 KB each) go by
                         // non-temporal stores where a row's 16 floats fill a 64-byte line:
                         // aligned rows (N = 1040, a last half block), and rows mostly off lines
                         {300, 1040, 70}, {300, 1001, 70}}) {
    for (auto [ta, tb] : {std::pair{false, false}, std::pair{false, true}, std::pair{true, false},
                          std::pair{true, true}}) {
      c.push_back({M, N, K, ta, tb});
    }
  }
  return c;
}

int64_t exact_sum(const std::vector<int8_t>& a, const std::vector<int8_t>& b, const Case& c,
                  int64_t m, int64_t n) {
  int64_t sum = 0;
  for (int64_t k = 0; k < c.K; ++k) sum += int64_t{at_a(a, c, m, k)} * at_b(b, c, k, n);
  return sum;
}

// Codes that break a kernel which sums pairs of products in saturating int16 (oneDNN 2.6 without
// VNNI): +127 x +127 and +127 x -127 everywhere, and -127 x -127 (the worst case of int32 too).
struct Fill {
  const char* name;
  int a, b;  // constants, or 0: random codes
};
constexpr Fill kFills[] = {{"random", 0, 0}, {"+127 x +127", 127, 127}, {"+127 x -127", 127, -127},
                           {"-127 x -127", -127, -127}};

std::vector<int8_t> filled(size_t n, int value, uint32_t seed) {
  return value == 0 ? random_s8(n, seed) : std::vector<int8_t>(n, static_cast<int8_t>(value));
}

// The exact sums of a case, computed once for every backend and thread count.
std::vector<int64_t> exact_sums(const std::vector<int8_t>& a, const std::vector<int8_t>& b,
                                const Case& c) {
  std::vector<int64_t> sums(c.M * c.N);
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t n = 0; n < c.N; ++n) sums[m * c.N + n] = exact_sum(a, b, c, m, n);
  }
  return sums;
}

TEST(Matmul, Int8ToInt32IsExactInEveryBackend) {
  std::vector<Case> all = cases();
  for (const Case& c : blocked_cases()) all.push_back(c);
  const auto backends = int8_backends();
  for (const Case& c : all) {
    for (const Fill& fill : kFills) {
      const auto a = filled(c.M * c.K, fill.a, 1), b = filled(c.K * c.N, fill.b, 2);
      const auto want = exact_sums(a, b, c);
      for (Int8Backend backend : backends) {
        ScopedInt8Backend scoped(backend);
        for (int threads : {1, 2}) {
          testing::ScopedThreads st(threads);
          std::vector<int32_t> out(c.M * c.N, -1);
          matmul_s8(out.data(), a.data(), b.data(), shape_of(c));
          for (int64_t i = 0; i < c.M * c.N; ++i) {
            ASSERT_EQ(out[i], want[i]) << to_string(backend) << " " << describe(c) << " "
                                       << fill.name << " threads " << threads << " at ["
                                       << i / c.N << ", " << i % c.N << "]";
          }
        }
      }
    }
  }
}

// A row-major A whose K is a multiple of 64 is read in place by the AMX blocks when it starts on
// a 64-byte boundary, and packed otherwise: both give the exact sums (A at offsets 0 and 16 of
// a 64-byte aligned buffer; M = 70 leaves a last, partial block of rows, packed either way).
TEST(Matmul, Int8ExactForAlignedAndUnalignedA) {
  const Case c{70, 40, 128, false, false};
  const auto a = random_s8(c.M * c.K, 3), b = random_s8(c.K * c.N, 4);
  const auto want = exact_sums(a, b, c);
  std::vector<int8_t> buffer(a.size() + 128);
  int8_t* base = buffer.data() + (64 - reinterpret_cast<uintptr_t>(buffer.data()) % 64) % 64;
  for (Int8Backend backend : int8_backends()) {
    ScopedInt8Backend scoped(backend);
    for (int64_t offset : {0, 16}) {
      std::copy(a.begin(), a.end(), base + offset);
      std::vector<int32_t> out(c.M * c.N, -1);
      matmul_s8(out.data(), base + offset, b.data(), shape_of(c));
      for (int64_t i = 0; i < c.M * c.N; ++i) {
        ASSERT_EQ(out[i], want[i]) << to_string(backend) << " A at offset " << offset << " at [" << i / c.N << ", "
                                   << i % c.N << "]";
      }
    }
  }
}

TEST(Matmul, Int8WorstCaseSumsAreExact) {
  const Case c{4, 3, 4096, false, true};
  std::vector<int8_t> a(c.M * c.K, -127), b(c.K * c.N, -127);
  for (Int8Backend backend : int8_backends()) {
    ScopedInt8Backend scoped(backend);
    std::vector<int32_t> out(c.M * c.N);
    matmul_s8(out.data(), a.data(), b.data(), shape_of(c));
    for (int32_t v : out) EXPECT_EQ(v, 4096 * 127 * 127) << to_string(backend);
  }
}

// Scaled int8: the exact int32 sum, then (float(sum) * col) * row (+ C) in f32. The expected value
// is computed here in exactly that order from the exact sum, so every backend must match it bit
// for bit, for any thread count.
TEST(Matmul, Int8ScaledFusesRowAndColumnScales) {
  std::vector<Case> all = cases();
  const size_t small_cases = all.size();
  for (const Case& c : blocked_cases()) all.push_back(c);
  const auto backends = int8_backends();
  for (size_t ci = 0; ci < all.size(); ++ci) {
    const Case& c = all[ci];
    const auto a = random_s8(c.M * c.K, 3), b = random_s8(c.K * c.N, 4);
    const auto sums = exact_sums(a, b, c);
    AlignedVector<float> rs(c.M), cs(c.N);
    for (int64_t m = 0; m < c.M; ++m) rs[m] = 0.01f * static_cast<float>(m + 1);
    for (int64_t n = 0; n < c.N; ++n) cs[n] = 0.003f * static_cast<float>(n % 7 + 1);
    // Every scale variant on the small shapes; no scales and both scales on the blocked ones.
    for (int variant = 0; variant < 4; ++variant) {
      if (ci >= small_cases && (variant == 1 || variant == 2)) continue;
      const float* row = variant & 1 ? rs.data() : nullptr;
      const float* col = variant & 2 ? cs.data() : nullptr;
      for (bool accumulate : {false, true}) {
        AlignedVector<float> want(c.M * c.N);
        for (int64_t i = 0; i < c.M * c.N; ++i) {
          float v = static_cast<float>(sums[i]);
          if (col) v = v * col[i % c.N];
          if (row) v = v * row[i / c.N];
          want[i] = accumulate ? 0.5f + v : v;
        }
        for (Int8Backend backend : backends) {
          ScopedInt8Backend scoped(backend);
          for (int threads : {1, 2}) {
            testing::ScopedThreads st(threads);
            AlignedVector<float> out(c.M * c.N, 0.5f);
            matmul_s8_scaled(out.data(), a.data(), b.data(), shape_of(c), row, col, accumulate);
            for (int64_t i = 0; i < c.M * c.N; ++i) {
              ASSERT_EQ(out[i], want[i]) << to_string(backend) << " " << describe(c) << " variant "
                                         << variant << " acc " << accumulate << " threads "
                                         << threads << " at [" << i / c.N << ", " << i % c.N << "]";
            }
          }
        }
      }
    }
  }
}

// Leading dimensions of int8 operands and outputs (column slices), every layout and backend;
// N = 515 also through the row-major copy of a transposed A (AMX int8 CPUs).
TEST(Matmul, Int8LeadingDimensions) {
  const int64_t M = 13, K = 37, pad = 5;
  for (const int64_t N : {int64_t{21}, int64_t{515}}) {
    for (Int8Backend backend : int8_backends()) {
      ScopedInt8Backend scoped(backend);
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
          const auto a = random_s8((ta ? K : M) * lda, 5), b = random_s8((tb ? N : K) * ldb, 6);
          std::vector<int32_t> out(M * ldc, -7);
          matmul_s8(out.data(), a.data(), b.data(), {M, N, K, ta, tb, lda, ldb, ldc});
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < ldc; ++n) {
              if (n >= N) {
                ASSERT_EQ(out[m * ldc + n], -7)
                    << to_string(backend) << " N " << N << ": wrote into the padding";
                continue;
              }
              int64_t sum = 0;
              for (int64_t k = 0; k < K; ++k) {
                sum += int64_t{a[ta ? k * lda + m : m * lda + k]} *
                       b[tb ? n * ldb + k : k * ldb + n];
              }
              ASSERT_EQ(out[m * ldc + n], sum) << to_string(backend) << " N " << N << " ta " << ta << " tb "
                                               << tb << " at [" << m << ", " << n << "]";
            }
          }
        }
      }
    }
  }
}

// oneDNN's int8 self-check must catch a oneDNN that sums in saturating int16. The raw oneDNN
// product (no backend choice in between) on a saturating pattern tells whether this process's
// oneDNN is such a one (it is under S3R_MAX_ISA=avx2 or avx512, which cap oneDNN too, see
// tests/CMakeLists.txt); if it is, the self-check must fail and oneDNN must not be chosen.
TEST(Matmul, OnednnInt8SelfCheckCatchesSaturation) {
  // oneDNN picks kernels by shape: probe a few, every one with +127 x +127 codes everywhere.
  bool raw_exact = true;
  std::string example;
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{3, 5, 64}, {7, 19, 37}, {64, 64, 256}}) {
    const std::vector<int8_t> a(M * K, 127), b(K * N, 127);
    std::vector<int32_t> out(M * N, 0);
    onednn::run({onednn::Type::kS8, onednn::Type::kS8, onednn::Type::kS32, {M, N, K, false, false, K, N, N}},
                out.data(), a.data(), b.data());
    for (int32_t v : out) {
      if (v != K * 127 * 127 && raw_exact) {
        raw_exact = false;
        example = std::to_string(M) + " x " + std::to_string(N) + " x " + std::to_string(K) +
                  ": " + std::to_string(v) + " for " + std::to_string(K * 127 * 127);
      }
    }
  }
  const Int8SelfCheck& check = onednn_int8_self_check();
  if (raw_exact) {
    EXPECT_TRUE(check.passed) << check.detail;
    GTEST_SKIP() << "oneDNN's int8 matmul is exact in this process, so there is no saturation "
                 << "for the self-check to catch; the S3R_MAX_ISA=avx2 run of this test "
                 << "(avx2.Matmul.*) exercises it";
  }
  EXPECT_FALSE(check.passed) << "oneDNN gave " << example << ", yet the self-check passed: "
                             << check.detail;
  EXPECT_NE(int8_backend(), Int8Backend::kOnednn);
  std::string why;
  EXPECT_FALSE(int8_backend_available(Int8Backend::kOnednn, &why));
  EXPECT_NE(why.find("not exact"), std::string::npos) << why;
  EXPECT_THROW(set_int8_backend(Int8Backend::kOnednn), Error);
}

// Asking for a backend this process cannot run is a clear error; the backend in use stays.
TEST(Matmul, UnavailableBackendsAreRefused) {
  const Int8Backend before = int8_backend();
  for (Int8Backend b : {Int8Backend::kReference, Int8Backend::kAvx2, Int8Backend::kOnednn, Int8Backend::kAmx,
                        Int8Backend::kVnni}) {
    std::string why;
    if (int8_backend_available(b, &why)) continue;
    try {
      set_int8_backend(b);
      ADD_FAILURE() << "set_int8_backend(" << to_string(b) << ") accepted an unavailable backend";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    EXPECT_EQ(int8_backend(), before);
  }
  EXPECT_TRUE(int8_backend_available(Int8Backend::kReference));
  EXPECT_TRUE(bf16_backend_available(Bf16Backend::kF32));
}

// A mixture of experts' int8 products change their row count (M, and K in the dW product) from
// call to call; oneDNN would compile a kernel for each. 30 row counts of each kind, exact sums,
// from a bounded set of primitives (chunks of 32 * 2^j and a zero-padded last one: 4 sizes up to
// 300 rows, per kind; one primitive per count would be 60).
TEST(Matmul, Int8ProductsOfVaryingRowCountsReuseABoundedSetOfPrimitives) {
  const auto backends = int8_backends();
  if (std::find(backends.begin(), backends.end(), Int8Backend::kOnednn) == backends.end()) GTEST_SKIP();
  ScopedInt8Backend scoped(Int8Backend::kOnednn);
  const int64_t C = 64, F = 96;
  const int64_t before = matmul_primitive_count();
  for (int64_t rows = 33; rows < 300; rows += 9) {
    for (const Case& c : {Case{rows, F, C, false, false},  // Y = X W: M = rows
                          Case{C, F, rows, true, false}}) {  // dW = X^T G: K = rows
      const auto a = random_s8(c.M * c.K, 5), b = random_s8(c.K * c.N, 6);
      const auto want = exact_sums(a, b, c);
      std::vector<int32_t> out(c.M * c.N);
      matmul_s8(out.data(), a.data(), b.data(), shape_of(c));
      for (int64_t i = 0; i < c.M * c.N; ++i) ASSERT_EQ(out[i], want[i]) << describe(c) << " at " << i;
      AlignedVector<float> scaled(c.M * c.N, 0.5f), cs(c.N, 0.25f);
      matmul_s8_scaled(scaled.data(), a.data(), b.data(), shape_of(c), nullptr, cs.data(), true);
      for (int64_t i = 0; i < c.M * c.N; ++i) ASSERT_EQ(scaled[i], 0.5f + static_cast<float>(want[i]) * 0.25f) << describe(c);
    }
  }
  EXPECT_LE(matmul_primitive_count() - before, 16);
}

TEST(Matmul, EmptyShapesAreRejected) {
  std::vector<int32_t> out(1);
  std::vector<int8_t> a(1), b(1);
  EXPECT_THROW(matmul_s8(out.data(), a.data(), b.data(), {0, 1, 1}), Error);
}

}  // namespace
}  // namespace s3r::gemm
