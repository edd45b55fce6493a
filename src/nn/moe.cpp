// Mixture-of-experts feed-forward block; see s3r/nn/moe.hpp and docs/SPEC.md A.10.
#include "s3r/nn/moe.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/parallel_blocks.hpp"
#include "nn/phase_clock.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/work.hpp"
#include "s3r/dist/communicator.hpp"
#include "s3r/gemm/matmul.hpp"

namespace s3r::nn {

namespace {

void check_shape(const MoeShape& s) {
  if (s.experts < 1 || s.top_k < 1 || s.top_k > s.experts || s.expert_width < 1 || s.width < 1 ||
      s.tokens_per_example < 1 || s.tokens % s.tokens_per_example != 0) {
    throw Error("moe: needs E >= 1 experts, 1 <= k <= E, F >= 1 and T a multiple of S; got E = " +
                std::to_string(s.experts) + ", k = " + std::to_string(s.top_k) + ", F = " +
                std::to_string(s.expert_width) + ", T = " + std::to_string(s.tokens) + ", S = " +
                std::to_string(s.tokens_per_example));
  }
}

// probs = softmax(logits) per token (the sum in double), lse = logsumexp; the k most probable
// experts (ties: the lower index) and their weights p / (sum of the k), in f32.
void route(MoeState& st, const AlignedVector<float>& logits) {
  const MoeShape& s = st.shape;
  const int64_t T = s.tokens, E = s.experts, k = s.top_k;
  st.probs.resize(static_cast<size_t>(T * E));
  st.lse.resize(static_cast<size_t>(T));
  st.expert_of.resize(static_cast<size_t>(T * k));
  st.weight.resize(static_cast<size_t>(T * k));
  parallel_blocks(T, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* z = logits.data() + t * E;
      float* p = st.probs.data() + t * E;
      const double m = *std::max_element(z, z + E);
      double sum = 0.0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(z[e]) - m);
      for (int64_t e = 0; e < E; ++e) p[e] = static_cast<float>(std::exp(static_cast<double>(z[e]) - m) / sum);
      st.lse[t] = static_cast<float>(m + std::log(sum));
      int32_t* chosen = st.expert_of.data() + t * k;
      float total = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; ++e) {
          if (std::find(chosen, chosen + j, e) != chosen + j) continue;
          if (best < 0 || p[e] > p[best]) best = e;
        }
        chosen[j] = best;
        total += p[best];
      }
      for (int64_t j = 0; j < k; ++j) st.weight[t * k + j] = p[chosen[j]] / total;
    }
  });
}

// The stable sort of the rows by expert (a counting sort), the rows' global ids, and per expert
// the offsets of each example's rows among its own.
void sort_rows(MoeState& st) {
  const MoeShape& s = st.shape;
  const int64_t T = s.tokens, E = s.experts, k = s.top_k, S = s.tokens_per_example, B = T / S;
  const int64_t R = T * k;
  st.expert_offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t r = 0; r < R; ++r) ++st.expert_offsets[st.expert_of[r] + 1];
  for (int64_t e = 0; e < E; ++e) st.expert_offsets[e + 1] += st.expert_offsets[e];
  std::vector<int64_t> next(st.expert_offsets.begin(), st.expert_offsets.end() - 1);
  st.position.resize(static_cast<size_t>(R));
  st.row_ids.resize(static_cast<size_t>(R));
  st.example_offsets.assign(static_cast<size_t>(E * (B + 1)), 0);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t e = st.expert_of[r], at = next[e]++;
    st.position[r] = at;
    st.row_ids[at] = st.first_token * static_cast<uint64_t>(k) + static_cast<uint64_t>(r);
    ++st.example_offsets[e * (B + 1) + r / (S * k) + 1];  // rows of example b come in order
  }
  for (int64_t e = 0; e < E; ++e) {
    int64_t* off = st.example_offsets.data() + e * (B + 1);
    for (int64_t b = 0; b < B; ++b) off[b + 1] += off[b];
  }
}

// The load-balancing loss of this batch's examples (SPEC A.10) and the z-loss's sum.
void routing_losses(MoeState& st) {
  const MoeShape& s = st.shape;
  const int64_t T = s.tokens, E = s.experts, k = s.top_k, S = s.tokens_per_example, B = T / S;
  st.aux_loss = 0.0;
  st.aux_per_example.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t* off = st.example_offsets.data() + e * (B + 1);
      double prob = 0.0;
      for (int64_t t = b * S; t < (b + 1) * S; ++t) prob += st.probs[t * E + e];
      sum += static_cast<double>(off[b + 1] - off[b]) / static_cast<double>(S) * (prob / static_cast<double>(S));
    }
    st.aux_per_example[b] = static_cast<double>(E) * sum;
    st.aux_loss += st.aux_per_example[b];
  }
  st.z_loss = 0.0;
  for (int64_t t = 0; t < T; ++t) st.z_loss += static_cast<double>(st.lse[t]) * st.lse[t];
  (void)k;
}

template <typename T>
std::span<T> expert_slice(std::span<T> all, int64_t e, int64_t size) {
  return all.subspan(static_cast<size_t>(e * size), static_cast<size_t>(size));
}

}  // namespace

namespace {

// Float modes over several ranks: expert e's rows here follow those of the ranks before this one
// in the whole batch's order, so its products start (their count mod 128) rows into the float
// products' tile grid, where one process's would (a row's bits can depend on its place in a tile).
std::vector<int64_t> row_phases(const MoeState& st, LinearMode mode, dist::Communicator* group) {
  const int64_t E = st.shape.experts;
  std::vector<int64_t> phase(static_cast<size_t>(E), 0);
  if (is_int8(mode) || group == nullptr || group->size() <= 1) return phase;
  std::vector<int64_t> mine(phase.size()), all(phase.size() * static_cast<size_t>(group->size()));
  for (int64_t e = 0; e < E; ++e) mine[e] = st.rows_of(e);
  group->all_gather_bytes(std::as_bytes(std::span<const int64_t>(mine)), std::as_writable_bytes(std::span<int64_t>(all)));
  for (int64_t r = 0; r < group->rank(); ++r) {
    for (int64_t e = 0; e < E; ++e) phase[e] += all[r * E + e];
  }
  for (int64_t& p : phase) p %= gemm::kFloatTileRows;
  return phase;
}

}  // namespace

void moe_forward(std::span<float> y, std::span<const float> x, const MoeWeights& w, const MoeShape& shape,
                 LinearMode mode, uint64_t first_token, MoeState& st, MoeScratch& scratch, dist::Communicator* group) {
  check_shape(shape);
  const int64_t T = shape.tokens, C = shape.width, F = shape.expert_width, E = shape.experts, k = shape.top_k;
  expect_size("moe", "X", x.size(), T * C);
  expect_size("moe", "Y", y.size(), T * C);
  expect_size("moe", "router", w.router.size(), C * E);
  for (auto [name, v] : {std::pair{"gate", w.gate}, std::pair{"up", w.up}, std::pair{"down", w.down}}) {
    expect_size("moe", name, v.size(), E * C * F);
  }
  st.shape = shape;
  st.first_token = first_token;
  st.experts.resize(static_cast<size_t>(E));
  {
    PhaseZone zone(st.times, &PhaseTimes::routing);
    prepare_input(st.router_in, x, T, C, LinearMode::kF32, "moe.router.X");
    prepare_weight(st.router_w, w.router, C, E, LinearMode::kF32, "moe.router.W");
    AlignedVector<float>& logits = scratch.dlogits;
    logits.resize(static_cast<size_t>(T * E));
    linear_forward(logits, st.router_in, st.router_w);
    route(st, logits);
    sort_rows(st);
    routing_losses(st);
    st.x_sorted.resize(static_cast<size_t>(T * k * C));
    st.y_sorted.resize(static_cast<size_t>(T * k * C));
    work::add_floats(static_cast<uint64_t>(2 * T * k * C));  // X's rows read, each into k slots
    parallel_blocks(T * k, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) std::copy_n(x.data() + (r / k) * C, C, st.x_sorted.data() + st.position[r] * C);
    });
  }
  const std::vector<int64_t> phase = row_phases(st, mode, group);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = st.rows_of(e), at = st.expert_offsets[e];
    st.experts[e].times = st.times;
    if (n == 0) {  // no rows here: the weights only, for a backward that joins other ranks' (moe_backward)
      SwigluState& ex = st.experts[e];
      ex.mode = mode;
      ex.tokens = 0;
      prepare_weight(ex.gate_w, expert_slice(w.gate, e, C * F), C, F, mode, "moe.experts.gate");
      prepare_weight(ex.up_w, expert_slice(w.up, e, C * F), C, F, mode, "moe.experts.up");
      prepare_weight(ex.down_w, expert_slice(w.down, e, F * C), F, C, mode, "moe.experts.down");
      continue;
    }
    swiglu_forward({st.y_sorted.data() + at * C, size_t(n * C)}, {st.x_sorted.data() + at * C, size_t(n * C)},
                   {expert_slice(w.gate, e, C * F), expert_slice(w.up, e, C * F), expert_slice(w.down, e, F * C)},
                   n, C, F, mode, st.experts[e], scratch.ffn, GatedActivation::kSilu, phase[e]);
  }
  PhaseZone zone(st.times, &PhaseTimes::routing);
  work::add_floats(static_cast<uint64_t>(T * k * C + T * C));  // the experts' rows read, Y written
  parallel_blocks(T, 16, [&](int64_t t0, int64_t t1) {  // Y[t] = sum_j w_j y_j, in f32, j in order
    for (int64_t t = t0; t < t1; ++t) {
      float* out = y.data() + t * C;
      for (int64_t j = 0; j < k; ++j) {
        const float wj = st.weight[t * k + j];
        const float* row = st.y_sorted.data() + st.position[t * k + j] * C;
        for (int64_t c = 0; c < C; ++c) out[c] = j == 0 ? wj * row[c] : out[c] + wj * row[c];
      }
    }
  });
}

namespace {

// dlogits (T, E) of the routing: through the combine weights (g_j = dY[t] . y_j), the
// renormalization over the k chosen and the softmax; plus the losses' gradients.
void router_backward(AlignedVector<float>& dlogits, std::span<const float> dy, const MoeState& st,
                     const MoeLossWeights& losses, float loss_scale) {
  const MoeShape& s = st.shape;
  const int64_t T = s.tokens, C = s.width, E = s.experts, k = s.top_k, S = s.tokens_per_example, B = T / S;
  dlogits.resize(static_cast<size_t>(T * E));
  parallel_blocks(T, 16, [&](int64_t t0, int64_t t1) {
    std::vector<double> g(static_cast<size_t>(k)), dp(static_cast<size_t>(E));
    for (int64_t t = t0; t < t1; ++t) {
      const float* p = st.probs.data() + t * E;
      const int32_t* chosen = st.expert_of.data() + t * k;
      const int64_t b = t / S;
      double gw = 0.0, total = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        const float* row = st.y_sorted.data() + st.position[t * k + j] * C;
        double dot = 0.0;
        for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(dy[t * C + c]) * row[c];
        g[j] = dot;
        gw += dot * st.weight[t * k + j];
        total += p[chosen[j]];
      }
      for (int64_t e = 0; e < E; ++e) {  // the load-balancing loss: d/dp_e = coef E f_{b,e} / step tokens
        const int64_t* off = st.example_offsets.data() + e * (B + 1);
        const double f = static_cast<double>(off[b + 1] - off[b]) / static_cast<double>(S);
        dp[e] = static_cast<double>(losses.aux) * static_cast<double>(E) * f * loss_scale;
      }
      for (int64_t j = 0; j < k; ++j) dp[chosen[j]] += (g[j] - gw) / total;
      double pdp = 0.0;
      for (int64_t e = 0; e < E; ++e) pdp += p[e] * dp[e];
      const double z = 2.0 * static_cast<double>(losses.z_loss) * st.lse[t] * loss_scale;
      for (int64_t e = 0; e < E; ++e) dlogits[t * E + e] = static_cast<float>(p[e] * (dp[e] - pdp + z));
    }
  });
}

}  // namespace

void moe_backward(std::span<float> dx, const MoeGrads& grads, std::span<const float> dy, Correction correction,
                  Key step_key, uint32_t first_layer, const MoeLossWeights& losses, float loss_scale,
                  MoeState& st, MoeScratch& scratch, const BatchPlacement& placement) {
  const MoeShape& s = st.shape;
  const int64_t T = s.tokens, C = s.width, F = s.expert_width, E = s.experts, k = s.top_k;
  const int64_t S = s.tokens_per_example, B = T / S;
  expect_size("moe", "dY", dy.size(), T * C);
  expect_size("moe", "dX", dx.size(), T * C);
  scratch.dy_sorted.resize(static_cast<size_t>(T * k * C));
  scratch.dx_sorted.resize(static_cast<size_t>(T * k * C));
  {
    PhaseZone zone(st.times, &PhaseTimes::routing);
    work::add_floats(static_cast<uint64_t>(2 * T * k * C));  // dY's rows read, each into k slots
    parallel_blocks(T * k, 64, [&](int64_t r0, int64_t r1) {  // dY_j = w_j dY[t]
      for (int64_t r = r0; r < r1; ++r) {
        const float wj = st.weight[r];
        float* out = scratch.dy_sorted.data() + st.position[r] * C;
        for (int64_t c = 0; c < C; ++c) out[c] = wj * dy[(r / k) * C + c];
      }
    });
  }
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = st.rows_of(e), at = st.expert_offsets[e];
    const SwigluGrads g{expert_slice(grads.gate, e, C * F), expert_slice(grads.up, e, C * F),
                        expert_slice(grads.down, e, F * C)};
    BatchPlacement place = placement;
    place.ragged = RaggedRows{{st.row_ids.data() + at, size_t(n)}, {st.example_offsets.data() + e * (B + 1), size_t(B + 1)},
                              static_cast<uint64_t>(S * k)};
    if (n == 0) {  // no rows here: a zero partial, or the group's int8 dW (swiglu_backward's order)
      const LinearBackwardConfig cfg{correction, S, step_key, false, -1, place};
      const SwigluState& ex = st.experts[e];
      linear_backward_without_rows(g.down, ex.down_w, cfg, scratch.ffn.ws);
      linear_backward_without_rows(g.gate, ex.gate_w, cfg, scratch.ffn.ws);
      linear_backward_without_rows(g.up, ex.up_w, cfg, scratch.ffn.ws);
      continue;
    }
    std::vector<GradTelemetry>* telemetry = scratch.ffn.ws.probe ? scratch.ffn.ws.probe->telemetry : nullptr;
    const size_t probed = telemetry ? telemetry->size() : 0;
    swiglu_backward({scratch.dx_sorted.data() + at * C, size_t(n * C)}, g,
                    {scratch.dy_sorted.data() + at * C, size_t(n * C)}, correction, S, step_key, first_layer,
                    st.experts[e], scratch.ffn, place);
    if (telemetry) {  // diagnostics: which expert the entries are of
      for (size_t i = probed; i < telemetry->size(); ++i) (*telemetry)[i].expert = e;
    }
  }
  PhaseZone zone(st.times, &PhaseTimes::routing);
  router_backward(scratch.dlogits, dy, st, losses, loss_scale);
  const LinearBackwardConfig cfg{Correction::kNone, S, step_key, false, -1, placement};
  linear_backward(dx, grads.router, scratch.dlogits, st.router_in, st.router_w, cfg, scratch.router_ws);
  work::add_floats(static_cast<uint64_t>(T * k * C + 2 * T * C));  // the experts' rows read, dX read and written
  parallel_blocks(T, 16, [&](int64_t t0, int64_t t1) {  // dX[t] += the experts' dX of its rows, j in order
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const float* row = scratch.dx_sorted.data() + st.position[t * k + j] * C;
        for (int64_t c = 0; c < C; ++c) dx[t * C + c] += row[c];
      }
    }
  });
}

ExpertLoad expert_load(const MoeState& st) {
  std::vector<int64_t> rows(static_cast<size_t>(st.shape.experts));
  for (size_t e = 0; e < rows.size(); ++e) rows[e] = st.rows_of(static_cast<int64_t>(e));
  return expert_load(rows);
}

ExpertLoad expert_load(std::span<const int64_t> rows) {
  const auto E = static_cast<int64_t>(rows.size());
  ExpertLoad load{rows[0], rows[0], 0.0};
  double sum = 0.0, sq = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = rows[e];
    load.min = std::min(load.min, n);
    load.max = std::max(load.max, n);
    sum += static_cast<double>(n);
    sq += static_cast<double>(n) * static_cast<double>(n);
  }
  const double mean = sum / static_cast<double>(E);
  load.cv = mean > 0.0 ? std::sqrt(std::max(0.0, sq / static_cast<double>(E) - mean * mean)) / mean : 0.0;
  return load;
}

}  // namespace s3r::nn
