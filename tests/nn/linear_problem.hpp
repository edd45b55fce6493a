#pragma once
// Test library of the quantized linear layer (s3r/nn/quant_linear.hpp), part 1 of 3: a layer's
// inputs, and the bit-defined steps of docs/SPEC.md sections 1-3 (and its appendix) recomputed
// with the layer's own f32 operations, so that a test can hold the layer's scales, codes and
// thresholds against them bit for bit. Everything is deterministic: a function of its arguments.
// Part 2 (linear_reference.hpp): the double-precision reference and the f32 error bounds.
// Part 3 (linear_rounding_model.hpp): the exact distribution of the rounding errors.
//
// Layout: every tensor is row-major; X (T, K), W (K, N), G (T, N), T tokens in examples of S.
#include <cstdint>
#include <string>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/nn/linear_mode.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r::nn::testing {

// One layer's inputs: X (T, K), W (K, N), G (T, N), row-major; S tokens per example (S divides
// T; a test may change S of a built problem).
struct Problem {
  int64_t T = 0, K = 0, N = 0, S = 0;
  AlignedVector<float> x, w, g;
  int64_t B() const { return T / S; }  // examples
  std::string shape() const;           // "T=.. K=.. N=.. S=..", for failure messages
};

// A uniform f32 in [-1, 1): the top 23 bits of random_bits32(key, i) on the 2^-23 grid of
// [0, 1), times 2, minus 1 (both steps exact).
float sym_uniform(Key key, uint64_t i);

// Magnitudes over several binades, both signs: |X| up to 100 2^-(t % 4) (no token dominates D),
// |W| up to 0.05 (1 + n % 3), |G| up to 4^-(n % 5); X row 5 and W column 3 are exactly zero
// (scale 1, codes 0) where T > 5 and N > 3, and with zero_g G is all zero (D == 0). Draws from
// key_from_seed(seed).
Problem make_problem(int64_t T, int64_t K, int64_t N, int64_t S, uint32_t seed, bool zero_g);

// The fixed layer of the variance story (T 32, K 48, N 128, S 8, seed 4242): weight rows that
// share a component, W[k, n] = mu_k + 0.1 noise with |mu_k| in [0.5, 1) of either sign (so
// rowsum(Wq)[k] is large); activations X[t, k] = nu_k + noise with a per-feature component
// common to all tokens (as outlier features of LLMs have); near-Gaussian gradients (a sum of
// three uniforms) with token scales 1/3, 2/3, 1, so that x = G'/D covers many residuals.
Problem shared_component_problem();

// The layer key of (seed, step, layer): fold_in(fold_in(key_from_seed(seed), step), layer).
Key make_layer_key(uint32_t seed, uint32_t step, uint32_t layer);

// Forward operands (SPEC 1).
struct Operands {
  std::vector<int8_t> xq, wq;   // (T, K), (K, N)
  AlignedVector<float> sx, sw;    // (T), (N)
  std::vector<int64_t> rowsum;  // (K) sum_n Wq[k, n], exact
};

// absmax / 127 in f32 (one rounding); an all-zero row or column gets scale 1 (its codes are
// then 0).
float absmax_scale(float absmax);

// rne(v) clamped to [-127, 127]; std::nearbyint rounds to nearest even in the default mode.
int8_t rne_code(float v);

// SPEC 1: per token sx = absmax_scale(max_k |X|), Xq = rne_code(X / sx) (f32 division); per
// column sw and Wq likewise; rowsum of Wq in int64.
Operands forward_operands(const Problem& p);

// Thresholds (SPEC 2). sr: the 23-bit uniform of word i, (random_bits32(key, i) >> 9) 2^-23.
// 7-bit: threshold i is byte i % 4 of word i / 4, r = (k + 0.5) / 128 with k the byte's top 7
// bits (threshold_7bit_of_index(k), k in [0, 128)). All exact in f32, in [0, 1).
float threshold_sr(Key key, uint64_t i);
float threshold_7bit_of_index(uint32_t k);
float threshold_7bit(Key key, uint64_t i);

// Q = floor(x + r): one f32 addition, floor, clamp to [-127, 127].
int8_t floor_code(float x, float r);

// The backward quantization (SPEC 1-3): G' = (sx G) sw in f32, D = max|G'| / 127, x = G' / D.
struct GradCodes {
  float D = 0.0f;
  AlignedVector<float> xs;     // (T, N) x = G'/D in f32; 0 when D == 0
  int count = 1;             // 2 under sr
  std::vector<int8_t> q[2];  // (T, N) codes for dX ([0]) and for dW ([count - 1])
};

// D, x and the codes that the layer forms in `mode` (an int8 mode) under `layer_key`, bit for
// bit: rtne rne_code(x); sr floor_code(x, threshold_sr) with keys fold_in(layer_key, 0) and
// fold_in(layer_key, 1) for the two code tensors, element index t N + n; s3r the 7-bit
// threshold of token t, s3r-bcast that of example t / S, both of fold_in(layer_key, 0). With
// D == 0 (G == 0) every x and code is 0. D and x do not depend on the key.
GradCodes grad_codes(const Problem& p, const Operands& o, LinearMode mode, Key layer_key);

}  // namespace s3r::nn::testing
