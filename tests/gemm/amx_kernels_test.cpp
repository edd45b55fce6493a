// The AMX tier of s3r's int8 GEMM (kernels/gemm_s8.hpp): the packing, the 32 x 32 block and the
// AVX-512 epilogue against their scalar twins in kernels/ref, bit for bit, over edges of every
// size (rows of a panel, K around multiples of 4 and 64, the columns of a block). Runs where the
// OS grants AMX-INT8; elsewhere the twins are checked through the matmul tests' reference backend
// only, and this test says it was skipped and why.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm_s8.hpp"
#include "s3r/core/cpu_features.hpp"

namespace s3r::kernels {
namespace {

#ifdef S3R_HAVE_AVX512
#define S3R_SKIP_WITHOUT_AMX()                                                                    \
  if (!cpu_features().amx_int8) GTEST_SKIP() << "no AMX-INT8 here (" << describe(cpu_features()) << ")"
#else
#define S3R_SKIP_WITHOUT_AMX() GTEST_SKIP() << "this build has no AVX-512/AMX kernels"
#endif

std::vector<int8_t> codes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> v(n);
  for (auto& x : v) x = static_cast<int8_t>(d(gen));
  return v;
}

int64_t padded(int64_t K) { return (K + kAmxDepth - 1) / kAmxDepth * kAmxDepth; }

TEST(AmxKernels, PackingMatchesTheReferenceByteForByte) {
  S3R_SKIP_WITHOUT_AMX();
#ifdef S3R_HAVE_AVX512
  uint32_t seed = 1;
  for (int64_t K : {1, 3, 4, 5, 63, 64, 65, 130, 256}) {
    const int64_t kp = padded(K);
    for (int64_t valid : {0, 1, 7, 15, 16}) {
      for (bool k_major : {false, true}) {  // rows contiguous (stride_k = 1), or k-major
        const int64_t stride_r = k_major ? 1 : K + 3, stride_k = k_major ? 16 + 5 : 1;
        const auto x = codes(static_cast<size_t>(16 * (K + 3) + K * 21), seed++);
        for (bool b_panel : {false, true}) {
          std::vector<int8_t> want(static_cast<size_t>(kAmxRows * kp), 99), got = want;
          const auto ref_pack = b_panel ? ref::pack_amx_b : ref::pack_amx_a;
          const auto amx_pack = b_panel ? amx::pack_amx_b : amx::pack_amx_a;
          ref_pack(want.data(), x.data(), stride_r, stride_k, valid, K, kp);
          amx_pack(got.data(), x.data(), stride_r, stride_k, valid, K, kp);
          ASSERT_EQ(want, got) << (b_panel ? "B" : "A") << " panel, K " << K << ", rows " << valid
                               << (k_major ? ", k-major" : ", rows contiguous");
        }
      }
    }
  }
#endif
}

TEST(AmxKernels, BlockMatchesTheReference) {
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

TEST(AmxKernels, EpilogueMatchesTheReferenceBitForBit) {
  S3R_SKIP_WITHOUT_AMX();
#ifdef S3R_HAVE_AVX512
  std::mt19937 gen(5);
  std::uniform_int_distribution<int32_t> sum(-2'000'000'000, 2'000'000'000);
  std::uniform_real_distribution<float> scale(1e-6f, 3.0f);
  constexpr int64_t M = 40, N = 48, ld_acc = 33;
  std::vector<int32_t> acc(static_cast<size_t>(kAmxBlock * ld_acc));
  for (auto& v : acc) v = sum(gen);
  std::vector<float> rs(M), cs(N), c0(static_cast<size_t>(M * N));
  for (auto& v : rs) v = scale(gen);
  for (auto& v : cs) v = scale(gen);
  for (auto& v : c0) v = scale(gen) - 1.5f;
  for (int variant = 0; variant < 9; ++variant) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{32, 32}, {1, 1}, {5, 15}, {32, 17}, {9, 16}}) {
      S8Epilogue e;
      std::vector<float> want = c0, got = c0;
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
      ref::gemm_s8_epilogue(e, acc.data(), ld_acc, 7, rows, 13, cols);
      e.f32 = e.f32 ? got.data() : nullptr;
      e.s32 = e.s32 ? got32.data() : nullptr;
      amx::gemm_s8_epilogue(e, acc.data(), ld_acc, 7, rows, 13, cols);
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
          << "variant " << variant << ", " << rows << " x " << cols;
      ASSERT_EQ(want32, got32) << rows << " x " << cols;
    }
  }
#endif
}

}  // namespace
}  // namespace s3r::kernels
