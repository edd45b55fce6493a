// Non-GEMM decoder layers, f32 with double accumulation where sums are long; see layers.hpp.
#include "s3r/model/layers.hpp"

#include "s3r/dist/tree_sum.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/parallel_blocks.hpp"
#include "kernels/dispatch.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/work.hpp"
#include "s3r/gemm/matmul.hpp"

namespace s3r::model {

namespace {

void expect_multiple(const char* fn, const char* what, size_t size, int64_t unit) {
  if (unit <= 0 || size % static_cast<size_t>(unit) != 0) {
    std::ostringstream msg;
    msg << fn << ": " << what << " has " << size << " elements, not a multiple of " << unit;
    throw Error(msg.str());
  }
}

// Every id in [0, vocab), or an error naming the function, the id and its position.
void check_ids(const char* fn, const char* what, std::span<const int32_t> ids, int64_t vocab) {
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0 || ids[t] >= vocab) {
      throw Error(std::string(fn) + ": " + what + " " + std::to_string(ids[t]) + " at position " +
                  std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
}

// Rows per RMSNorm kernel call (a fixed split: results never depend on the thread count).
constexpr int64_t kNormRows = 16;

// Angle step of pair i: theta^(-2i/HD), in double (positions up to S are exact in float).
double rope_frequency(int64_t pair, int64_t head_dim, float theta) {
  return std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(pair) / head_dim);
}

// The rotation table of (S, HD, theta, sign): (cos, sin) of pair i at position s, S x HD/2 pairs,
// each angle sign * s * theta^(-2i/HD) in double and rounded to float once (the same values as
// computing them per token; a table makes RoPE a streaming pass instead of T x HD/2 sincos).
// Computed at its first use and kept for the process (a model uses one or two).
const AlignedVector<float>& rope_table(int64_t seq_len, int64_t head_dim, float theta, double sign) {
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, float, double>, AlignedVector<float>> tables;
  const std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = tables.try_emplace({seq_len, head_dim, theta, sign});
  AlignedVector<float>& cos_sin = it->second;
  if (!inserted) return cos_sin;
  const int64_t pairs = head_dim / 2;
  cos_sin.resize(static_cast<size_t>(seq_len * pairs * 2));
  parallel_blocks(seq_len, 16, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const double pos = static_cast<double>(s);
      for (int64_t i = 0; i < pairs; ++i) {
        const double angle = sign * pos * rope_frequency(i, head_dim, theta);
        cos_sin[(s * pairs + i) * 2] = static_cast<float>(std::cos(angle));
        cos_sin[(s * pairs + i) * 2 + 1] = static_cast<float>(std::sin(angle));
      }
    }
  });
  return cos_sin;
}

void rope_rotate(std::span<float> x, int64_t seq_len, int64_t heads, int64_t head_dim,
                 float theta, double sign) {
  const int64_t C = heads * head_dim;
  expect_multiple("rope", "x", x.size(), C * seq_len);
  if (head_dim % 2 != 0) throw Error("rope: head dimension must be even, got " + std::to_string(head_dim));
  const int64_t T = static_cast<int64_t>(x.size()) / C, pairs = head_dim / 2;
  work::add_floats(2 * x.size());
  const AlignedVector<float>& cos_sin = rope_table(seq_len, head_dim, theta, sign);
  parallel_blocks(T, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* cs = cos_sin.data() + (t % seq_len) * pairs * 2;
      for (int64_t h = 0; h < heads; ++h) {
        float* p = x.data() + t * C + h * head_dim;
        for (int64_t i = 0; i < pairs; ++i) {
          const float c = cs[2 * i], s = cs[2 * i + 1];
          const float a = p[2 * i], b = p[2 * i + 1];
          p[2 * i] = a * c - b * s;
          p[2 * i + 1] = a * s + b * c;
        }
      }
    }
  });
}

}  // namespace

void scale_in_place(std::span<float> x, float s) {
  work::add_floats(2 * x.size());
  parallel_blocks(static_cast<int64_t>(x.size()), int64_t{1} << 14, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) x[i] *= s;
  });
}

void transpose_into(float* dst, const float* src, int64_t rows, int64_t cols) {
  work::add_floats(2 * static_cast<uint64_t>(rows * cols));
  // 64 x 64 tiles (16 KB: the source tile stays in L1 while its columns are written out as whole
  // cache lines): 4.2 ms for 4096 x 1024 on 2 threads, against 8.8 for bands of rows in 8 x 8
  // AVX tiles and about 10 for whole columns (Emerald Rapids class VM).
  constexpr int64_t kTile = 64;
  const int64_t tiles_c = (cols + kTile - 1) / kTile;
  parallel_blocks((rows + kTile - 1) / kTile * tiles_c, tiles_c, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t / tiles_c * kTile, c0 = t % tiles_c * kTile;
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = src[r * cols + c];
      }
    }
  });
}

void add_transposed(float* dst, const float* src, int64_t rows, int64_t cols) {
  work::add_floats(3 * static_cast<uint64_t>(rows * cols));
  parallel_blocks(cols, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      for (int64_t r = 0; r < rows; ++r) dst[c * rows + r] += src[r * cols + c];
    }
  });
}

void embedding_forward(std::span<float> out, std::span<const int32_t> tokens,
                       std::span<const float> table, int64_t vocab, int64_t width) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  expect_size("embedding_forward", "out", out.size(), T * width);
  expect_size("embedding_forward", "table", table.size(), vocab * width);
  check_ids("embedding_forward", "token", tokens, vocab);
  work::add_floats(2 * static_cast<uint64_t>(T * width));  // rows read, rows written
  parallel_blocks(T, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      std::copy_n(table.data() + tokens[t] * width, width, out.data() + t * width);
    }
  });
}

void embedding_backward(std::span<float> dtable, std::span<const float> dout,
                        std::span<const int32_t> tokens, int64_t width, int64_t leaves,
                        LeafScratch* scratch) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  expect_size("embedding_backward", "dout", dout.size(), T * width);
  work::add_floats(3 * static_cast<uint64_t>(T * width));  // dout read, table rows read and written
  // Tokens repeat, so every element adds its tokens' rows in token order (deterministic); the
  // threads take blocks of columns, which keeps that order for each element.
  const auto scatter = [&](float* table, int64_t t0, int64_t t1) {
    parallel_blocks(width, 64, [&](int64_t c0, int64_t c1) {
      for (int64_t t = t0; t < t1; ++t) {
        float* row = table + tokens[t] * width;
        for (int64_t c = c0; c < c1; ++c) row[c] += dout[t * width + c];
      }
    });
  };
  if (leaves == 1) {
    scatter(dtable.data(), 0, T);
    return;
  }
  if (leaves < 1 || T % leaves != 0 || scratch == nullptr) {
    throw Error("embedding_backward: " + std::to_string(leaves) + " reduction leaves for " + std::to_string(T) +
                " tokens (they must divide T, and a scratch is needed)");
  }
  expect_multiple("embedding_backward", "dtable", dtable.size(), width);
  const int64_t V = static_cast<int64_t>(dtable.size()) / width, per_leaf = T / leaves;
  for (int64_t t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= V) {
      throw Error("embedding_backward: token " + std::to_string(tokens[t]) + " at position " +
                  std::to_string(t) + " is outside the table's " + std::to_string(V) + " rows");
    }
  }
  // The tokens grouped by row, each row's tokens in increasing position (so in leaf order, and in
  // token order within a leaf).
  std::vector<int64_t>& order = scratch->order;
  order.resize(static_cast<size_t>(T));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return tokens[a] < tokens[b]; });
  std::vector<int64_t>& starts = scratch->run_starts;
  starts.clear();
  for (int64_t i = 0; i < T; ++i) {
    if (i == 0 || tokens[order[i]] != tokens[order[i - 1]]) starts.push_back(i);
  }
  starts.push_back(T);
  const int64_t runs = static_cast<int64_t>(starts.size()) - 1;
  // One row at a time (rows are disjoint: any thread count, the same bits): its `leaves` partials
  // from +0 in token order, then the tree over them, then into dtable. Rows hold very different
  // numbers of tokens, so the blocks of rows are handed out dynamically.
  parallel_blocks_dynamic(runs, 8, [&](int64_t r0, int64_t r1) {
    thread_local AlignedVector<float> partials;  // grown once per thread
    partials.resize(static_cast<size_t>(leaves * width));
    for (int64_t r = r0; r < r1; ++r) {
      std::fill(partials.begin(), partials.end(), 0.0f);
      for (int64_t i = starts[r]; i < starts[r + 1]; ++i) {
        const int64_t t = order[i];
        float* p = partials.data() + (t / per_leaf) * width;
        const float* d = dout.data() + t * width;
        for (int64_t c = 0; c < width; ++c) p[c] += d[c];
      }
      dist::tree_sum_pieces(partials.data(), leaves, width, /*threaded=*/false);
      float* row = dtable.data() + tokens[order[starts[r]]] * width;
      for (int64_t c = 0; c < width; ++c) row[c] += partials[c];
    }
  });
}

void rmsnorm_forward(std::span<float> out, std::span<float> rstd, std::span<const float> in,
                     std::span<const float> weight, int64_t width, float eps) {
  expect_multiple("rmsnorm_forward", "in", in.size(), width);
  const int64_t T = static_cast<int64_t>(in.size()) / width;
  expect_size("rmsnorm_forward", "out", out.size(), T * width);
  expect_size("rmsnorm_forward", "rstd", rstd.size(), T);
  expect_size("rmsnorm_forward", "weight", weight.size(), width);
  work::add_floats(static_cast<uint64_t>(2 * T * width + T + width));  // in, out, rstd, weight
  const auto& k = kernels::active_kernels();
  parallel_blocks(T, kNormRows, [&](int64_t r0, int64_t r1) {
    k.rmsnorm_rows(out.data(), rstd.data(), in.data(), weight.data(), r0, r1, width, eps);
  });
}

void rmsnorm_backward(std::span<float> din, std::span<float> dweight, std::span<const float> dout,
                      std::span<const float> in, std::span<const float> weight,
                      std::span<const float> rstd, int64_t width, int64_t leaves) {
  const int64_t T = static_cast<int64_t>(rstd.size());
  if (leaves < 1 || T % leaves != 0) {
    throw Error("rmsnorm_backward: " + std::to_string(leaves) + " reduction leaves do not divide T = " +
                std::to_string(T));
  }
  expect_size("rmsnorm_backward", "in", in.size(), T * width);
  expect_size("rmsnorm_backward", "dout", dout.size(), T * width);
  expect_size("rmsnorm_backward", "din", din.size(), T * width);
  // dout, in, din read and written; rstd, weight, dweight (the dweight pass rereads dout, in)
  work::add_floats(static_cast<uint64_t>(6 * T * width + T + 3 * width));
  // y = x r w with r = (mean x^2 + eps)^-1/2:  dx = r (w dy) - x r^3 mean(x w dy).
  const auto& k = kernels::active_kernels();
  parallel_blocks(T, kNormRows, [&](int64_t r0, int64_t r1) {
    k.rmsnorm_backward_rows(din.data(), dout.data(), in.data(), weight.data(), rstd.data(), r0, r1,
                            width);
  });
  // dweight[c] += sum over t of dout * in * rstd: per leaf in double, t in increasing order for
  // every c, rounded to f32; then the leaf partials in the fixed tree. The same bits for any
  // thread count (blocks of columns per thread, rows streamed in order) and any rank count.
  // About one block of whole 64-column groups per thread and leaf, so that each row's slice is
  // one long run: blocks of 64 columns read 256 bytes per 4 KB row of `wide` and ran 2x longer.
  constexpr int64_t kColumns = 64;
  const int64_t threads = parallel_threads();
  const int64_t groups = (width + kColumns - 1) / kColumns;
  const int64_t blocks_per_leaf = std::min(groups, std::max<int64_t>(1, (threads + leaves - 1) / leaves));
  const int64_t block_width = (groups + blocks_per_leaf - 1) / blocks_per_leaf * kColumns;
  const int64_t column_blocks = (width + block_width - 1) / block_width;
  const int64_t per_leaf = T / leaves;
  AlignedVector<float> partial(static_cast<size_t>(leaves * width));
  parallel_grid(leaves, column_blocks, [&](int64_t l, int64_t cb) {
    const int64_t c0 = cb * block_width, n = std::min(block_width, width - c0);
    std::vector<double> acc(static_cast<size_t>(n), 0.0);
    for (int64_t t = l * per_leaf; t < (l + 1) * per_leaf; ++t) {
      const float* dy = dout.data() + t * width + c0;
      const float* x = in.data() + t * width + c0;
      const float r = rstd[t];
      for (int64_t c = 0; c < n; ++c) acc[c] += static_cast<double>(dy[c]) * x[c] * r;
    }
    for (int64_t c = 0; c < n; ++c) partial[l * width + c0 + c] = static_cast<float>(acc[c]);
  });
  dist::tree_sum_pieces(partial.data(), leaves, width);
  for (int64_t c = 0; c < width; ++c) dweight[c] += partial[c];
}

void rope_forward(std::span<float> x, int64_t seq_len, int64_t heads, int64_t head_dim,
                  float theta) {
  rope_rotate(x, seq_len, heads, head_dim, theta, 1.0);
}

void rope_backward(std::span<float> dx, int64_t seq_len, int64_t heads, int64_t head_dim,
                   float theta) {
  rope_rotate(dx, seq_len, heads, head_dim, theta, -1.0);
}

// Attention runs per (example, head) on column slices of q, k, v (leading dimension C) with
// oneDNN f32 products; the (example, head) pairs are spread over threads and each product runs
// on its thread. Causality: scores above the diagonal are never read, probabilities there are 0.
void attention_forward(std::span<float> out, std::span<float> probs, std::span<const float> q,
                       std::span<const float> k, std::span<const float> v, int64_t seq_len,
                       int64_t heads, int64_t head_dim) {
  const int64_t C = heads * head_dim, S = seq_len, HD = head_dim;
  expect_multiple("attention_forward", "q", q.size(), C * S);
  const int64_t T = static_cast<int64_t>(q.size()) / C, B = T / S;
  expect_size("attention_forward", "k", k.size(), T * C);
  expect_size("attention_forward", "v", v.size(), T * C);
  expect_size("attention_forward", "out", out.size(), T * C);
  expect_size("attention_forward", "probs", probs.size(), B * heads * S * S);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HD)));
  parallel_grid(B, heads, [&](int64_t b, int64_t h) {
    const int64_t head = b * S * C + h * HD;  // first element of this head's (S, HD) slice
    float* p = probs.data() + (b * heads + h) * S * S;
    // p = q_h k_h^T (S, S)
    gemm::matmul_f32(p, q.data() + head, k.data() + head, {S, S, HD, false, true, C, C, S});
    for (int64_t i = 0; i < S; ++i) {  // causal softmax of row i over j <= i
      float* row = p + i * S;
      float mx = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j] * scale);
      double sum = 0.0;
      for (int64_t j = 0; j <= i; ++j) {
        row[j] = std::exp(row[j] * scale - mx);
        sum += row[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
      for (int64_t j = i + 1; j < S; ++j) row[j] = 0.0f;
    }
    // out_h = p v_h (S, HD)
    gemm::matmul_f32(out.data() + head, p, v.data() + head, {S, HD, S, false, false, S, C, C});
  });
}

void attention_backward(std::span<float> dq, std::span<float> dk, std::span<float> dv,
                        std::span<const float> dout, std::span<const float> q,
                        std::span<const float> k, std::span<const float> v,
                        std::span<const float> probs, int64_t seq_len, int64_t heads,
                        int64_t head_dim) {
  const int64_t C = heads * head_dim, S = seq_len, HD = head_dim;
  expect_multiple("attention_backward", "q", q.size(), C * S);
  const int64_t T = static_cast<int64_t>(q.size()) / C, B = T / S;
  for (auto* g : {&dq, &dk, &dv}) expect_size("attention_backward", "a gradient", g->size(), T * C);
  expect_size("attention_backward", "dout", dout.size(), T * C);
  expect_size("attention_backward", "probs", probs.size(), B * heads * S * S);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HD)));
  // Each (example, head) owns disjoint slices of dq, dk, dv.
  parallel_grid(B, heads, [&](int64_t b, int64_t h) {
    thread_local AlignedVector<float> ds;  // (S, S) scratch, grown once per thread
    ds.resize(static_cast<size_t>(S * S));
    const int64_t head = b * S * C + h * HD;
    const float* p = probs.data() + (b * heads + h) * S * S;
    // o = p v:  dv = p^T do,  dp = do v^T
    gemm::matmul_f32(dv.data() + head, p, dout.data() + head, {S, HD, S, true, false, S, C, C});
    gemm::matmul_f32(ds.data(), dout.data() + head, v.data() + head, {S, S, HD, false, true, C, C, S});
    // softmax: ds_ij = p_ij (dp_ij - sum_l p_il dp_il) * scale  (s_ij = scale q_i . k_j)
    for (int64_t i = 0; i < S; ++i) {
      float* row = ds.data() + i * S;
      const float* prow = p + i * S;
      double pdp = 0.0;
      for (int64_t j = 0; j <= i; ++j) pdp += static_cast<double>(prow[j]) * row[j];
      for (int64_t j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - static_cast<float>(pdp)) * scale;
      for (int64_t j = i + 1; j < S; ++j) row[j] = 0.0f;
    }
    // s = scale q k^T:  dq = ds k,  dk = ds^T q
    gemm::matmul_f32(dq.data() + head, ds.data(), k.data() + head, {S, HD, S, false, false, S, C, C});
    gemm::matmul_f32(dk.data() + head, ds.data(), q.data() + head, {S, HD, S, true, false, S, C, C});
  });
}

double cross_entropy_fused(std::span<float> logits, std::span<const int32_t> targets, int64_t vocab) {
  const int64_t T = static_cast<int64_t>(targets.size());
  double total = 0.0;
  cross_entropy_fused(logits, targets, vocab, 1.0f / static_cast<float>(T), {&total, 1});
  return total / static_cast<double>(T);
}

void cross_entropy_fused(std::span<float> logits, std::span<const int32_t> targets, int64_t vocab,
                         float grad_scale, std::span<double> leaf_loss) {
  const int64_t T = static_cast<int64_t>(targets.size());
  expect_size("cross_entropy_fused", "logits", logits.size(), T * vocab);
  check_ids("cross_entropy_fused", "target", targets, vocab);
  const int64_t leaves = static_cast<int64_t>(leaf_loss.size());
  if (leaves < 1 || T % leaves != 0) {
    throw Error("cross_entropy_fused: " + std::to_string(leaves) + " reduction leaves do not divide T = " +
                std::to_string(T));
  }
  // Fixed blocks of rows; per-token losses summed in token order afterwards: the same bits for
  // any thread count.
  constexpr int64_t kRows = 8;
  std::vector<double> token_loss(static_cast<size_t>(T));
  work::add_floats(2 * static_cast<uint64_t>(T * vocab));  // logits read, gradient written over them
  const auto& k = kernels::active_kernels();
  parallel_blocks(T, kRows, [&](int64_t r0, int64_t r1) {
    if (!k.softmax_xent_rows(logits.data(), token_loss.data(), targets.data(), r0, r1, vocab,
                             grad_scale)) {
      std::fill(logits.begin() + r0 * vocab, logits.begin() + r1 * vocab, NAN);
      std::fill(token_loss.begin() + r0, token_loss.begin() + r1, NAN);
    }
  });
  const int64_t per_leaf = T / leaves;
  for (int64_t l = 0; l < leaves; ++l) {
    double total = 0.0;
    for (int64_t t = l * per_leaf; t < (l + 1) * per_leaf; ++t) total += token_loss[t];
    leaf_loss[l] = total;
  }
}

double cross_entropy_forward(std::span<float> probs, std::span<const float> logits,
                             std::span<const int32_t> targets, int64_t vocab) {
  const int64_t T = static_cast<int64_t>(targets.size());
  expect_size("cross_entropy_forward", "logits", logits.size(), T * vocab);
  expect_size("cross_entropy_forward", "probs", probs.size(), T * vocab);
  check_ids("cross_entropy_forward", "target", targets, vocab);
  // Per-token losses, then one sum in token order: the same bits for any thread count (an
  // OpenMP reduction would add the threads' partial sums in a thread-count-dependent grouping).
  std::vector<double> token_loss(static_cast<size_t>(T));
  parallel_blocks(T, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* z = logits.data() + t * vocab;
      float* p = probs.data() + t * vocab;
      const int32_t y = targets[t];
      double mx = -INFINITY;
      for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, static_cast<double>(z[i]));
      double sum = 0.0;
      for (int64_t i = 0; i < vocab; ++i) sum += std::exp(z[i] - mx);
      for (int64_t i = 0; i < vocab; ++i) p[i] = static_cast<float>(std::exp(z[i] - mx) / sum);
      token_loss[t] = std::log(sum) + mx - z[y];
    }
  });
  double total = 0.0;
  for (double l : token_loss) total += l;
  return total / static_cast<double>(T);
}

void cross_entropy_backward(std::span<float> dlogits, std::span<const float> probs,
                            std::span<const int32_t> targets, int64_t vocab) {
  const int64_t T = static_cast<int64_t>(targets.size());
  expect_size("cross_entropy_backward", "dlogits", dlogits.size(), T * vocab);
  const float inv_t = 1.0f / static_cast<float>(T);
  parallel_blocks(T, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t i = 0; i < vocab; ++i) {
        const float onehot = i == targets[t] ? 1.0f : 0.0f;
        dlogits[t * vocab + i] = (probs[t * vocab + i] - onehot) * inv_t;
      }
    }
  });
}

}  // namespace s3r::model
