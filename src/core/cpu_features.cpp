// CPUID / XGETBV feature detection and the S3R_MAX_ISA cap (s3r/core/cpu_features.hpp).
#include "s3r/core/cpu_features.hpp"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

#include "s3r/core/error.hpp"

namespace s3r {

namespace {

struct Regs {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(uint32_t leaf, uint32_t subleaf) {
  Regs r;
  if (__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d) == 0) return Regs{};
  return r;
}

bool bit(uint32_t word, int i) { return ((word >> i) & 1u) != 0; }

// XCR0: the register states the OS saves on a context switch (valid only with OSXSAVE).
uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

// Linux grants the AMX tile data state per process on request (kernel 5.16+).
bool request_amx_permission() {
#ifdef SYS_arch_prctl
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  const Regs l1 = cpuid(1, 0);
  const bool osxsave = bit(l1.c, 27);
  if (!osxsave || !bit(l1.c, 28)) return f;  // no AVX, or the OS does not save YMM state
  const uint64_t xcr = xcr0();
  const bool ymm_state = (xcr & 0x6) == 0x6;
  const bool zmm_state = ymm_state && (xcr & 0xE0) == 0xE0;
  const bool tile_state = (xcr & 0x60000) == 0x60000;
  const Regs max = cpuid(0, 0);
  if (max.a < 7 || !ymm_state) return f;
  const Regs l7 = cpuid(7, 0);
  const Regs l7s1 = l7.a >= 1 ? cpuid(7, 1) : Regs{};
  f.fma = bit(l1.c, 12);
  f.f16c = bit(l1.c, 29);
  f.avx2 = bit(l7.b, 5);
  f.avx_vnni = bit(l7s1.a, 4);
  if (zmm_state) {
    f.avx512f = bit(l7.b, 16);
    f.avx512dq = bit(l7.b, 17);
    f.avx512bw = bit(l7.b, 30);
    f.avx512vl = bit(l7.b, 31);
    f.avx512_vnni = bit(l7.c, 11);
    f.avx512_bf16 = bit(l7s1.a, 5);
  }
  if (tile_state && bit(l7.d, 24) && request_amx_permission()) {
    f.amx_tile = true;
    f.amx_bf16 = bit(l7.d, 22);
    f.amx_int8 = bit(l7.d, 25);
  }
  return f;
}

// Caps, from the lowest: reference (scalar), avx2 (AVX2 + FMA), avx512 (AVX-512 F/BW/VL/DQ),
// avx512_bf16 (avx512 + AVX-512 VNNI and BF16, no AMX: a Zen 4/5 or Cooper Lake). AVX-VNNI and
// AMX are above every cap.
void apply_cap(CpuFeatures& f, const std::string& cap) {
  const bool keep_vnni_bf16 = cap == "avx512_bf16";
  const bool keep_avx512 = cap == "avx512" || keep_vnni_bf16;
  const bool keep_avx2 = cap == "avx2" || keep_avx512;
  if (cap != "reference" && !keep_avx2) {
    throw Error("S3R_MAX_ISA='" + cap +
                "' is not a cap; use reference, avx2, avx512 or avx512_bf16");
  }
  CpuFeatures capped;
  capped.cap = cap;
  if (keep_avx2) {
    capped.avx2 = f.avx2;
    capped.fma = f.fma;
    capped.f16c = f.f16c;
  }
  if (keep_avx512) {
    capped.avx512f = f.avx512f;
    capped.avx512bw = f.avx512bw;
    capped.avx512vl = f.avx512vl;
    capped.avx512dq = f.avx512dq;
  }
  if (keep_vnni_bf16) {
    capped.avx512_vnni = f.avx512_vnni;
    capped.avx512_bf16 = f.avx512_bf16;
  }
  f = capped;
}

CpuFeatures detect_with_cap() {
  CpuFeatures f = detect();
  const char* cap = std::getenv("S3R_MAX_ISA");
  if (cap != nullptr && *cap != '\0') apply_cap(f, cap);
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect_with_cap();
  return features;
}

std::string describe(const CpuFeatures& f) {
  std::string s;
  auto add = [&s](bool has, const char* name) {
    if (!has) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  if (f.avx512f) {
    std::string parts = "avx512(f";
    if (f.avx512bw) parts += " bw";
    if (f.avx512vl) parts += " vl";
    if (f.avx512dq) parts += " dq";
    add(true, (parts + ")").c_str());
  }
  add(f.avx512_vnni, "avx512_vnni");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.avx_vnni, "avx_vnni");
  if (f.amx_tile) {
    std::string parts = "amx(tile";
    if (f.amx_int8) parts += " int8";
    if (f.amx_bf16) parts += " bf16";
    add(true, (parts + ")").c_str());
  }
  if (s.empty()) s = "no AVX2";
  if (!f.cap.empty()) s += " [capped at " + f.cap + " by S3R_MAX_ISA]";
  return s;
}

}  // namespace s3r
