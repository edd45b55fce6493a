#pragma once
// The fused backward quantizer (SPEC sections 1, 2 and 4): one operation that folds the forward
// scales into the upstream gradient, finds the per-tensor step, rounds to int8 codes in the
// chosen mode and, on request, returns the rounding-error statistics that S3R-EC needs.
//
//   G'[t,n] = (sx[t] * G[t,n]) * sw[n]                      (f32, in this order)
//   D       = max |G'| / 127                                 (one step per tensor)
//   x       = G'[t,n] / D,   Q[t,n] = round(x) in [-127, 127]
//   E       = D*Q - G'       (statistics are computed as D * (Q - x), x rounded to f32)
//
// Rounding per mode (threshold r in [0,1), Q = floor(x + r) in f32; rtne: Q = rne(x)):
//   rtne       no randomness; one code tensor for both backward products
//   sr         r = uniform23(bits32(k_p, t*N + n)) per element and per product p in {0 (dX), 1 (dW)};
//              two code tensors
//   s3r        r = threshold7(k_0, t): one 7-bit threshold per token, shared by its N channels
//   s3r-bcast  r = threshold7(k_0, t / S): one 7-bit threshold per example
// with k_p = fold_in(layer_key, p) (SPEC section 3: the caller passes
// fold_in(fold_in(key(seed), step), layer_index)). Token t is the global token index b*S + s
// (config.first_token + the row).
//
// Implementation: two passes over G (absmax, unless G's writer took it: GradAbsMax; then
// quantize + statistics), thresholds made in registers from the Threefry words (no full-size
// random or threshold tensor is written), OpenMP-threaded over fixed blocks of tokens. Codes and
// D are bit-identical for every ISA and thread count; the statistics are bit-identical for every
// thread count and agree between the reference and the vectorized tiers to a few f32 rounding
// errors (see tests/quant).
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/bf16.hpp"
#include "s3r/core/error.hpp"
#include "s3r/dist/communicator.hpp"
#include "s3r/quant/grad_rounding.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r {

// "rtne" | "sr" | "s3r" | "s3r-bcast".
std::string_view to_string(GradRounding mode);
// Parses the names above; throws s3r::Error listing the valid names otherwise.
GradRounding parse_grad_rounding(std::string_view name);
// Code tensors a mode produces: 2 for sr (one per backward product), 1 otherwise.
constexpr int quantization_count(GradRounding mode) { return mode == GradRounding::kSr ? 2 : 1; }

// Thrown when G holds NaN or +-Inf: the trainer skips (or stops) the step, loudly.
class NonFiniteGradient : public NonFiniteError {
 public:
  using NonFiniteError::NonFiniteError;
};

// Rows that are not B consecutive examples of S tokens: a mixture of experts' rows of one
// expert, sorted by expert (s3r/nn/moe.hpp). Row t's thresholds and sr bits use the global id
// ids[t] (its place in the unsorted (token, slot) order, so they do not depend on routing or
// ranks), s3r-bcast's the example id ids[t] / ids_per_example; the rows of example b are
// [example_offsets[b], example_offsets[b + 1]) (B + 1 nondecreasing offsets from 0 to T; an
// example may have none), and S3R-EC's channel and grand means are over those rows (0 when none).
struct RaggedRows {
  std::span<const uint64_t> ids;             // (T)
  std::span<const int64_t> example_offsets;  // (B + 1)
  uint64_t ids_per_example = 0;
  bool empty() const { return example_offsets.empty(); }
  int64_t examples() const { return empty() ? 0 : static_cast<int64_t>(example_offsets.size()) - 1; }
};

// Pass 1 of quantize_gradient (the maximum of |G'| over G's rows, and whether a G value is NaN
// or +-Inf), taken by the code that writes G while G's rows are still in its caches; the
// quantizer then reads G once instead of twice (GradQuantConfig::absmax). It is the same kernel
// on the same G', and a maximum is exact in any order, so D is the same bits either way.
struct GradAbsMax {
  float value = 0.0f;      // max |(sx[t] * G[t,n]) * sw[n]| over the rows taken
  bool nonfinite = false;  // some G value of those rows is NaN or +-Inf
  void add(const GradAbsMax& o) {
    value = o.value > value ? o.value : value;
    nonfinite = nonfinite || o.nonfinite;
  }
};
// Rows [t0, t1) of G (rows of `channels` floats, row-major), with sx and sw as quantize_gradient
// will be given them. Safe to call from several threads at once.
GradAbsMax grad_absmax_rows(std::span<const float> g, int64_t channels, std::span<const float> sx,
                            std::span<const float> sw, int64_t t0, int64_t t1);

struct GradQuantConfig {
  GradRounding mode = GradRounding::kS3r;
  int64_t tokens_per_example = 0;  // S; T = B*S must be a multiple of it
  Key layer_key{};                 // products use fold_in(layer_key, 0) and fold_in(layer_key, 1)
  bool want_stats = false;         // compute the S3R-EC statistics
  // Data parallel (SPEC section 6): G holds rows [first_token, first_token + T) of the global
  // batch (first_token a multiple of S), so thresholds and sr bits use the global token index;
  // D is the max over every rank of `group` (one max all-reduce). nullptr: one process.
  uint64_t first_token = 0;
  dist::Communicator* group = nullptr;
  RaggedRows ragged{};  // non-empty: rows and examples as RaggedRows says (S, first_token unused)
  // Pass 1 over every row of G already taken (grad_absmax_rows, added over all of them), or
  // nullptr: quantize_gradient takes it.
  const GradAbsMax* absmax = nullptr;
};

// Mean rounding errors of one quantization (SPEC section 4), in gradient units (times D).
struct ErrorStats {
  AlignedVector<float> token_mean;    // c: (T)      c[t]   = (1/N) sum_n E[t,n]
  AlignedVector<float> channel_mean;  // a: (B, N)   a[b,n] = (1/S) sum_s E[b*S+s,n]
  AlignedVector<float> grand_mean;    // m: (B)      m[b]   = (1/(S*N)) sum_{s,n} E[b*S+s,n]
  // (with RaggedRows: means over the rows of example b instead of its S tokens)
};

struct QuantizedGrad {
  GradRounding mode = GradRounding::kS3r;
  int64_t tokens = 0;              // T
  int64_t channels = 0;            // N
  int64_t tokens_per_example = 0;  // S (0 with ragged rows)
  int64_t example_count = 0;       // B (= T / S unless ragged)
  float step = 0.0f;               // D; 0 when G' is all zero (then every code and mean is 0)
  int count = 1;                   // quantization_count(mode)
  AlignedVector<int8_t> codes[2];  // (T, N) int8 row-major (64-byte aligned); [1] only under sr
  ErrorStats stats[2];             // filled when want_stats; [1] only under sr
  AlignedVector<float> workspace;    // internal: per-block column error sums, reused across calls

  int64_t examples() const { return example_count; }
  // The codes (and their statistics) that feed dX = D/sx * Q Wq^T and dW = D/sw * Xq^T Q.
  const AlignedVector<int8_t>& codes_for_dx() const { return codes[0]; }
  const AlignedVector<int8_t>& codes_for_dw() const { return codes[count - 1]; }
  const ErrorStats& stats_for_dx() const { return stats[0]; }
  const ErrorStats& stats_for_dw() const { return stats[count - 1]; }
};

// g: (T, N) row-major, f32 or bf16. sx: (T) f32 > 0, sw: (N) f32 > 0 (the forward scales).
// Resizes `out`'s buffers (reusing their capacity) and fills them. Throws s3r::Error on
// mismatched sizes, S <= 0 or T % S != 0, non-positive or non-finite scales, or a G' that
// overflows f32; NonFiniteGradient on NaN/Inf in G. The ISA comes from active_isa().
void quantize_gradient(QuantizedGrad& out, std::span<const float> g, int64_t tokens,
                       int64_t channels, std::span<const float> sx, std::span<const float> sw,
                       const GradQuantConfig& config);
void quantize_gradient(QuantizedGrad& out, std::span<const bf16> g, int64_t tokens,
                       int64_t channels, std::span<const float> sx, std::span<const float> sw,
                       const GradQuantConfig& config);

}  // namespace s3r
