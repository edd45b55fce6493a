// s3r's int8 GEMMs (kernels/gemm_s8.hpp): the AVX2 pair packing, the AVX-512 packing, row sums
// and epilogue (and the AVX2 epilogue), and
// the AMX and VNNI 32 x 32 blocks, against their scalar twins in kernels/ref, bit for bit, over
// edges of every size (rows of a panel, K around multiples of 4 and 64, the columns of a block).
// Each runs where the CPU has its instructions (AVX-512; AMX-INT8 granted by the OS; AVX-512
// VNNI); elsewhere it says it was skipped and why.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <algorithm>
#include <vector>

#include "kernels/gemm_s8.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/cpu_features.hpp"
#include "test_util.hpp"

namespace s3r::kernels {
namespace {

#ifdef S3R_HAVE_AVX512
#define S3R_SKIP_WITHOUT(HAS, WHAT)                                                               \
  if (!(HAS)) GTEST_SKIP() << "no " WHAT " here (" << describe(cpu_features()) << ")"
#else
#define S3R_SKIP_WITHOUT(HAS, WHAT) GTEST_SKIP() << "this build has no AVX-512 kernels"
#endif
#define S3R_SKIP_WITHOUT_AVX512() S3R_SKIP_WITHOUT(cpu_features().has_avx512_tier(), "AVX-512")
#define S3R_SKIP_WITHOUT_AMX() S3R_SKIP_WITHOUT(cpu_features().amx_int8, "AMX-INT8")
#define S3R_SKIP_WITHOUT_VNNI() \
  S3R_SKIP_WITHOUT(cpu_features().has_avx512_tier() && cpu_features().avx512_vnni, "AVX-512 VNNI")

std::vector<int8_t> codes(size_t n, uint32_t seed) { return testing::random_s8(n, seed); }

int64_t padded(int64_t K) { return (K + kAmxDepth - 1) / kAmxDepth * kAmxDepth; }

// The AVX2 GEMM's pair panels (pack_s8_pairs): 6-row A and 16-row B micro-panels from operands
// stored by rows (stride_k 1: eight pairs of eight rows at a time, transposed) or k-major
// (stride_r 1: two runs of codes per pair), partial panels, odd K and padding pairs.
TEST(PanelKernels, Avx2PairPackingMatchesTheReferenceWordForWord) {
#ifdef S3R_HAVE_AVX2
  if (!cpu_features().has_avx2_tier()) GTEST_SKIP() << "no AVX2 here (" << describe(cpu_features()) << ")";
  uint32_t seed = 400;
  for (int64_t width : {kS8Mr, kS8Nr}) {
    for (int64_t K : {1, 2, 3, 15, 16, 17, 31, 33, 64, 100}) {
      const int64_t pairs = (K + 1) / 2 + 3;  // three padding pairs
      for (int64_t valid : {int64_t{0}, int64_t{1}, width - 1, width}) {
        for (bool k_major : {false, true}) {
          const int64_t stride_r = k_major ? 1 : K + 5, stride_k = k_major ? width + 7 : 1;
          const auto x = codes(static_cast<size_t>(width * (K + 5) + K * (width + 7)), seed++);
          std::vector<uint32_t> want(static_cast<size_t>(pairs * width), 0xDEADBEEFu), got = want;
          ref::pack_s8_pairs(want.data(), x.data(), stride_r, stride_k, valid, width, K, pairs);
          avx2::pack_s8_pairs(got.data(), x.data(), stride_r, stride_k, valid, width, K, pairs);
          ASSERT_EQ(want, got) << "width " << width << ", K " << K << ", rows " << valid
                               << (k_major ? ", k-major" : ", rows contiguous");
        }
      }
    }
  }
#else
  GTEST_SKIP() << "this build has no AVX2 kernels";
#endif
}

TEST(PanelKernels, PackingMatchesTheReferenceByteForByte) {
  S3R_SKIP_WITHOUT_AVX512();
#ifdef S3R_HAVE_AVX512
  uint32_t seed = 1;
  for (int64_t K : {1, 3, 4, 5, 63, 64, 65, 130, 256}) {
    const int64_t kp = padded(K);
    for (int64_t panels : {1, 4, 6}) {  // the vector tier packs k-major B by fours
      for (int64_t valid : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{15}, 16 * panels - 9, 16 * panels}) {
        if (valid < 0) continue;
        for (bool k_major : {false, true}) {  // rows contiguous (stride_k = 1), or k-major
          const int64_t rows = 16 * panels;
          const int64_t stride_r = k_major ? 1 : K + 3, stride_k = k_major ? rows + 5 : 1;
          const auto x = codes(static_cast<size_t>(rows * (K + 3) + K * (rows + 5)), seed++);
          using Pack = void (*)(int8_t*, const int8_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
          const std::tuple<const char*, Pack, Pack> packs[] = {
              {"A", ref::pack_amx_a, avx512::pack_amx_a},
              {"B", ref::pack_amx_b, avx512::pack_amx_b},
              {"VNNI B", ref::pack_vnni_b, avx512::pack_vnni_b}};
          for (auto [name, ref_pack, tier_pack] : packs) {
            std::vector<int8_t> want(static_cast<size_t>(panels * kAmxRows * kp), 99), got = want;
            ref_pack(want.data(), x.data(), stride_r, stride_k, valid, panels, K, kp);
            tier_pack(got.data(), x.data(), stride_r, stride_k, valid, panels, K, kp);
            ASSERT_EQ(want, got) << name << " panels " << panels << ", K " << K << ", rows " << valid
                                 << (k_major ? ", k-major" : ", rows contiguous");
          }
        }
      }
    }
  }
#endif
}

TEST(PanelKernels, AmxBlockMatchesTheReference) {
  S3R_SKIP_WITHOUT_AMX();
#ifdef S3R_HAVE_AVX512
  uint32_t seed = 100;
  for (int64_t kp : {64, 128, 1024}) {
    for (int64_t lda : {kp, kp + 64}) {
      const auto a = codes(static_cast<size_t>(kAmxBlock * lda), seed++);
      const auto b = codes(static_cast<size_t>(kAmxBlock * kp), seed++);
      const int64_t ldc = kAmxBlock + 8;  // columns 32 .. 39 must stay untouched
      std::vector<int32_t> want(static_cast<size_t>(kAmxBlock * ldc), -7), got = want;
      ref::gemm_s8_amx_block(a.data(), lda, b.data(), kp, want.data(), ldc);
      amx::amx_tiles_configure();
      amx::gemm_s8_amx_block(a.data(), lda, b.data(), kp, got.data(), ldc);
      amx::amx_tiles_release();
      ASSERT_EQ(want, got) << "kp " << kp << ", lda " << lda;
    }
  }
#endif
}

// The block in halves, as the GEMM runs it: the sums stay in the tiles while another block's
// epilogue (vector code, no tiles) runs, and the stored block is the reference's.
TEST(PanelKernels, AmxSumsSurviveOtherWorkUntilStored) {
  S3R_SKIP_WITHOUT_AMX();
#ifdef S3R_HAVE_AVX512
  const int64_t kp = 256;
  const auto a = codes(static_cast<size_t>(2 * kAmxBlock * kp), 300);  // two blocks' rows
  const auto b = codes(static_cast<size_t>(kAmxBlock * kp), 301);
  std::vector<int32_t> want0(kAmxBlock * kAmxBlock), want1 = want0, got0(want0.size(), -7),
      got1(want0.size(), -7);
  ref::gemm_s8_amx_block(a.data(), kp, b.data(), kp, want0.data(), kAmxBlock);
  ref::gemm_s8_amx_block(a.data() + kAmxBlock * kp, kp, b.data(), kp, want1.data(), kAmxBlock);
  AlignedVector<float> out(kAmxBlock * kAmxBlock, 1.0f), scale(kAmxBlock, 0.5f);
  const S8Epilogue epi{nullptr, out.data(), kAmxBlock, scale.data(), scale.data(), false, nullptr};
  amx::amx_tiles_configure();
  amx::gemm_s8_amx_sum(a.data(), kp, b.data(), kp);
  amx::gemm_s8_amx_store(got0.data(), kAmxBlock);
  amx::gemm_s8_amx_sum(a.data() + kAmxBlock * kp, kp, b.data(), kp);
  avx512::gemm_s8_epilogue(epi, got0.data(), kAmxBlock, 0, kAmxBlock, 0, kAmxBlock);
  amx::gemm_s8_amx_store(got1.data(), kAmxBlock);
  amx::amx_tiles_release();
  EXPECT_EQ(want0, got0);
  EXPECT_EQ(want1, got1);
  EXPECT_EQ(out[1], static_cast<float>(want0[1]) * 0.5f * 0.5f);
#endif
}

// VNNI's block reads B as codes + 128 and corrects each row by its code sum (row_sums_s8); codes
// of -127 and +127 everywhere are its largest sums.
TEST(PanelKernels, VnniBlockAndRowSumsMatchTheReference) {
  S3R_SKIP_WITHOUT_VNNI();
#ifdef S3R_HAVE_AVX512
  uint32_t seed = 200;
  for (int64_t kp : {64, 128, 1024}) {
    for (int64_t lda : {kp, kp + 64}) {
      for (int fill : {0, 127, -127}) {
        auto a = codes(static_cast<size_t>(kAmxBlock * lda), seed++);
        auto b = codes(static_cast<size_t>(kAmxBlock * kp), seed++);
        if (fill != 0) {
          std::fill(a.begin(), a.end(), static_cast<int8_t>(fill));
          std::fill(b.begin(), b.end(), int8_t{127});
        }
        // A by rows, and the same codes by quads (each 16-row panel as pack_amx_b lays it out)
        std::vector<int8_t> quads(static_cast<size_t>(kAmxBlock * kp));
        for (int64_t i = 0; i < kAmxBlock; ++i) {
          for (int64_t k = 0; k < kp; ++k) {
            quads[(i / kAmxRows) * kAmxRows * kp + (k / 4) * 64 + 4 * (i % kAmxRows) + k % 4] = a[i * lda + k];
          }
        }
        std::vector<int8_t> b_u8(b.size());  // the VNNI layout: codes + 128
        for (size_t i = 0; i < b.size(); ++i) b_u8[i] = static_cast<int8_t>(static_cast<uint8_t>(b[i]) ^ 0x80u);
        const int64_t ldc = kAmxBlock + 8;  // columns 32 .. 39 must stay untouched
        std::vector<int32_t> want(static_cast<size_t>(kAmxBlock * ldc), -7);
        ref::gemm_s8_amx_block(a.data(), lda, b.data(), kp, want.data(), ldc);
        for (const S8Rows& rows : {S8Rows{a.data(), lda, 4, kAmxRows * lda},
                                   S8Rows{quads.data(), 4, 64, kAmxRows * kp}}) {
          const char* layout = rows.row == 4 ? "quads" : "rows";
          std::vector<int32_t> want_sums(kAmxBlock), sums(kAmxBlock, 5);
          ref::row_sums_s8(want_sums.data(), rows, kp);
          avx512::row_sums_s8(sums.data(), rows, kp);
          ASSERT_EQ(want_sums, sums) << layout << ", kp " << kp << ", lda " << lda;
          std::vector<int32_t> got(want.size(), -7);
          avx512::gemm_s8_vnni_block(rows, sums.data(), b_u8.data(), kp, got.data(), ldc);
          ASSERT_EQ(want, got) << layout << ", kp " << kp << ", lda " << lda << ", fill " << fill;
        }
      }
    }
  }
#endif
}

// The AVX-512 and AVX2 epilogues (the AVX2 GEMM's, gemm/s8_gemm.cpp) against the reference, bit
// for bit: every combination of scales and accumulation, and int32 output, with column counts
// around both vector widths; from a column off the cache lines, and from one on them with
// `stream` (non-temporal stores of the whole lines).
TEST(PanelKernels, EpilogueMatchesTheReferenceBitForBit) {
  using Epilogue = void (*)(const S8Epilogue&, const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t);
  std::vector<std::pair<const char*, Epilogue>> tiers;
#ifdef S3R_HAVE_AVX2
  if (cpu_features().has_avx2_tier()) tiers.emplace_back("avx2", avx2::gemm_s8_epilogue);
#endif
#ifdef S3R_HAVE_AVX512
  if (cpu_features().has_avx512_tier()) tiers.emplace_back("avx512", avx512::gemm_s8_epilogue);
#endif
  if (tiers.empty()) GTEST_SKIP() << "no vector tier here (" << describe(cpu_features()) << ")";
  std::mt19937 gen(5);
  std::uniform_int_distribution<int32_t> sum(-2'000'000'000, 2'000'000'000);
  std::uniform_real_distribution<float> scale(1e-6f, 3.0f);
  constexpr int64_t M = 40, N = 48, ld_acc = 33;
  std::vector<int32_t> acc(static_cast<size_t>(kAmxBlock * ld_acc));
  for (auto& v : acc) v = sum(gen);
  AlignedVector<float> rs(M), cs(N), c0(static_cast<size_t>(M * N));
  for (auto& v : rs) v = scale(gen);
  for (auto& v : cs) v = scale(gen);
  for (auto& v : c0) v = scale(gen) - 1.5f;
  for (const auto& [tier, epilogue] : tiers) {
    for (int variant = 0; variant < 9; ++variant) {
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{32, 32}, {1, 1}, {5, 15}, {32, 17}, {9, 16}, {3, 7}, {2, 9}}) {
        S8Epilogue e;
        AlignedVector<float> want = c0, got = c0;
        std::vector<int32_t> want32(static_cast<size_t>(M * N), 3), got32 = want32;
        if (variant == 8) {
          e.s32 = want32.data();
        } else {
          e.f32 = want.data();
          e.row_scale = variant & 1 ? rs.data() : nullptr;
          e.col_scale = variant & 2 ? cs.data() : nullptr;
          e.accumulate = (variant & 4) != 0;
        }
        e.ldc = N;
        // Columns from 16: whole 64-byte lines of C, which `stream` stores past the caches.
        const int64_t n0 = variant % 2 == 0 ? 16 : 13;
        ref::gemm_s8_epilogue(e, acc.data(), ld_acc, 7, rows, n0, cols);
        e.f32 = e.f32 ? got.data() : nullptr;
        e.s32 = e.s32 ? got32.data() : nullptr;
        e.stream = n0 == 16;
        epilogue(e, acc.data(), ld_acc, 7, rows, n0, cols);
        _mm_sfence();
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << tier << ", variant " << variant << ", " << rows << " x " << cols << " from column " << n0;
        ASSERT_EQ(want32, got32) << tier << ", " << rows << " x " << cols;
      }
    }
  }
}

}  // namespace
}  // namespace s3r::kernels
