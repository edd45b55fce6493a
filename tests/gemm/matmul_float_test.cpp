// f32 and bf16 matrix products of every backend against double-precision references computed
// here, for the three layouts of a linear layer: their error bounds, the same bits for any thread
// count and row count, leading dimensions, and oneDNN's cached primitives. int8 products:
// matmul_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gemm/backends.hpp"
#include "gemm/product_cases.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/gemm/backend.hpp"
#include "s3r/gemm/matmul.hpp"
#include "test_util.hpp"

namespace s3r::gemm {
namespace {

using namespace product_cases;  // Case, cases(), at_a, at_b, random_f32, shape_of
using testing::bf16_backends;

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
      const std::string name = "bf16->f32 " + std::string(to_string(backend)) +
                               (tiles ? " tiles" : "");
      check_float_product<bf16, float>(name.c_str(), false);
      check_float_product<bf16, float>((name + " acc").c_str(), true);
    }
  }
}

TEST(Matmul, Bf16ToBf16MatchesReferenceInEveryBackend) {
  for (Bf16Backend backend : bf16_backends()) {
    ScopedBf16Backend scoped(backend);
    check_float_product<bf16, bf16>(("bf16->bf16 " + std::string(to_string(backend))).c_str(), false);
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
std::string first_difference(const AlignedVector<float>& want, const AlignedVector<float>& got, int64_t N,
                             const std::string& want_from = "1 thread") {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::bit_cast<uint32_t>(want[i]) != std::bit_cast<uint32_t>(got[i])) {
      return "[" + std::to_string(i / N) + ", " + std::to_string(i % N) + "]: " + std::to_string(got[i]) +
             " instead of " + std::to_string(want[i]) + " (" + want_from + ")";
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

// An f32 product whose operands' tile rows lie far apart (thread invariance on) gets, tile for
// tile, the bits of the same 128 x 256 tile read in place: under oneDNN's AVX2 kernels such an
// operand is read from a contiguous copy of its tiles, B's starting 16 bytes off a 32-byte
// boundary (gemm/matmul.cpp), which must change only the time. The reference tiles run inside a
// parallel region, where a product is one oneDNN call on the operands as given. Shapes: the LM
// head's dW = X^T G (A transposed with rows of 256 > 128, B rows of 768 > 256: both copied)
// and its forward X W (B copied), full tiles only (a short tile is padded, not read in place).
TEST(Matmul, FloatTileCopiesKeepTheBitsOfTheOperandsInPlace) {
  for (const Case& c : {Case{256, 768, 300, true, false}, Case{256, 768, 96, false, false}}) {
    const auto a = random_f32(c.M * c.K, 41), b = random_f32(c.K * c.N, 42);
    AlignedVector<float> tiled(c.M * c.N), in_place(c.M * c.N);
    matmul_f32(tiled.data(), a.data(), b.data(), shape_of(c));
    const int64_t lda = c.ta ? c.M : c.K;
    bool parallel = true;
#pragma omp parallel for num_threads(2) schedule(static, 1) reduction(&& : parallel)
    for (int64_t t = 0; t < (c.M / 128) * (c.N / 256); ++t) {
      parallel = parallel && omp_in_parallel();
      const int64_t m0 = t / (c.N / 256) * 128, n0 = t % (c.N / 256) * 256;
      const float* at = a.data() + (c.ta ? m0 : m0 * lda);
      matmul_f32(in_place.data() + m0 * c.N + n0, at, b.data() + n0,
                 {128, 256, c.K, c.ta, false, lda, c.N, c.N});
    }
    ASSERT_TRUE(parallel) << "the reference tiles must run inside an active parallel region";
    EXPECT_EQ(first_difference(in_place, tiled, c.N, "in place"), "") << describe(c);
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

}  // namespace
}  // namespace s3r::gemm
