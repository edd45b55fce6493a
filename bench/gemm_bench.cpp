// Throughput of the matrix products and the instruction-level limits behind them.
// items/s = multiply-adds per second (M * N * K per product).
//
//   gemm/TYPE/LAYOUT/M:4096/N:n/K:k/threads:P/BACKEND   one product through s3r::gemm, (n, k) of
//            1024 and 4096, and (256, 256), (768, 256), (256, 768): the projections of `small`,
//            and (4096, 256), (256, 4096): its LM head's forward (xw) and dX (gwt)
//   gemm/s8/xtg/M:m/N:n/K:4096/threads:P/BACKEND   `small`'s weight gradients (m, n of 256 and
//            768, K its 4096 tokens), the products the AMX GEMM takes by K slices
//     TYPE     s8 (the production call of the layout: Y = X W with row and column scales,
//              dX = G W^T with S3R-EC's dX epilogue fused, dW = X^T G with the column scale) | bf16 (f32 output) | f32
//     LAYOUT   xw (Y = X W) | gwt (dX = G W^T: B transposed) | xtg (dW = X^T G: A transposed)
//     BACKEND  s8: amx | vnni | onednn | avx2 | reference (reference only at N = K = 1024,
//              1 thread); bf16: amx | dpbf16 (s3r's own) | onednn | f32 (emulated); f32: onednn
//   peak/avx2_fma_f32            register-only loop of vfmadd231ps ymm (12 independent chains):
//                                the f32 FMA limit of the core (8 multiply-adds per instruction)
//   peak/avx2_madd_s16           vpmaddwd + vpaddd ymm (12 chains): the limit of s3r's exact int8
//                                microkernel (16 multiply-adds per vpmaddwd)
//   peak/avx2_maddubs_sign       vpsignb + vpmaddubsw + vpmaddwd + vpaddd ymm: ggml's sign trick
//                                (32 multiply-adds per vpmaddubsw), the alternative we measured
//   peak/avx512_fma_f32, peak/avx512_vnni_s8, peak/avx512_bf16_dot
//                                register-only zmm loops of vfmadd231ps, vpdpbusd and vdpbf16ps
//                                (16, 64 and 32 multiply-adds per instruction): the f32, int8
//                                and bf16 limits of an AVX-512 core without AMX
//   peak/avx2_s8_tile_l2         s3r's int8 microkernel alone (kernels::avx2::gemm_s8_tile) on
//                                one 96 x 256 block with K = 512, its panels in L1/L2 as inside
//                                the GEMM's blocking: what the GEMM around it loses
//   peak/amx_int8                register-only loop of tdpbssd (16384 multiply-adds each): the
//                                AMX int8 limit of the core
//   peak/amx_block_l1, peak/amx_block_l2
//                                s3r's AMX block alone (kernels::amx::gemm_s8_amx_block, 32 x 32,
//                                K = 256) on its A rows and one B panel pair (16 KB: L1), or
//                                cycling through 64 B panel pairs (1 MB: L2): how fast its tile
//                                loads feed tdpbssd from each level
// A backend the process cannot run (S3R_MAX_ISA, no VNNI, a failed oneDNN self-check) reports
// the reason and is skipped. Operands are random codes / normal values from a fixed seed, made
// once per process; C is overwritten by every call.
#include <immintrin.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.hpp"
#include "gemm/matmul_dx.hpp"
#include "kernels/gemm_s8.hpp"
#include "kernels/peak_loops.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/bf16.hpp"
#include "s3r/core/cpu_features.hpp"
#include "s3r/gemm/backend.hpp"
#include "s3r/gemm/matmul.hpp"

namespace s3r::bench {
namespace {

using gemm::Bf16Backend;
using gemm::Int8Backend;

constexpr int64_t kM = 4096;
constexpr int64_t kMaxDim = 4096;

struct Operands {
  AlignedVector<int8_t> a8, b8;  // 64-byte aligned, as the step's codes (AMX then reads op(A) in place)
  AlignedVector<float> a32, b32, row_scale, col_scale;
  std::vector<bf16> a16, b16;
};

const Operands& operands() {
  static const Operands ops = [] {
    Operands o;
    std::mt19937 gen(7);
    std::uniform_int_distribution<int> code(-127, 127);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const size_t n = static_cast<size_t>(kM * kMaxDim);
    o.a8.resize(n);
    o.b8.resize(n);
    o.a32.resize(n);
    o.b32.resize(n);
    o.a16.resize(n);
    o.b16.resize(n);
    for (size_t i = 0; i < n; ++i) {
      o.a8[i] = static_cast<int8_t>(code(gen));
      o.b8[i] = static_cast<int8_t>(code(gen));
      o.a32[i] = normal(gen);
      o.b32[i] = normal(gen);
      o.a16[i] = to_bf16(o.a32[i]);
      o.b16[i] = to_bf16(o.b32[i]);
    }
    o.row_scale.assign(kMaxDim, 0.01f);
    o.col_scale.assign(kMaxDim, 0.02f);
    return o;
  }();
  return ops;
}

enum class Layout { kXw, kGwt, kXtg };
const char* layout_name(Layout l) { return l == Layout::kXw ? "xw" : l == Layout::kGwt ? "gwt" : "xtg"; }

gemm::MatmulShape shape_of(Layout l, int64_t N, int64_t K, int64_t M = kM) {
  return {M, N, K, l == Layout::kXtg, l == Layout::kGwt};
}

void finish(benchmark::State& state, int64_t N, int64_t K, int64_t M = kM) {
  state.SetItemsProcessed(state.iterations() * M * N * K);
}

void bm_s8(benchmark::State& state, Layout layout, int64_t N, int64_t K, Int8Backend backend,
           int threads, int64_t M = kM) {
  if (!enter(state, Isa::kReference, threads)) return;
  std::string why;
  if (!gemm::int8_backend_available(backend, &why)) {
    state.SkipWithError(why.c_str());
    return;
  }
  const gemm::ScopedInt8Backend scoped(backend);
  const Operands& o = operands();
  AlignedVector<float> c(static_cast<size_t>(M * N));
  const gemm::MatmulShape s = shape_of(layout, N, K, M);
  for (auto _ : state) {
    switch (layout) {
      case Layout::kXw:
        gemm::matmul_s8_scaled(c.data(), o.a8.data(), o.b8.data(), s, o.row_scale.data(),
                               o.col_scale.data());
        break;
      case Layout::kGwt: {  // S3R-EC's dX epilogue fused, one example of kM tokens (s3r + dx)
        const kernels::DxTerms d{1e-3f, o.row_scale.data(), o.col_scale.data(), o.row_scale.data(),
                                 o.col_scale.data(), M, N, false};
        gemm::matmul_s8_dx(c.data(), o.a8.data(), o.b8.data(), s, d);
        break;
      }
      case Layout::kXtg:
        gemm::matmul_s8_scaled(c.data(), o.a8.data(), o.b8.data(), s, nullptr, o.col_scale.data());
        break;
    }
    benchmark::ClobberMemory();
  }
  finish(state, N, K, M);
}

void bm_bf16(benchmark::State& state, Layout layout, int64_t N, int64_t K, Bf16Backend backend,
             int threads) {
  if (!enter(state, Isa::kReference, threads)) return;
  std::string why;
  if (!gemm::bf16_backend_available(backend, &why)) {
    state.SkipWithError(why.c_str());
    return;
  }
  const gemm::ScopedBf16Backend scoped(backend);
  const Operands& o = operands();
  AlignedVector<float> c(static_cast<size_t>(kM * N));
  for (auto _ : state) {
    gemm::matmul_bf16(c.data(), o.a16.data(), o.b16.data(), shape_of(layout, N, K));
    benchmark::ClobberMemory();
  }
  finish(state, N, K);
}

void bm_f32(benchmark::State& state, Layout layout, int64_t N, int64_t K, int threads) {
  if (!enter(state, Isa::kReference, threads)) return;
  const Operands& o = operands();
  AlignedVector<float> c(static_cast<size_t>(kM * N));
  for (auto _ : state) {
    gemm::matmul_f32(c.data(), o.a32.data(), o.b32.data(), shape_of(layout, N, K));
    benchmark::ClobberMemory();
  }
  finish(state, N, K);
}

// ---- instruction-level limits (register-only loops: kernels/peak_loops.hpp) --------------------

constexpr int64_t kPeakIterations = 1 << 16;

// One register-only limit: `loop` of kPeakIterations iterations (it returns its multiply-adds).
using PeakLoop = uint64_t (*)(int64_t);
void time_peak(benchmark::State& state, PeakLoop loop) {
  uint64_t macs = 0;
  for (auto _ : state) macs += loop(kPeakIterations);
  state.SetItemsProcessed(static_cast<int64_t>(macs));
}

// The AVX2 limits: 12 chains of 8 (FMA) or 16 (vpmaddwd) multiply-adds, 8 chains of 32 (sign trick).
void bm_peak(benchmark::State& state, PeakLoop loop) {
  if (!enter(state, Isa::kAvx2, 1)) return;
  time_peak(state, loop);
}

// The AVX-512 limits, 12 chains each; skipped (with the reason) where the CPU, or S3R_MAX_ISA,
// lacks the instruction (`needs`: "VNNI", "BF16" or "").
void bm_peak_avx512(benchmark::State& state, PeakLoop loop, const std::string& needs) {
  if (!enter(state, Isa::kAvx512, 1)) return;
  const CpuFeatures& f = cpu_features();
  if ((needs == "VNNI" && !f.avx512_vnni) || (needs == "BF16" && !f.avx512_bf16)) {
    state.SkipWithError(("this CPU (or S3R_MAX_ISA) lacks AVX-512 " + needs).c_str());
    return;
  }
  time_peak(state, loop);
}

// The loop nest of one block of s8_gemm.cpp (for each B micro-panel, every A micro-panel), on
// packed panels of small codes, K = 512 (256 pairs): 16 x 16 tiles of 6 x 16.
void bm_s8_tile(benchmark::State& state) {
  if (!enter(state, Isa::kAvx2, 1)) return;
  constexpr int64_t kPairs = 256, kPanels = 16;
  using kernels::kS8Mr;
  using kernels::kS8Nr;
  std::vector<uint32_t> a(kPanels * kPairs * kS8Mr, 0x00030002u), b(kPanels * kPairs * kS8Nr, 0x0005FFF9u);
  std::vector<int32_t> c(kPanels * kS8Mr * kPanels * kS8Nr);
  const int64_t ldc = kPanels * kS8Nr;
  for (auto _ : state) {
    for (int64_t j = 0; j < kPanels; ++j) {
      for (int64_t i = 0; i < kPanels; ++i) {
        kernels::avx2::gemm_s8_tile(a.data() + i * kPairs * kS8Mr, b.data() + j * kPairs * kS8Nr,
                                    kPairs, c.data() + i * kS8Mr * ldc + j * kS8Nr, ldc, false);
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kPanels * kPanels * kS8Mr * kS8Nr * 2 * kPairs);
}

// The AMX limits: tdpbssd alone, and s3r's block with its operands in L1 or in L2 (`b_pairs` B
// panel pairs of K = 256 cycled through, one A block). Skipped where AMX-INT8 is not granted.
bool enter_amx(benchmark::State& state) {
  if (!enter(state, Isa::kAvx512, 1)) return false;
  if (!cpu_features().amx_int8) {
    state.SkipWithError("this CPU (or S3R_MAX_ISA, or the OS) gives no AMX-INT8");
    return false;
  }
  return true;
}

void bm_peak_amx(benchmark::State& state) {
  if (enter_amx(state)) time_peak(state, kernels::peak::avx512::amx_int8);
}

void bm_amx_block(benchmark::State& state, int64_t b_pairs) {
  if (!enter_amx(state)) return;
  using kernels::kAmxBlock;
  constexpr int64_t kp = 256;
  // random codes, on 64-byte boundaries as the GEMM's panels
  const AlignedVector<int8_t> a_buf(operands().a8.begin(), operands().a8.begin() + kAmxBlock * kp);
  const AlignedVector<int8_t> b_buf(operands().b8.begin(), operands().b8.begin() + b_pairs * kAmxBlock * kp);
  const int8_t* a = a_buf.data();
  const int8_t* b = b_buf.data();
  alignas(64) static int32_t c[kAmxBlock * kAmxBlock];
  kernels::amx::amx_tiles_configure();
  int64_t blocks = 0;
  for (auto _ : state) {
    for (int64_t j = 0; j < 64; ++j, ++blocks) {
      kernels::amx::gemm_s8_amx_block(a, kp, b + (blocks % b_pairs) * kAmxBlock * kp, kp, c, kAmxBlock);
    }
    benchmark::ClobberMemory();
  }
  kernels::amx::amx_tiles_release();
  state.SetItemsProcessed(blocks * kAmxBlock * kAmxBlock * kp);
}

const bool registered = [] {
  for (Layout layout : {Layout::kXw, Layout::kGwt, Layout::kXtg}) {
    // the large shapes, and those of `small`'s projections (C = 256, F = 768)
    for (auto [N, K] : {std::pair<int64_t, int64_t>{1024, 1024}, {1024, 4096}, {4096, 1024}, {4096, 4096},
                        {256, 256}, {768, 256}, {256, 768}, {4096, 256}, {256, 4096}}) {
      {
        for (int threads : thread_counts()) {
          const std::string dims = std::string(layout_name(layout)) + "/M:4096/N:" +
                                   std::to_string(N) + "/K:" + std::to_string(K) +
                                   "/threads:" + std::to_string(threads);
          for (Int8Backend b : {Int8Backend::kAmx, Int8Backend::kVnni, Int8Backend::kOnednn, Int8Backend::kAvx2,
                                Int8Backend::kReference}) {
            if (b == Int8Backend::kReference && (N != 1024 || K != 1024 || threads != 1)) continue;
            benchmark::RegisterBenchmark(("gemm/s8/" + dims + "/" + std::string(gemm::to_string(b))).c_str(),
                                         bm_s8, layout, N, K, b, threads, kM)
                ->UseRealTime()->Unit(benchmark::kMillisecond);
          }
          for (Bf16Backend b : {Bf16Backend::kAmx, Bf16Backend::kDpbf16, Bf16Backend::kOnednn, Bf16Backend::kF32}) {
            benchmark::RegisterBenchmark(("gemm/bf16/" + dims + "/" + std::string(gemm::to_string(b))).c_str(),
                                         bm_bf16, layout, N, K, b, threads)
                ->UseRealTime()->Unit(benchmark::kMillisecond);
          }
          benchmark::RegisterBenchmark(("gemm/f32/" + dims + "/onednn").c_str(), bm_f32, layout, N, K, threads)
              ->UseRealTime()->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
  // `small`'s weight gradients: dW = X^T G over the step's 4096 tokens, M x N the layer's widths
  for (auto [M, N] : {std::pair<int64_t, int64_t>{256, 768}, {768, 256}, {256, 256}}) {
    for (int threads : thread_counts()) {
      const std::string dims = "xtg/M:" + std::to_string(M) + "/N:" + std::to_string(N) + "/K:4096/threads:" +
                               std::to_string(threads);
      for (Int8Backend b : {Int8Backend::kAmx, Int8Backend::kVnni, Int8Backend::kOnednn, Int8Backend::kAvx2}) {
        benchmark::RegisterBenchmark(("gemm/s8/" + dims + "/" + std::string(gemm::to_string(b))).c_str(), bm_s8,
                                     Layout::kXtg, N, int64_t{4096}, b, threads, M)
            ->UseRealTime()->Unit(benchmark::kMillisecond);
      }
    }
  }
  benchmark::RegisterBenchmark("peak/avx2_fma_f32", bm_peak, kernels::peak::avx2::fma_f32_ymm)->UseRealTime();
  benchmark::RegisterBenchmark("peak/avx2_madd_s16", bm_peak, kernels::peak::avx2::madd_s16_ymm)->UseRealTime();
  benchmark::RegisterBenchmark("peak/avx2_maddubs_sign", bm_peak, kernels::peak::avx2::maddubs_sign_ymm)->UseRealTime();
  benchmark::RegisterBenchmark("peak/avx2_s8_tile_l2", bm_s8_tile)->UseRealTime();
  benchmark::RegisterBenchmark("peak/avx512_fma_f32", bm_peak_avx512, kernels::peak::avx512::fma_f32_zmm, "")->UseRealTime();
  benchmark::RegisterBenchmark("peak/avx512_vnni_s8", bm_peak_avx512, kernels::peak::avx512::dpbusd_zmm, "VNNI")
      ->UseRealTime();
  benchmark::RegisterBenchmark("peak/avx512_bf16_dot", bm_peak_avx512, kernels::peak::avx512::dpbf16_zmm, "BF16")
      ->UseRealTime();
  benchmark::RegisterBenchmark("peak/amx_int8", bm_peak_amx)->UseRealTime();
  benchmark::RegisterBenchmark("peak/amx_block_l1", bm_amx_block, 1)->UseRealTime();
  benchmark::RegisterBenchmark("peak/amx_block_l2", bm_amx_block, 64)->UseRealTime();
  return true;
}();

}  // namespace
}  // namespace s3r::bench
