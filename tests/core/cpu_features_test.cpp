// CPU features, kernel tiers and the S3R_ISA / S3R_MAX_ISA overrides. Runs plainly and in a
// process capped as an AVX2-only CPU (tests/CMakeLists.txt), so the refusals are exercised on
// any machine at least once.
#include "s3r/core/cpu_features.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "s3r/core/error.hpp"
#include "s3r/core/isa.hpp"
#include "s3r/gemm/machine_line.hpp"
#include "test_util.hpp"

namespace s3r {
namespace {

TEST(CpuFeatures, TiersFollowTheFeatures) {
  const CpuFeatures& f = cpu_features();
  // AVX-512 F/BW/VL CPUs all have AVX2 + FMA; the tier conditions encode that.
  if (f.has_avx512_tier()) {
    EXPECT_TRUE(f.has_avx2_tier());
  }
  EXPECT_EQ(isa_supported(Isa::kAvx2), f.has_avx2_tier());
  EXPECT_EQ(isa_supported(Isa::kAvx512), f.has_avx512_tier());
  EXPECT_TRUE(isa_supported(Isa::kReference));
  const Isa best = best_isa();
  EXPECT_EQ(best, f.has_avx512_tier() ? Isa::kAvx512 : f.has_avx2_tier() ? Isa::kAvx2 : Isa::kReference);
  const char* env = std::getenv("S3R_ISA");
  if (env == nullptr || *env == '\0') {
    EXPECT_EQ(active_isa(), best);
  }
}

TEST(CpuFeatures, CapHidesEverythingAboveIt) {
  const CpuFeatures& f = cpu_features();
  const char* cap = std::getenv("S3R_MAX_ISA");
  if (cap == nullptr || *cap == '\0') GTEST_SKIP() << "not capped (the capped run checks this)";
  EXPECT_EQ(f.cap, cap);
  EXPECT_FALSE(f.avx_vnni || f.amx_tile || f.amx_int8 || f.amx_bf16) << describe(f);
  if (f.cap != "avx512_bf16") {
    EXPECT_FALSE(f.avx512_vnni || f.avx512_bf16) << describe(f);
  }
  if (f.cap != "avx512" && f.cap != "avx512_bf16") {
    EXPECT_FALSE(f.avx512f || f.avx512bw || f.avx512vl) << describe(f);
  }
  if (f.cap == "reference") {
    EXPECT_FALSE(f.avx2 || f.fma) << describe(f);
  }
  EXPECT_NE(describe(f).find("[capped at " + f.cap + " by S3R_MAX_ISA]"), std::string::npos);
}

TEST(CpuFeatures, AskingForAMissingTierFailsAndNamesWhatIsMissing) {
  const Isa before = active_isa();
  int refused = 0;
  for (Isa isa : all_isas()) {
    std::string why;
    if (isa_supported(isa, &why)) {
      ScopedIsa scoped(isa);
      EXPECT_EQ(active_isa(), isa);
      continue;
    }
    ++refused;
    try {
      set_isa(isa);
      ADD_FAILURE() << "set_isa(" << isa_name(isa) << ") accepted a tier this CPU lacks";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string(isa_name(isa))), std::string::npos) << msg;
      EXPECT_NE(msg.find("lacks"), std::string::npos) << msg;
      EXPECT_NE(msg.find(why), std::string::npos) << msg;
    }
    EXPECT_EQ(active_isa(), before) << "a refused tier must leave the active one in place";
  }
  EXPECT_EQ(active_isa(), before);
  if (refused == 0) {
    GTEST_SKIP() << "this CPU runs every tier: the refusal is exercised by the capped run "
                 << "(avx2.CpuFeatures.*)";
  }
}

TEST(CpuFeatures, TierNamesRoundTrip) {
  for (Isa isa : all_isas()) EXPECT_EQ(parse_isa(isa_name(isa)), isa);
  try {
    parse_isa("avx3");
    ADD_FAILURE() << "parse_isa accepted 'avx3'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use reference, avx2 or avx512"), std::string::npos) << e.what();
  }
}

TEST(CpuFeatures, MachineLineNamesTierAndBackends) {
  const std::string line = machine_line();
  EXPECT_NE(line.find("kernels " + std::string(isa_name(active_isa()))), std::string::npos) << line;
  EXPECT_NE(line.find("GEMM int8 "), std::string::npos) << line;
  EXPECT_NE(line.find("bf16 "), std::string::npos) << line;
  EXPECT_NE(line.find("f32 onednn"), std::string::npos) << line;
  EXPECT_NE(line.find(describe(cpu_features())), std::string::npos) << line;
}

}  // namespace
}  // namespace s3r
