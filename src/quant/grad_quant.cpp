// Driver of the fused backward quantizer: argument checks, the two passes over G threaded over
// fixed blocks of tokens, and the reduction of the per-block error sums into the S3R-EC
// statistics. Blocks never straddle two examples and never depend on the thread count, so every
// output is bit-identical for any number of threads.
#include "s3r/quant/grad_quant.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "core/parallel_blocks.hpp"
#include "kernels/dispatch.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/work.hpp"

namespace s3r {

std::string_view to_string(GradRounding mode) {
  switch (mode) {
    case GradRounding::kRtne: return "rtne";
    case GradRounding::kSr: return "sr";
    case GradRounding::kS3r: return "s3r";
    case GradRounding::kS3rBcast: return "s3r-bcast";
  }
  return "?";
}

GradRounding parse_grad_rounding(std::string_view name) {
  for (GradRounding m : {GradRounding::kRtne, GradRounding::kSr, GradRounding::kS3r,
                         GradRounding::kS3rBcast}) {
    if (name == to_string(m)) return m;
  }
  throw Error("unknown gradient rounding mode '" + std::string(name) +
              "'; expected one of: rtne, sr, s3r, s3r-bcast");
}

namespace {

constexpr int64_t kRowBlock = 32;  // tokens per task of both passes

// The example-aligned blocking: blocks of up to kRowBlock rows that never straddle two
// examples; example b's blocks are [first[b], first[b + 1]).
struct RowBlocks {
  std::vector<int64_t> row0, row1, first;
  int64_t count = 0;
  // Examples of S tokens each, or the ragged examples' offsets.
  RowBlocks(int64_t tokens, int64_t S, const RaggedRows& ragged) {
    const int64_t B = ragged.empty() ? tokens / S : ragged.examples();
    first.reserve(static_cast<size_t>(B + 1));
    for (int64_t b = 0; b < B; ++b) {
      first.push_back(count);
      const int64_t r_end = ragged.empty() ? (b + 1) * S : ragged.example_offsets[b + 1];
      for (int64_t r = ragged.empty() ? b * S : ragged.example_offsets[b]; r < r_end; r += kRowBlock, ++count) {
        row0.push_back(r);
        row1.push_back(std::min(r + kRowBlock, r_end));
      }
    }
    first.push_back(count);
  }
  int64_t begin(int64_t k) const { return row0[k]; }
  int64_t end(int64_t k) const { return row1[k]; }
};

// Why `ragged` cannot describe T rows, or empty.
std::string ragged_problem(const RaggedRows& ragged, int64_t tokens) {
  std::ostringstream msg;
  const auto& off = ragged.example_offsets;
  if (ragged.ids.size() != static_cast<size_t>(tokens)) {
    msg << "ragged rows have " << ragged.ids.size() << " ids, expected one per row, T = " << tokens;
  } else if (off.size() < 2 || off.front() != 0 || off.back() != tokens) {
    msg << "ragged example offsets must run from 0 to T = " << tokens << " (B + 1 >= 2 of them)";
  } else if (ragged.ids_per_example == 0) {
    msg << "ragged rows need ids_per_example > 0";
  } else {
    for (size_t b = 1; b < off.size(); ++b) {
      if (off[b] < off[b - 1]) {
        msg << "ragged example offsets decrease at example " << b - 1;
        break;
      }
    }
  }
  return msg.str();
}

template <typename T>
void validate(std::span<const T> g, int64_t tokens, int64_t channels, std::span<const float> sx,
              std::span<const float> sw, const GradQuantConfig& config) {
  std::ostringstream msg;
  msg << "quantize_gradient: ";
  const int64_t S = config.tokens_per_example;
  if (tokens < 1 || channels < 1) {
    msg << "G must have at least one token and one channel, got T x N = " << tokens << " x "
        << channels;
  } else if (g.size() != static_cast<size_t>(tokens * channels)) {
    msg << "G has " << g.size() << " elements, expected T x N = " << tokens << " x " << channels
        << " = " << tokens * channels;
  } else if (sx.size() != static_cast<size_t>(tokens)) {
    msg << "sx has " << sx.size() << " elements, expected one per token, T = " << tokens;
  } else if (sw.size() != static_cast<size_t>(channels)) {
    msg << "sw has " << sw.size() << " elements, expected one per channel, N = " << channels;
  } else if (!config.ragged.empty()) {
    if (const std::string why = ragged_problem(config.ragged, tokens); !why.empty()) msg << why;
  } else if (S < 1) {
    msg << "tokens_per_example S must be >= 1, got " << S;
  } else if (config.first_token % static_cast<uint64_t>(S) != 0) {
    msg << "first_token = " << config.first_token << " is not a multiple of S = " << S
        << " (a rank's or micro-batch's rows start at an example)";
  } else if (tokens % S != 0) {
    msg << "T = " << tokens << " tokens is not a multiple of the example length S = " << S
        << " (T must be B*S)";
  }
  if (msg.str().size() == std::string_view("quantize_gradient: ").size()) {
    for (const auto& [name, v] : {std::pair{"sx", sx}, std::pair{"sw", sw}}) {
      for (size_t i = 0; i < v.size(); ++i) {
        if (!(std::isfinite(v[i]) && v[i] > 0.0f)) {
          msg << name << "[" << i << "] = " << v[i]
              << " is not a positive finite scale (the forward quantizers give scale > 0)";
          throw Error(msg.str());
        }
      }
    }
    return;
  }
  throw Error(msg.str());
}

template <typename T>
[[noreturn]] void throw_nonfinite(std::span<const T> g, int64_t channels) {
  for (size_t i = 0; i < g.size(); ++i) {
    float v;
    if constexpr (std::is_same_v<T, bf16>) {
      v = to_float(g[i]);
    } else {
      v = g[i];
    }
    if (!std::isfinite(v)) {
      std::ostringstream msg;
      msg << "quantize_gradient: G[" << static_cast<int64_t>(i) / channels << ", "
          << static_cast<int64_t>(i) % channels << "] = " << v
          << " is not finite; the step's gradient cannot be quantized";
      throw NonFiniteGradient(msg.str());
    }
  }
  throw NonFiniteGradient("quantize_gradient: G holds a non-finite value");
}

// The kernels' description of one quantization of G (T, N) with the config's rounding.
template <typename T>
kernels::GradProblem problem_of(std::span<const T> g, int64_t tokens, int64_t channels, std::span<const float> sx,
                                std::span<const float> sw, int64_t S, int count, const GradQuantConfig& config) {
  kernels::GradProblem p;
  if constexpr (std::is_same_v<T, bf16>) {
    p.g_bf16 = g.data();
  } else {
    p.g_f32 = g.data();
  }
  p.sx = sx.data();
  p.sw = sw.data();
  p.tokens = tokens;
  p.channels = channels;
  p.tokens_per_example = S;
  p.first_token = config.first_token;
  if (!config.ragged.empty()) {
    p.row_ids = config.ragged.ids.data();
    p.ids_per_example = config.ragged.ids_per_example;
  }
  p.mode = config.mode;
  p.count = count;
  p.keys[0] = fold_in(config.layer_key, 0);
  p.keys[1] = fold_in(config.layer_key, 1);
  return p;
}

// Pass 1: the per-tensor step D = max |G'| / 127 over this process's rows, or over the group's
// (one max all-reduce that also carries "some rank saw NaN/Inf", so that every rank skips the
// step together; SPEC section 6). Throws on a non-finite G or an overflowing G'.
template <typename T>
float tensor_step(const kernels::GradProblem& p, const RowBlocks& blocks, std::span<const T> g,
                  const GradQuantConfig& config) {
  const auto& k = kernels::active_kernels();
  // max is exact, so the reduction order does not matter.
  float absmax = config.absmax != nullptr ? config.absmax->value : 0.0f;
  bool nonfinite = config.absmax != nullptr && config.absmax->nonfinite;
  if (config.absmax == nullptr) {
    // Raw OpenMP: a max and an or reduction over per-thread accumulators (exact in any grouping).
#pragma omp parallel for schedule(static) reduction(max : absmax) reduction(|| : nonfinite)
    for (int64_t b = 0; b < blocks.count; ++b) {
      bool bad = false;
      absmax = std::max(absmax, k.grad_absmax(p, blocks.begin(b), blocks.end(b), &bad));
      nonfinite = nonfinite || bad;
    }
  }
  if (config.group != nullptr && config.group->size() > 1) {
    AlignedVector<float> v{nonfinite ? 1.0f : 0.0f, nonfinite ? 0.0f : absmax};  // never NaN into MPI_MAX
    config.group->max(v);
    if (v[0] > 0.0f && !nonfinite) {
      throw NonFiniteGradient("quantize_gradient: another rank's share of G holds a non-finite value");
    }
    absmax = v[1];
  }
  if (nonfinite) throw_nonfinite(g, p.channels);
  if (!std::isfinite(absmax)) {
    std::ostringstream msg;
    msg << "quantize_gradient: G' = sx * G * sw overflows f32 (T x N = " << p.tokens << " x "
        << p.channels << "); the gradient or the forward scales are out of range";
    throw Error(msg.str());
  }
  return absmax / 127.0f;
}

// The statistics from pass 2's sums, reduced in double in a fixed order: E = D * (Q - x). Row
// sums sit in token_mean, block column sums in out.workspace (col_part_size floats per quantization).
void reduce_error_sums(QuantizedGrad& out, const RowBlocks& blocks, int64_t B, size_t col_part_size) {
  const double D = out.step;
  const int64_t tokens = out.tokens, channels = out.channels;
  for (int q = 0; q < out.count; ++q) {
    ErrorStats& st = out.stats[q];
    const float* part = out.workspace.data() + q * col_part_size;
    parallel_blocks(B, 1, [&](int64_t e, int64_t) {
      const int64_t r0 = blocks.first[e] < blocks.count ? blocks.begin(blocks.first[e]) : tokens;
      const int64_t rows = blocks.first[e + 1] > blocks.first[e] ? blocks.end(blocks.first[e + 1] - 1) - r0 : 0;
      // An example without rows (ragged) has means 0 (and these divisions are those of S rows).
      const double divisor = rows > 0 ? static_cast<double>(rows) : 1.0;
      double total = 0.0;
      for (int64_t t = r0; t < r0 + rows; ++t) {
        total += st.token_mean[t];
        st.token_mean[t] = static_cast<float>(D * st.token_mean[t] / static_cast<double>(channels));
      }
      st.grand_mean[e] = static_cast<float>(D * total / (divisor * static_cast<double>(channels)));
      for (int64_t n = 0; n < channels; ++n) {
        double sum = 0.0;
        for (int64_t j = blocks.first[e]; j < blocks.first[e + 1]; ++j) sum += part[j * channels + n];
        st.channel_mean[e * channels + n] = static_cast<float>(D * sum / divisor);
      }
    });
  }
}

template <typename T>
void quantize_gradient_impl(QuantizedGrad& out, std::span<const T> g, int64_t tokens,
                            int64_t channels, std::span<const float> sx,
                            std::span<const float> sw, const GradQuantConfig& config) {
  validate(g, tokens, channels, sx, sw, config);
  const RaggedRows& ragged = config.ragged;
  const int64_t S = ragged.empty() ? config.tokens_per_example : 0;
  const int64_t B = ragged.empty() ? tokens / S : ragged.examples();
  const int count = quantization_count(config.mode);
  const kernels::GradProblem p = problem_of(g, tokens, channels, sx, sw, S, count, config);
  // G read twice (its maximum, unless its writer took it, then the codes), `count` code arrays
  // written
  const uint64_t g_reads = config.absmax != nullptr ? 1 : 2;
  work::add_bytes(static_cast<uint64_t>(tokens * channels) * (g_reads * sizeof(T) + count));

  out.mode = config.mode;
  out.tokens = tokens;
  out.channels = channels;
  out.tokens_per_example = S;
  out.example_count = B;
  out.count = count;
  for (int q = 0; q < 2; ++q) {
    const bool used = q < count;
    out.codes[q].resize(used ? static_cast<size_t>(tokens * channels) : 0);
    ErrorStats& st = out.stats[q];
    const bool stats = used && config.want_stats;
    st.token_mean.resize(stats ? static_cast<size_t>(tokens) : 0);
    st.channel_mean.resize(stats ? static_cast<size_t>(B * channels) : 0);
    st.grand_mean.resize(stats ? static_cast<size_t>(B) : 0);
  }

  const RowBlocks blocks(tokens, S, ragged);
  const float step = tensor_step(p, blocks, g, config);
  out.step = step;
  if (step == 0.0f) {  // G' == 0 (or so small that D underflows): all codes and errors are 0
    for (int q = 0; q < 2; ++q) {
      std::fill(out.codes[q].begin(), out.codes[q].end(), int8_t{0});
      std::fill(out.stats[q].token_mean.begin(), out.stats[q].token_mean.end(), 0.0f);
      std::fill(out.stats[q].channel_mean.begin(), out.stats[q].channel_mean.end(), 0.0f);
      std::fill(out.stats[q].grand_mean.begin(), out.stats[q].grand_mean.end(), 0.0f);
    }
    return;
  }

  // Pass 2: codes, and per-row / per-block error sums in units of D (row sums go straight into
  // token_mean and are scaled by reduce_error_sums; block column sums into the reusable workspace).
  const bool stats = config.want_stats;
  const size_t col_part_size = static_cast<size_t>(blocks.count * channels);
  if (stats) out.workspace.resize(col_part_size * static_cast<size_t>(count));
  const auto& k = kernels::active_kernels();
  parallel_blocks(blocks.count, 1, [&](int64_t b, int64_t) {
    kernels::GradBlockOut bo;
    for (int q = 0; q < count; ++q) {
      bo.codes[q] = out.codes[q].data();
      if (stats) {
        bo.row_sums[q] = out.stats[q].token_mean.data();
        bo.col_sums[q] = out.workspace.data() + q * col_part_size + b * channels;
      }
    }
    k.grad_quantize(p, step, blocks.begin(b), blocks.end(b), bo);
  });
  if (stats) reduce_error_sums(out, blocks, B, col_part_size);
}

}  // namespace

void quantize_gradient(QuantizedGrad& out, std::span<const float> g, int64_t tokens,
                       int64_t channels, std::span<const float> sx, std::span<const float> sw,
                       const GradQuantConfig& config) {
  quantize_gradient_impl(out, g, tokens, channels, sx, sw, config);
}

void quantize_gradient(QuantizedGrad& out, std::span<const bf16> g, int64_t tokens,
                       int64_t channels, std::span<const float> sx, std::span<const float> sw,
                       const GradQuantConfig& config) {
  quantize_gradient_impl(out, g, tokens, channels, sx, sw, config);
}

GradAbsMax grad_absmax_rows(std::span<const float> g, int64_t channels, std::span<const float> sx,
                            std::span<const float> sw, int64_t t0, int64_t t1) {
  if (t0 < 0 || t1 < t0 || channels < 0 || static_cast<int64_t>(sx.size()) < t1 ||
      static_cast<int64_t>(sw.size()) < channels ||
      static_cast<int64_t>(g.size()) < t1 * channels) {
    throw Error("grad_absmax_rows: rows [" + std::to_string(t0) + ", " + std::to_string(t1) +
                ") of " + std::to_string(channels) + " channels do not fit G (" +
                std::to_string(g.size()) + " values), sx (" + std::to_string(sx.size()) +
                ") or sw (" + std::to_string(sw.size()) + ")");
  }
  kernels::GradProblem p;  // what tensor_step's kernel reads of it
  p.g_f32 = g.data();
  p.sx = sx.data();
  p.sw = sw.data();
  p.channels = channels;
  GradAbsMax out;
  out.value = kernels::active_kernels().grad_absmax(p, t0, t1, &out.nonfinite);
  return out;
}

}  // namespace s3r
