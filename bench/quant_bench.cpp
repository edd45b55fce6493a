// Throughput of the quantizers: items/s = elements/s, bytes/s = the bytes a kernel must move.
//
//   grad_quant/DTYPE/MODE/stats:W/N:N/threads:P/ISA     s3r::quantize_gradient, T = 2048, S = 512
//     DTYPE  f32 | bf16 (the upstream gradient G)
//     MODE   rtne | sr | s3r | s3r-bcast
//     W      1 when the S3R-EC statistics are requested (want_stats), else 0
//     N      2048 | 8192 output channels (G is 16 | 64 MiB in f32)
//     ISA    avx512 | avx2 | ref (the scalar reference twin; f32 and N = 2048 only, to save
//            time)
//     bytes  G read twice (pass 1: absmax; pass 2: quantize) + the int8 codes written (twice
//            under sr: one code tensor per backward product)
//   grad_quant_l2/f32/MODE/stats:W/T:512/N:512/threads:P/ISA   (ISA: avx512 | avx2)
//                                       the same on a cache-resident G (T = S = N = 512, 1 MiB):
//                                       the compute cost alone
//   fwd_quant/rows/TxK/threads:P/ISA    s3r::quantize_rows_rtne, (2048, 2048); bytes: x read once
//                                       + codes written
//   fwd_quant/cols/KxN/threads:P/ISA    s3r::quantize_cols_rtne, (2048, 8192); bytes: w read
//                                       twice (column absmax, then codes) + codes written
//
// G holds heavy-tailed values (a normal times a log-normal scale), sx and sw positive scales,
// all from a fixed seed, generated once per process. One QuantizedGrad is reused across the
// iterations of a run (its buffers are allocated by an untimed first call), as in training.
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "bench_common.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/bf16.hpp"
#include "s3r/quant/forward_quant.hpp"
#include "s3r/quant/grad_quant.hpp"

namespace s3r::bench {
namespace {

constexpr int64_t kTokens = 2048;          // T
constexpr int64_t kTokensPerExample = 512;  // S (B = 4)
constexpr int64_t kMaxChannels = 8192;      // N; the N = 2048 problems use a prefix of G

// Inputs of every benchmark in this file, made once: G (T, 8192) f32 and bf16, sx (T), sw (8192).
// G with N < 8192 channels is the first T * N elements (a different, equally random matrix).
struct Inputs {
  AlignedVector<float> g;
  std::vector<bf16> g_bf16;
  AlignedVector<float> sx, sw;
};

const Inputs& inputs() {
  static const Inputs in = [] {
    Inputs r;
    std::mt19937_64 rng(20240601);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uniform(0.5f, 2.0f);
    r.g.resize(static_cast<size_t>(kTokens * kMaxChannels));
    for (float& v : r.g) v = 1e-3f * normal(rng) * std::exp(0.75f * normal(rng));
    r.g_bf16.resize(r.g.size());
    for (size_t i = 0; i < r.g.size(); ++i) r.g_bf16[i] = to_bf16(r.g[i]);
    r.sx.resize(kTokens);
    for (float& v : r.sx) v = uniform(rng) / 127.0f;
    r.sw.resize(kMaxChannels);
    for (float& v : r.sw) v = 0.02f * uniform(rng) / 127.0f;
    return r;
  }();
  return in;
}

template <typename G>
std::span<const G> g_prefix(int64_t tokens, int64_t channels) {
  const Inputs& in = inputs();
  const size_t n = static_cast<size_t>(tokens * channels);
  if constexpr (std::is_same_v<G, bf16>) {
    return std::span<const bf16>(in.g_bf16).first(n);
  } else {
    return std::span<const float>(in.g).first(n);
  }
}

template <typename G>
void bm_grad_quant(benchmark::State& state, GradRounding mode, bool stats, int64_t tokens,
                   int64_t channels, int threads, Isa isa) {
  if (!enter(state, isa, threads)) return;
  const ScopedIsa scoped(isa);
  const std::span<const G> g = g_prefix<G>(tokens, channels);
  const std::span<const float> sx = std::span<const float>(inputs().sx).first(tokens);
  const std::span<const float> sw = std::span<const float>(inputs().sw).first(channels);
  GradQuantConfig config;
  config.mode = mode;
  config.tokens_per_example = kTokensPerExample;
  config.layer_key = fold_in(fold_in(key_from_seed(1234), 7), 3);  // (seed, step 7, layer 3)
  config.want_stats = stats;
  QuantizedGrad out;
  quantize_gradient(out, g, tokens, channels, sx, sw, config);  // allocates out's buffers
  for (auto _ : state) {
    quantize_gradient(out, g, tokens, channels, sx, sw, config);
    benchmark::DoNotOptimize(out.step);
    benchmark::ClobberMemory();
  }
  const int64_t elements = tokens * channels;
  state.SetItemsProcessed(state.iterations() * elements);
  state.SetBytesProcessed(state.iterations() *
                          (2 * elements * static_cast<int64_t>(sizeof(G)) +
                           elements * quantization_count(mode)));
}

void bm_fwd_rows(benchmark::State& state, int64_t rows, int64_t cols, int threads, Isa isa) {
  if (!enter(state, isa, threads)) return;
  const ScopedIsa scoped(isa);
  const std::span<const float> x = std::span<const float>(inputs().g).first(rows * cols);
  std::vector<int8_t> codes(static_cast<size_t>(rows * cols));
  AlignedVector<float> scales(static_cast<size_t>(rows));
  quantize_rows_rtne(codes, scales, x, rows, cols, "x");
  for (auto _ : state) {
    quantize_rows_rtne(codes, scales, x, rows, cols, "x");
    benchmark::DoNotOptimize(codes.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * rows * cols);
  state.SetBytesProcessed(state.iterations() * rows * cols * 5);
}

void bm_fwd_cols(benchmark::State& state, int64_t rows, int64_t cols, int threads, Isa isa) {
  if (!enter(state, isa, threads)) return;
  const ScopedIsa scoped(isa);
  const std::span<const float> w = std::span<const float>(inputs().g).first(rows * cols);
  std::vector<int8_t> codes(static_cast<size_t>(rows * cols));
  AlignedVector<float> scales(static_cast<size_t>(cols));
  quantize_cols_rtne(codes, scales, w, rows, cols, "w");
  for (auto _ : state) {
    quantize_cols_rtne(codes, scales, w, rows, cols, "w");
    benchmark::DoNotOptimize(codes.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * rows * cols);
  state.SetBytesProcessed(state.iterations() * rows * cols * 9);
}

const bool registered = [] {
  const GradRounding kModes[] = {GradRounding::kRtne, GradRounding::kSr, GradRounding::kS3r,
                                 GradRounding::kS3rBcast};
  for (Isa isa : kIsas) {
    for (const char* dtype : {"f32", "bf16"}) {
      const bool f32 = std::string(dtype) == "f32";
      if (isa == Isa::kReference && !f32) continue;
      for (int64_t n : {int64_t{2048}, int64_t{8192}}) {
        if (isa == Isa::kReference && n != 2048) continue;
        for (int t : thread_counts()) {
          for (bool stats : {false, true}) {
            for (GradRounding mode : kModes) {
              const std::string name = std::string("grad_quant/") + dtype + "/" +
                                       std::string(to_string(mode)) +
                                       "/stats:" + (stats ? "1" : "0") + "/N:" + std::to_string(n) +
                                       "/threads:" + std::to_string(t) + "/" + isa_label(isa);
              benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
                if (f32) {
                  bm_grad_quant<float>(s, mode, stats, kTokens, n, t, isa);
                } else {
                  bm_grad_quant<bf16>(s, mode, stats, kTokens, n, t, isa);
                }
              })->UseRealTime();
            }
          }
        }
      }
    }
  }
  // Cache-resident problem (G is 1 MiB, half of one core's L2 here): the compute cost alone.
  for (Isa isa : kIsas) {
    if (isa == Isa::kReference) continue;
    for (int t : thread_counts()) {
      for (bool stats : {false, true}) {
        for (GradRounding mode : kModes) {
          const std::string name = std::string("grad_quant_l2/f32/") +
                                   std::string(to_string(mode)) + "/stats:" + (stats ? "1" : "0") +
                                   "/T:512/N:512/threads:" + std::to_string(t) + "/" +
                                   isa_label(isa);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
            bm_grad_quant<float>(s, mode, stats, 512, 512, t, isa);
          })->UseRealTime();
        }
      }
    }
  }
  for (Isa isa : kIsas) {
    for (int t : thread_counts()) {
      const std::string suffix = "/threads:" + std::to_string(t) + "/" + isa_label(isa);
      benchmark::RegisterBenchmark(("fwd_quant/rows/2048x2048" + suffix).c_str(),
                                   [=](benchmark::State& s) { bm_fwd_rows(s, 2048, 2048, t, isa); })
          ->UseRealTime();
      benchmark::RegisterBenchmark(("fwd_quant/cols/2048x8192" + suffix).c_str(),
                                   [=](benchmark::State& s) { bm_fwd_cols(s, 2048, 8192, t, isa); })
          ->UseRealTime();
    }
  }
  return true;
}();

}  // namespace
}  // namespace s3r::bench
