// Causal attention, forward and backward: the fused kernels (s3r/model/attention.hpp) against the
// two-pass attention of s3r/model/layers.hpp (oneDNN f32 products, (B, NH, S, S) probabilities).
//
//   attention/SHAPE/two_pass/fwd|bwd/threads:P          attention_forward / attention_backward
//   attention/SHAPE/flash/fwd|bwd/threads:P/ISA         flash_attention_forward / _backward
//     SHAPE  small: B=16 S=256 NH=4 HD=64 (the `small` preset's attention)
//            small_gqa: small with NKV=2 kv heads (grouped-query attention; flash only)
//            s64:   B=16 S=64  NH=4 HD=64
//            tiny:  B=4  S=32  NH=4 HD=16 (the `tiny` preset's)
//     ISA    avx512 | avx2 | ref (the scalar reference twin: s64 and tiny only)
//   items/s = query rows (B NH S) per second.
//
// Inputs ~ N(0, 1) from a fixed seed; the backward's saved statistics (probs, or out and lse)
// come from one untimed forward. Buffers are allocated once per benchmark, outside the loop.
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/model/attention.hpp"
#include "s3r/model/layers.hpp"

namespace s3r::bench {
namespace {

struct Shape {
  const char* name;
  int64_t B, S, NH, NKV, HD;
  size_t acts() const { return static_cast<size_t>(B * S * NH * HD); }     // q, out: (T, NH HD)
  size_t kv_acts() const { return static_cast<size_t>(B * S * NKV * HD); }  // k, v: (T, NKV HD)
  size_t rows() const { return static_cast<size_t>(B * NH * S); }
};

constexpr Shape kShapes[] = {{"small", 16, 256, 4, 4, 64},
                             {"small_gqa", 16, 256, 4, 2, 64},
                             {"s64", 16, 64, 4, 4, 64},
                             {"tiny", 4, 32, 4, 4, 16}};

AlignedVector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  AlignedVector<float> v(n);
  for (auto& x : v) x = normal(gen);
  return v;
}

struct Buffers {
  AlignedVector<float> q, k, v, dout, out, lse, probs, dq, dk, dv;
  explicit Buffers(const Shape& s)
      : q(random_vec(s.acts(), 1)),
        k(random_vec(s.kv_acts(), 2)),
        v(random_vec(s.kv_acts(), 3)),
        dout(random_vec(s.acts(), 4)),
        out(s.acts()),
        lse(s.rows()),
        dq(s.acts()),
        dk(s.kv_acts()),
        dv(s.kv_acts()) {}
};

void bm_two_pass(benchmark::State& state, const Shape& s, bool backward, int threads) {
  if (!enter(state, Isa::kReference, threads)) return;
  Buffers b(s);
  b.probs.resize(s.rows() * static_cast<size_t>(s.S));
  model::attention_forward(b.out, b.probs, b.q, b.k, b.v, s.S, s.NH, s.HD);
  for (auto _ : state) {
    if (backward) {
      model::attention_backward(b.dq, b.dk, b.dv, b.dout, b.q, b.k, b.v, b.probs, s.S, s.NH, s.HD);
    } else {
      model::attention_forward(b.out, b.probs, b.q, b.k, b.v, s.S, s.NH, s.HD);
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(s.rows()));
}

void bm_flash(benchmark::State& state, const Shape& s, bool backward, int threads, Isa isa) {
  if (!enter(state, isa, threads)) return;
  const ScopedIsa scoped(isa);
  Buffers b(s);
  model::flash_attention_forward(b.out, b.lse, b.q, b.k, b.v, s.S, s.NH, s.NKV, s.HD);
  for (auto _ : state) {
    if (backward) {
      model::flash_attention_backward(b.dq, b.dk, b.dv, b.dout, b.out, b.q, b.k, b.v, b.lse, s.S,
                                      s.NH, s.NKV, s.HD);
    } else {
      model::flash_attention_forward(b.out, b.lse, b.q, b.k, b.v, s.S, s.NH, s.NKV, s.HD);
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(s.rows()));
}

const bool registered = [] {
  for (const Shape& s : kShapes) {
    for (int t : thread_counts()) {
      for (bool bwd : {false, true}) {
        const std::string base = std::string("attention/") + s.name;
        const std::string pass = bwd ? "/bwd" : "/fwd";
        const std::string threads = "/threads:" + std::to_string(t);
        if (s.NKV == s.NH) {  // (layers.hpp's two-pass attention has no kv heads)
          benchmark::RegisterBenchmark((base + "/two_pass" + pass + threads).c_str(),
                                       [=](benchmark::State& st) { bm_two_pass(st, s, bwd, t); })
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
        for (Isa isa : kIsas) {
          if (isa == Isa::kReference && s.S > 64) continue;
          benchmark::RegisterBenchmark(
              (base + "/flash" + pass + threads + "/" + isa_label(isa)).c_str(),
              [=](benchmark::State& st) { bm_flash(st, s, bwd, t, isa); })
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
  return true;
}();

}  // namespace
}  // namespace s3r::bench
