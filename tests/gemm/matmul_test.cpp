// Matrix products of every backend against exact or double-precision references computed here,
// for the three layouts of a linear layer, around the tiles of s3r's own int8 GEMM.
#include "s3r/gemm/matmul.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gemm/backends.hpp"
#include "gemm/onednn_matmul.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/gemm/backend.hpp"
#include "test_util.hpp"

namespace s3r::gemm {
namespace {

struct Case {
  int64_t M, N, K;
  bool ta, tb;
};

// The layouts of Y = X W, dX = G W^T and dW = X^T G, and odd sizes around the kernels' tiles.
std::vector<Case> cases() {
  std::vector<Case> c;
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 5, 7}, {16, 16, 16},
                         {17, 33, 65}, {64, 48, 130}, {100, 1, 37}, {1, 70, 129},
                         // 3 x 3 of the thread-invariant f32/bf16 tiles (128 x 256), edges included
                         {300, 530, 40}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) c.push_back({M, N, K, ta, tb});
    }
  }
  return c;
}

std::string describe(const Case& c) {
  return "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
         " ta=" + std::to_string(c.ta) + " tb=" + std::to_string(c.tb);
}

// op(A)[m, k] and op(B)[k, n] from row-major storage.
template <typename T>
T at_a(const std::vector<T>& a, const Case& c, int64_t m, int64_t k) {
  return c.ta ? a[k * c.M + m] : a[m * c.K + k];
}
template <typename T>
T at_b(const std::vector<T>& b, const Case& c, int64_t k, int64_t n) {
  return c.tb ? b[n * c.K + k] : b[k * c.N + n];
}

using testing::bf16_backends;
using testing::int8_backends;
using testing::random_s8;

AlignedVector<float> random_f32(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  AlignedVector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

MatmulShape shape_of(const Case& c) { return MatmulShape{c.M, c.N, c.K, c.ta, c.tb}; }

// Shapes around s3r's own GEMMs' tiles and blocks (AVX2: 6 x 16 micro-tiles, 96 x 256 blocks, K
// slices of 512; AMX: 32 x 32 blocks, k in steps of 64, A read in place when its rows are
// contiguous and K is a multiple of 64, but for a last partial block: M = 64 and 77 at K = 192):
// crossing each edge by one, with odd K. N = 515: on a CPU with AMX int8, oneDNN's
// products with a transposed A and N >= 512 run on a row-major copy of A (gemm/onednn_matmul.cpp).
std::vector<Case> blocked_cases() {
  std::vector<Case> c;
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{6, 16, 2}, {7, 17, 3}, {5, 15, 511},
                         {97, 257, 513}, {7, 17, 1031}, {12, 32, 1024}, {33, 515, 70},
                         {64, 33, 192}, {77, 31, 192},
                         // several chunks of B panels of the AMX/VNNI blocks (512 KB each: 7 and
                         // 4 blocks of 32 columns at these K), with edges in every dimension
                         {40, 300, 2100}, {40, 200, 4096},
                         // AVX2: packed by K slice (M <= 768, K >= 2048), odd K, blocks split over
                         // the threads
                         {101, 40, 2049}}) {
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

// Float products: the f32-accumulated result differs from the exact (double) one by at most
// gamma_K * sum_k |a||b| with gamma_K = K u / (1 - K u), u = 2^-24; inputs of the bf16 product are
// bf16 already, so only accumulation error remains. We allow 2 * K * u * sum|a||b|.
template <typename In, typename Out>
void check_float_product(const char* what, bool accumulate) {
  for (const Case& c : cases()) {
    const auto af = random_f32(c.M * c.K, 5), bf = random_f32(c.K * c.N, 6);
    std::vector<In> a(af.size()), b(bf.size());
    auto from_float = [](float f) {
      if constexpr (std::is_same_v<In, bf16>) {
        return to_bf16(f);
      } else {
        return f;
      }
    };
    for (size_t i = 0; i < a.size(); ++i) a[i] = from_float(af[i]);
    for (size_t i = 0; i < b.size(); ++i) b[i] = from_float(bf[i]);
    auto val = [](In v) -> double {
      if constexpr (std::is_same_v<In, bf16>) {
        return to_float(v);
      } else {
        return v;
      }
    };
    std::vector<Out> out(c.M * c.N);
    AlignedVector<float> init(c.M * c.N, 0.25f);
    if constexpr (std::is_same_v<Out, float>) {
      out.assign(init.begin(), init.end());
      if constexpr (std::is_same_v<In, float>) {
        matmul_f32(out.data(), a.data(), b.data(), shape_of(c), accumulate);
      } else {
        matmul_bf16(out.data(), a.data(), b.data(), shape_of(c), accumulate);
      }
    } else {
      matmul_bf16(out.data(), a.data(), b.data(), shape_of(c));
    }
    for (int64_t m = 0; m < c.M; ++m) {
      for (int64_t n = 0; n < c.N; ++n) {
        double ref = accumulate ? 0.25 : 0.0, mag = 0.0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double p = val(at_a(a, c, m, k)) * val(at_b(b, c, k, n));
          ref += p;
          mag += std::fabs(p);
        }
        double got, tol = 2.0 * static_cast<double>(c.K) * 0x1p-24 * mag + 1e-30;
        if constexpr (std::is_same_v<Out, bf16>) {
          got = to_float(out[m * c.N + n]);
          tol += 0x1p-8 * std::fabs(ref);  // bf16 output rounding (8 significant bits)
        } else {
          got = out[m * c.N + n];
        }
        ASSERT_NEAR(got, ref, tol) << what << " " << describe(c) << " at [" << m << ", " << n << "]";
      }
    }
  }
}

// Both ways of running f32 and bf16 products: fixed thread-invariant tiles (the default) and
// oneDNN's own threading (what the benchmarks use).
struct ScopedThreadInvariant {
  explicit ScopedThreadInvariant(bool on) : previous(thread_invariant()) { set_thread_invariant(on); }
  ~ScopedThreadInvariant() { set_thread_invariant(previous); }
  bool previous;
};

TEST(Matmul, F32MatchesReference) {
  for (bool tiles : {true, false}) {
    ScopedThreadInvariant scoped(tiles);
    check_float_product<float, float>(tiles ? "f32 tiles" : "f32", false);
    check_float_product<float, float>(tiles ? "f32 tiles accumulate" : "f32 accumulate", true);
  }
}

TEST(Matmul, Bf16ToF32MatchesReferenceInEveryBackend) {
  for (Bf16Backend backend : bf16_backends()) {
    for (bool tiles : {true, false}) {
      ScopedBf16Backend scoped(backend);
      ScopedThreadInvariant scoped_tiles(tiles);
      const std::string name = std::string(backend == Bf16Backend::kF32 ? "bf16->f32 emulated" : "bf16->f32 onednn") +
                               (tiles ? " tiles" : "");
      check_float_product<bf16, float>(name.c_str(), false);
      check_float_product<bf16, float>((name + " acc").c_str(), true);
    }
  }
}

TEST(Matmul, Bf16ToBf16MatchesReferenceInEveryBackend) {
  for (Bf16Backend backend : bf16_backends()) {
    ScopedBf16Backend scoped(backend);
    check_float_product<bf16, bf16>(backend == Bf16Backend::kF32 ? "bf16->bf16 emulated" : "bf16->bf16 onednn", false);
  }
}

// Random bf16 operands of an M x N x K product, and the same values widened to f32.
struct Bf16Operands {
  std::vector<bf16> a, b;
  AlignedVector<float> aw, bw;
};
Bf16Operands random_bf16_operands(int64_t M, int64_t N, int64_t K, uint32_t seed) {
  const auto af = random_f32(M * K, seed), bf = random_f32(K * N, seed + 1);
  Bf16Operands o{std::vector<bf16>(af.size()), std::vector<bf16>(bf.size()), AlignedVector<float>(af.size()),
                 AlignedVector<float>(bf.size())};
  for (size_t i = 0; i < af.size(); ++i) o.aw[i] = to_float(o.a[i] = to_bf16(af[i]));
  for (size_t i = 0; i < bf.size(); ++i) o.bw[i] = to_float(o.b[i] = to_bf16(bf[i]));
  return o;
}

// The emulated backend reads caller-widened operands instead of widening again: a widened copy
// that differs from the bf16 values must change the result (so the cache is really used), and
// a faithful one must give the same bits as widening inside the call.
TEST(Matmul, Bf16EmulationUsesTheWidenedOperands) {
  ScopedBf16Backend scoped(Bf16Backend::kF32);
  const int64_t M = 9, N = 11, K = 13;
  auto [a, b, aw, bw] = random_bf16_operands(M, N, K, 9);
  AlignedVector<float> plain(M * N), cached(M * N), doubled(M * N);
  matmul_bf16(plain.data(), a.data(), b.data(), {M, N, K});
  matmul_bf16(cached.data(), Bf16Operand{a.data(), aw.data()}, Bf16Operand{b.data(), bw.data()}, {M, N, K});
  EXPECT_EQ(plain, cached);
  for (auto& v : aw) v *= 2.0f;
  matmul_bf16(doubled.data(), Bf16Operand{a.data(), aw.data()}, Bf16Operand{b.data(), bw.data()}, {M, N, K});
  for (int64_t i = 0; i < M * N; ++i) ASSERT_EQ(doubled[i], 2.0f * plain[i]) << i;
}

// The bf16 mode keeps only the widened values of its operands where bf16 is emulated
// (nn/quant_linear.cpp): the emulated backend needs nothing else, and the native one must refuse
// such an operand rather than read a null pointer.
TEST(Matmul, Bf16OperandsMayHoldOnlyTheirWidenedValues) {
  const int64_t M = 3, N = 4, K = 5;
  const auto [a, b, aw, bw] = random_bf16_operands(M, N, K, 11);
  AlignedVector<float> want(M * N), got(M * N);
  {
    ScopedBf16Backend scoped(Bf16Backend::kF32);
    matmul_bf16(want.data(), a.data(), b.data(), {M, N, K});
    matmul_bf16(got.data(), Bf16Operand{nullptr, aw.data()}, Bf16Operand{nullptr, bw.data()}, {M, N, K});
    EXPECT_EQ(got, want);
  }
  std::string why_not;
  if (!bf16_backend_available(Bf16Backend::kOnednn, &why_not)) {
    GTEST_SKIP() << "the native bf16 backend cannot run here (" << why_not << "): its refusal is untested";
  }
  ScopedBf16Backend scoped(Bf16Backend::kOnednn);
  try {
    matmul_bf16(got.data(), Bf16Operand{nullptr, aw.data()}, Bf16Operand{b.data(), bw.data()}, {M, N, K});
    FAIL() << "the native backend accepted an operand without bf16 values";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only its f32-widened values"), std::string::npos) << e.what();
  }
}

// Bit-for-bit equality (+0 and -0 told apart); "" when equal, else the first difference.
std::string first_difference(const AlignedVector<float>& want, const AlignedVector<float>& got, int64_t N) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::bit_cast<uint32_t>(want[i]) != std::bit_cast<uint32_t>(got[i])) {
      return "[" + std::to_string(i / N) + ", " + std::to_string(i % N) + "]: " + std::to_string(got[i]) +
             " instead of " + std::to_string(want[i]) + " (1 thread)";
    }
  }
  return "";
}

// f32 and bf16 products (thread invariance on, the default) give the same bits for 1, 2 and 3
// threads, in every backend. oneDNN's own GEMMs split their work, K included, by the thread
// count and add the partial sums in an order that depends on it (gemm/matmul.cpp). Shapes: the
// dW and dX products of a layer at C = 256, F = 768, T = 1024 (f32 under oneDNN's AVX2 kernels
// differs at 3 threads), products with a small output and a long K, where oneDNN splits K at 2
// threads (f32 on AVX2; bf16 on AVX-512 without BF16, which oneDNN emulates), and an odd shape
// over 3 x 3 of the fixed 128 x 256 tiles, both operands transposed, K odd. Which kernels split
// depends on the CPU: with the fixed tiles turned off, the avx2 and avx512 capped reruns of this
// test fail on an AVX-512 BF16 machine whose uncapped run passes. 3 threads on 2 cores only
// oversubscribes.
TEST(Matmul, FloatProductsGiveTheSameBitsForAnyThreadCount) {
  const Case products[] = {{256, 768, 1024, true, false},   // dW = X^T G (C x F, K = T)
                           {1024, 256, 768, false, true},   // dX = G W^T (T x C, K = F)
                           {48, 32, 16384, false, true},    // small output, long K
                           {16, 16, 65536, true, false},
                           {300, 530, 1031, true, true}};
  const std::vector<Bf16Backend> bf16s = bf16_backends();
  for (const Case& c : products) {
    const Bf16Operands o = random_bf16_operands(c.M, c.N, c.K, 21);
    const AlignedVector<float> init = random_f32(c.M * c.N, 23);
    // Each type and backend: "f32", then "bf16 <backend>".
    for (size_t variant = 0; variant <= bf16s.size(); ++variant) {
      const bool f32 = variant == 0;
      const std::string name = f32 ? "f32" : "bf16 " + std::string(to_string(bf16s[variant - 1]));
      std::optional<ScopedBf16Backend> scoped;
      if (!f32) scoped.emplace(bf16s[variant - 1]);
      for (bool accumulate : {false, true}) {
        if (accumulate && c.M == 300) continue;
        auto product = [&](int threads) {
          testing::ScopedThreads st(threads);
          AlignedVector<float> out = init;
          if (f32) {
            matmul_f32(out.data(), o.aw.data(), o.bw.data(), shape_of(c), accumulate);
          } else {
            matmul_bf16(out.data(), o.a.data(), o.b.data(), shape_of(c), accumulate);
          }
          return out;
        };
        const AlignedVector<float> one = product(1);
        for (int threads : {2, 3}) {
          EXPECT_EQ(first_difference(one, product(threads), c.N), "")
              << name << " " << describe(c) << " accumulate " << accumulate << ", " << threads << " threads";
        }
      }
    }
  }
}

// A row of an f32 or bf16 product (thread invariance on) has the same bits whatever number of
// rows come after it: the first M rows of A times B, for M below, at and across the 128-row
// tile, against the same rows of the 300-row product, with and without accumulation; a mixture
// of experts' forward (K = C, N = F) and dX (K = F, N = C) shapes. And a row at its place in
// the tile grid: rows [r0, r0 + M) as a product with row_phase r0 mod 128 get the bits of the
// same rows of the whole product (without the phase, AVX2's f32 kernels give rows 126 and 127
// of a tile, a short last block, other bits: S3R_MAX_ISA=avx2 on Emerald Rapids, K 96, N 256).
TEST(Matmul, FloatProductRowsDoNotDependOnTheRowCount) {
  const std::vector<Bf16Backend> bf16s = bf16_backends();
  for (const auto& [K, N, tb] : {std::tuple{256, 96, false}, std::tuple{96, 256, true}}) {
    const int64_t rows = 300;
    const Bf16Operands o = random_bf16_operands(rows, N, K, 31);
    const AlignedVector<float> init = random_f32(rows * N, 33);
    for (size_t variant = 0; variant <= bf16s.size(); ++variant) {
      const bool f32 = variant == 0;
      std::optional<ScopedBf16Backend> scoped;
      if (!f32) scoped.emplace(bf16s[variant - 1]);
      for (bool accumulate : {false, true}) {
        auto product = [&](int64_t r0, int64_t M) {  // rows [r0, r0 + M) of the product
          AlignedVector<float> out(init.begin() + r0 * N, init.begin() + (r0 + M) * N);
          MatmulShape s{M, N, K, false, tb};
          s.row_phase = r0 % kFloatTileRows;
          if (f32) {
            matmul_f32(out.data(), o.aw.data() + r0 * K, o.bw.data(), s, accumulate);
          } else {
            matmul_bf16(out.data(), o.a.data() + r0 * K, o.b.data(), s, accumulate);
          }
          return out;
        };
        const AlignedVector<float> all = product(0, rows);
        for (const auto& [r0, M] : {std::pair{0, 1}, {0, 5}, {0, 37}, {0, 128}, {3, 127}, {3, 130}, {100, 200}, {128, 29}}) {
          const AlignedVector<float> want(all.begin() + r0 * N, all.begin() + (r0 + M) * N);
          EXPECT_EQ(first_difference(want, product(r0, M), N), "")
              << (f32 ? "f32" : "bf16 " + std::string(to_string(bf16s[variant - 1]))) << " K " << K << " N " << N
              << " rows [" << r0 << ", " << r0 + M << ") accumulate " << accumulate;
        }
      }
    }
  }
}

// Leading dimensions: products of column slices (one attention head of a (T, C) tensor), with
// every transpose, from inside an OpenMP parallel region (each thread its own stream).
TEST(Matmul, LeadingDimensionsReadAndWriteColumnSlices) {
  const int64_t T = 24, C = 40, HD = 8, heads = C / HD;
  const auto q = random_f32(T * C, 7), k = random_f32(T * C, 8);
  AlignedVector<float> scores(heads * T * T), out(T * C, 0.0f);
#pragma omp parallel for
  for (int64_t h = 0; h < heads; ++h) {
    // scores_h = Q_h K_h^T (T x T): A = Q_h (T x HD, ld C), B = K_h^T stored as (T x HD, ld C).
    matmul_f32(scores.data() + h * T * T, q.data() + h * HD, k.data() + h * HD,
               {T, T, HD, false, true, C, C, T});
    // out_h = scores_h^T K_h (T x HD into columns h*HD.. of out, ld C).
    matmul_f32(out.data() + h * HD, scores.data() + h * T * T, k.data() + h * HD,
               {T, HD, T, true, false, T, C, C});
  }
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = 0; j < T; ++j) {
        double ref = 0.0, mag = 0.0;
        for (int64_t d = 0; d < HD; ++d) {
          ref += double(q[i * C + h * HD + d]) * k[j * C + h * HD + d];
          mag += std::fabs(double(q[i * C + h * HD + d]) * k[j * C + h * HD + d]);
        }
        ASSERT_NEAR(scores[h * T * T + i * T + j], ref, 2.0 * HD * 0x1p-24 * mag) << h << " " << i << " " << j;
      }
      for (int64_t d = 0; d < HD; ++d) {
        double ref = 0.0, mag = 0.0;
        for (int64_t j = 0; j < T; ++j) {
          ref += double(scores[h * T * T + j * T + i]) * k[j * C + h * HD + d];
          mag += std::fabs(double(scores[h * T * T + j * T + i]) * k[j * C + h * HD + d]);
        }
        ASSERT_NEAR(out[i * C + h * HD + d], ref, 2.0 * T * 0x1p-24 * mag) << h << " " << i << " " << d;
      }
    }
  }
  AlignedVector<float> small(4);
  EXPECT_THROW(matmul_f32(small.data(), q.data(), k.data(), {2, 2, 8, false, false, 4, 0, 0}), Error);
}

TEST(Matmul, PrimitivesAreCachedPerShape) {
  const auto a = random_f32(8 * 8, 1), b = random_f32(8 * 8, 2);
  AlignedVector<float> out(64);
  matmul_f32(out.data(), a.data(), b.data(), {8, 8, 8});
  const int64_t before = matmul_primitive_count();
  for (int i = 0; i < 5; ++i) matmul_f32(out.data(), a.data(), b.data(), {8, 8, 8});
  EXPECT_EQ(matmul_primitive_count(), before);
  matmul_f32(out.data(), a.data(), b.data(), {8, 8, 8, true, false});
  EXPECT_EQ(matmul_primitive_count(), before + 1);
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
