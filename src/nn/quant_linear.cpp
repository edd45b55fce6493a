// QuantLinear forward and backward (SPEC sections 1-4); see s3r/nn/quant_linear.hpp.
#include "s3r/nn/quant_linear.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/parallel_blocks.hpp"
#include "gemm/matmul_dx.hpp"
#include "kernels/dispatch.hpp"
#include "nn/linear_backward_steps.hpp"
#include "nn/phase_clock.hpp"
#include "nn/probe_backward.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/work.hpp"
#include "s3r/dist/tree_sum.hpp"
#include "s3r/gemm/backend.hpp"
#include "s3r/gemm/matmul.hpp"
#include "s3r/quant/forward_quant.hpp"

namespace s3r::nn {

namespace {

constexpr int64_t kRowBlock = 16;      // rows per OpenMP task of the elementwise passes
constexpr int64_t kChunk = 1 << 14;    // elements per OpenMP task of the flat elementwise passes

// bf16 operands: the values rounded to bf16 or, when this CPU's bf16 products are emulated in
// f32 (s3r/gemm/backend.hpp), those values widened back to f32 (exact) instead, so that the
// products that read them (forward and backward) do not widen them again; the emulated products
// read only the widened values, so the bf16 ones are not kept beside them (2 bytes per element
// less; 0.5 GB at `wide` with the workspace's G below).
void to_bf16(std::vector<bf16>& out, AlignedVector<float>& widened, std::span<const float> in) {
  const bool widen = gemm::bf16_backend() == gemm::Bf16Backend::kF32;
  work::add_bytes(in.size() * (widen ? 8 : 6));
  out.resize(widen ? 0 : in.size());
  widened.resize(widen ? in.size() : 0);
  const int64_t n = static_cast<int64_t>(in.size());
  bf16* o = widen ? nullptr : out.data();
  float* w = widen ? widened.data() : nullptr;
  const auto round = kernels::active_kernels().round_bf16;
  parallel_blocks(n, kChunk, [&](int64_t i0, int64_t i1) { round(o, w, in.data(), i0, i1); });
}

gemm::Bf16Operand bf16_operand(const std::vector<bf16>& values, const AlignedVector<float>& widened) {
  return {values.empty() ? nullptr : values.data(), widened.empty() ? nullptr : widened.data()};
}

// rowsum(Wq)[k] = sum_n Wq[k, n] of out.codes (K, N), exact.
void set_code_row_sums(LinearWeight& out) {
  const int64_t in = out.in, out_features = out.out;
  out.code_row_sums.resize(static_cast<size_t>(in));
  work::add_bytes(out.codes.size());  // the codes read again for their row sums
  const int8_t* codes = out.codes.data();
  parallel_blocks(in, kRowBlock, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      int32_t sum = 0;  // |sum| <= 127 * N: exact in int32 and in f32 for N < 2^17
      for (int64_t n = 0; n < out_features; ++n) sum += codes[k * out_features + n];
      out.code_row_sums[k] = static_cast<float>(sum);
    }
  });
}

void check_modes(const LinearInput& x, const LinearWeight& w, const char* fn) {
  if (x.mode != w.mode) {
    throw Error(std::string(fn) + ": input prepared for mode '" + std::string(to_string(x.mode)) +
                "' but weight for '" + std::string(to_string(w.mode)) + "'");
  }
  if (x.features != w.in) {
    std::ostringstream msg;
    msg << fn << ": input has K = " << x.features << " features, weight expects " << w.in;
    throw Error(msg.str());
  }
}

}  // namespace

void prepare_input(LinearInput& out, std::span<const float> x, int64_t tokens, int64_t features,
                   LinearMode mode, std::string_view name) {
  expect_size("prepare_input", "X", x.size(), tokens * features);
  out.mode = mode;
  out.tokens = tokens;
  out.features = features;
  switch (mode) {
    case LinearMode::kF32:
      work::add_floats(2 * x.size());
      out.f32_values.assign(x.begin(), x.end());
      break;
    case LinearMode::kBf16: to_bf16(out.bf16_values, out.f32_values, x); break;
    default:
      out.codes.resize(x.size());
      out.scales.resize(static_cast<size_t>(tokens));
      quantize_rows_rtne(out.codes, out.scales, x, tokens, features, name);
  }
}

void prepare_weight(LinearWeight& out, std::span<const float> w, int64_t in, int64_t out_features,
                    LinearMode mode, std::string_view name) {
  expect_size("prepare_weight", "W", w.size(), in * out_features);
  out.mode = mode;
  out.in = in;
  out.out = out_features;
  switch (mode) {
    case LinearMode::kF32:
      work::add_floats(2 * w.size());
      out.f32_values.assign(w.begin(), w.end());
      break;
    case LinearMode::kBf16: to_bf16(out.bf16_values, out.f32_values, w); break;
    default: {
      out.codes.resize(w.size());
      out.scales.resize(static_cast<size_t>(out_features));
      quantize_cols_rtne(out.codes, out.scales, w, in, out_features, name);
      set_code_row_sums(out);
    }
  }
}

void prepare_weight_transposed(LinearWeight& out, std::span<const float> wt, int64_t in, int64_t out_features,
                               LinearMode mode, std::string_view name) {
  expect_size("prepare_weight_transposed", "W^T", wt.size(), in * out_features);
  if (!is_int8(mode)) {
    throw Error("prepare_weight_transposed: mode '" + std::string(to_string(mode)) +
                "' is not an int8 mode (transpose the floats and call prepare_weight)");
  }
  out.mode = mode;
  out.in = in;
  out.out = out_features;
  // Per row of wt = per column of W: the same absmax, scale and codes as quantize_cols_rtne
  // (SPEC section 1; both divide each value by its channel's scale in f32).
  thread_local std::vector<int8_t> codes_t;  // (N, K); grown once, reused (no zero-fill per call)
  codes_t.resize(wt.size());
  out.scales.resize(static_cast<size_t>(out_features));
  quantize_rows_rtne(codes_t, out.scales, wt, out_features, in, name);
  out.codes.resize(codes_t.size());
  work::add_bytes(2 * codes_t.size());
  constexpr int64_t kBand = 64;  // rows of wt per task of the transpose
  const auto transpose = kernels::active_kernels().transpose_s8;
  const int8_t* from = codes_t.data();  // the calling thread's (a thread_local is not captured)
  parallel_blocks(out_features, kBand, [&](int64_t r0, int64_t r1) {
    transpose(out.codes.data(), out_features, from, in, r0, r1, in);
  });
  set_code_row_sums(out);
}

void linear_forward(std::span<float> y, const LinearInput& x, const LinearWeight& w) {
  check_modes(x, w, "linear_forward");
  expect_size("linear_forward", "Y", y.size(), x.tokens * w.out);
  gemm::MatmulShape shape{x.tokens, w.out, x.features};
  shape.row_phase = x.row_phase;
  switch (x.mode) {
    case LinearMode::kF32: gemm::matmul_f32(y.data(), x.f32_values.data(), w.f32_values.data(), shape); break;
    case LinearMode::kBf16:
      gemm::matmul_bf16(y.data(), bf16_operand(x.bf16_values, x.f32_values),
                        bf16_operand(w.bf16_values, w.f32_values), shape);
      break;
    default:
      // Y = sx[t] * sw[n] * sum_k Xq[t, k] Wq[k, n]
      gemm::matmul_s8_scaled(y.data(), x.codes.data(), w.codes.data(), shape, x.scales.data(),
                             w.scales.data());
  }
}

namespace {

// The ranks that hold the rest of the batch (D, the int8 dW sums and S3R-EC's dW factors are
// reduced over them); nullptr when this process holds the whole batch.
dist::Communicator* reduction_group(const BatchPlacement& place) {
  return place.group != nullptr && place.group->size() > 1 ? place.group : nullptr;
}

// The examples of a call's rows: B of S tokens each, or the ragged examples of a mixture of
// experts' rows (BatchPlacement::ragged); example b's rows are [begin(b), end(b)).
struct Examples {
  int64_t count, S;
  std::span<const int64_t> offsets;
  Examples(int64_t T, const LinearBackwardConfig& config)
      : count(config.placement.ragged.empty() ? (config.tokens_per_example >= 1 ? T / config.tokens_per_example : 0)
                                              : config.placement.ragged.examples()),
        S(config.tokens_per_example), offsets(config.placement.ragged.example_offsets) {}
  int64_t begin(int64_t b) const { return offsets.empty() ? b * S : offsets[b]; }
  int64_t end(int64_t b) const { return offsets.empty() ? (b + 1) * S : offsets[b + 1]; }
};

void check_backward(std::span<float> dx, std::span<float> dw, std::span<const float> g,
                    const LinearInput& x, const LinearWeight& w, const LinearBackwardConfig& config) {
  check_modes(x, w, "linear_backward");
  const int64_t T = x.tokens, K = x.features, N = w.out, S = config.tokens_per_example;
  expect_size("linear_backward", "G", g.size(), T * N);
  expect_size("linear_backward", "dW", dw.size(), K * N);
  if (!dx.empty()) expect_size("linear_backward", "dX", dx.size(), T * K);
  if (config.dw_transposed && !dw_transposable(x.mode, config)) {
    throw Error("linear_backward: dW can be written transposed only in an int8 mode on one process without "
                "the two-way correction (mode '" + std::string(to_string(x.mode)) + "')");
  }
  const int64_t leaves = config.placement.leaves;
  const int64_t B = Examples(T, config).count;
  if (leaves < 1 || (config.placement.ragged.empty() && S < 1) || B % leaves != 0) {
    throw Error("linear_backward: " + std::to_string(leaves) + " reduction leaves do not divide the " +
                std::to_string(B) + " examples of the batch");
  }
}

// dX (T, K) and dW (K, N) of the float modes. dW = X^T G is a float sum over tokens: formed
// per reduction leaf (rows [l T/leaves, (l+1) T/leaves)) and added in the fixed tree, so that
// it is the same for any split of the batch over ranks (s3r/dist/tree_sum.hpp).
void float_backward(std::span<float> dx, std::span<float> dw, std::span<const float> g,
                    const LinearInput& x, const LinearWeight& w, const LinearBackwardConfig& config,
                    LinearWorkspace& ws) {
  PhaseZone zone(ws.times, &PhaseTimes::gemm);
  const int64_t T = x.tokens, K = x.features, N = w.out, leaves = config.placement.leaves;
  const bool accumulate_dx = config.accumulate_dx;
  // Leaf l: the rows of examples [l B / leaves, (l + 1) B / leaves) (T / leaves unless ragged).
  const Examples ex(T, config);
  const auto leaf_begin = [&](int64_t l) { return l == leaves ? T : ex.begin(l * (ex.count / leaves)); };
  const auto leaf_shape = [&](int64_t l) {  // one leaf's dW = X_l^T G_l
    return gemm::MatmulShape{K, N, leaf_begin(l + 1) - leaf_begin(l), true, false};
  };
  gemm::MatmulShape dx_shape{T, K, N, false, true};  // dX = G W^T
  dx_shape.row_phase = x.row_phase;
  const auto empty_leaf = [&](int64_t l, std::span<float> out) {
    if (leaf_begin(l + 1) > leaf_begin(l)) return false;
    std::fill(out.begin(), out.end(), 0.0f);  // a ragged leaf without rows
    return true;
  };
  if (x.mode == LinearMode::kF32) {
    if (!dx.empty()) gemm::matmul_f32(dx.data(), g.data(), w.f32_values.data(), dx_shape, accumulate_dx);
    dist::tree_sum_leaves(dw, leaves, [&](int64_t l, std::span<float> out) {
      if (empty_leaf(l, out)) return;
      gemm::matmul_f32(out.data(), x.f32_values.data() + leaf_begin(l) * K, g.data() + leaf_begin(l) * N,
                       leaf_shape(l));
    }, ws.tree_scratch);
    return;
  }
  // G in bf16 lives only for this call: one buffer per thread for every layer (a workspace
  // each would hold a (T, N) copy per layer kind, 0.3 GB at `wide`).
  thread_local std::vector<bf16> g_bf16;
  thread_local AlignedVector<float> g_widened;
  to_bf16(g_bf16, g_widened, g);
  const gemm::Bf16Operand gq = bf16_operand(g_bf16, g_widened);
  if (!dx.empty()) {
    gemm::matmul_bf16(dx.data(), gq, bf16_operand(w.bf16_values, w.f32_values), dx_shape,
                      accumulate_dx);
  }
  const gemm::Bf16Operand xq = bf16_operand(x.bf16_values, x.f32_values);
  dist::tree_sum_leaves(dw, leaves, [&](int64_t l, std::span<float> out) {
    if (empty_leaf(l, out)) return;
    const auto leaf = [&](const gemm::Bf16Operand& op, int64_t cols) {
      return gemm::Bf16Operand{op.values ? op.values + leaf_begin(l) * cols : nullptr,
                               op.widened ? op.widened + leaf_begin(l) * cols : nullptr};
    };
    gemm::matmul_bf16(out.data(), leaf(xq, K), leaf(gq, N), leaf_shape(l));
  }, ws.tree_scratch);
}

// S3R-EC's dX term (SPEC section 4) as the dX epilogue reads it: ws.wa = Wq a_b (B, K), one
// matrix-vector product per example, and ws.delta[t] = c[t] - m[b] (T). Returns ws.wa.
const float* dx_correction_terms(const ErrorStats& st, const LinearWeight& w, const Examples& ex,
                                 LinearWorkspace& ws) {
  PhaseZone zone(ws.times, &PhaseTimes::correction);
  const int64_t K = w.in, N = w.out, B = ex.count;
  ws.wa.resize(static_cast<size_t>(B * K));
  ws.delta.resize(static_cast<size_t>(ex.end(B - 1)));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = ex.begin(b); t < ex.end(b); ++t) ws.delta[t] = st.token_mean[t] - st.grand_mean[b];
  }
  const auto& k = kernels::active_kernels();
  work::add_mac_f32(static_cast<uint64_t>(B * K * N));
  work::add_bytes(static_cast<uint64_t>(K * N + 4 * (B * N + B * K)));  // Wq, a read; wa written
  parallel_blocks(K, 64, [&](int64_t k0, int64_t k1) {
    k.gemv_s8_f32(ws.wa.data(), w.codes.data(), st.channel_mean.data(), B, K, N, k0, k1);
  });
  return ws.wa.data();
}

// S3R-EC's dW factors of this process's B examples (SPEC section 4): ws.u_local rows 0..B-1
// are u_b = Xq_b^T 1 and rows B..2B-1 are v_b = Xq_b^T (c_b - m_b), each (K).
void dw_local_factors(const ErrorStats& st, const LinearInput& x, const Examples& ex, LinearWorkspace& ws) {
  const int64_t K = x.features, B = ex.count;
  ws.u_local.assign(static_cast<size_t>(2 * B * K), 0.0f);
  float* u_loc = ws.u_local.data();
  float* v_loc = u_loc + B * K;
  const int8_t* xq = x.codes.data();
  parallel_blocks(K, 256, [&](int64_t k0, int64_t k1) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = ex.begin(b); t < ex.end(b); ++t) {
        const float d = st.token_mean[t] - st.grand_mean[b];
        for (int64_t kk = k0; kk < k1; ++kk) {
          const float xv = xq[t * K + kk];
          u_loc[b * K + kk] += xv;  // exact: integers below 2^24 for S * 127 < 2^24
          v_loc[b * K + kk] += xv * d;
        }
      }
    }
  });
}

// The rank-(Bg+1) factors over the Bg examples of the group, gathered from every rank (SPEC
// section 6) so that every rank forms the same product: ws.u = U = [u_0 .. u_{Bg-1}; sum_b v_b]
// (Bg+1, K) and ws.a_scaled = A = -[a_b / sw ; 1 / sw] (Bg+1, N). Returns Bg.
int64_t dw_group_factors(const ErrorStats& st, const LinearWeight& w, int64_t B,
                         dist::Communicator* group, LinearWorkspace& ws) {
  const int64_t K = w.in, N = w.out;
  const int R = group ? group->size() : 1;
  const int64_t Bg = B * R;
  std::span<const float> u_all = ws.u_local, a_all = st.channel_mean;
  if (group != nullptr) {
    ws.u_all.resize(static_cast<size_t>(R) * ws.u_local.size());
    ws.a_all.resize(static_cast<size_t>(Bg * N));
    group->all_gather<float>(ws.u_local, ws.u_all);
    group->all_gather<float>(st.channel_mean, ws.a_all);
    u_all = ws.u_all;
    a_all = ws.a_all;
  }
  ws.u.resize(static_cast<size_t>((Bg + 1) * K));
  float* u = ws.u.data();
  float* v = u + Bg * K;
  std::fill(v, v + K, 0.0f);
  for (int64_t bg = 0; bg < Bg; ++bg) {  // examples in global order: rank r's block r
    const float* part = u_all.data() + (bg / B) * 2 * B * K;
    std::copy_n(part + (bg % B) * K, K, u + bg * K);
    const float* vb = part + (B + bg % B) * K;
    for (int64_t kk = 0; kk < K; ++kk) v[kk] += vb[kk];
  }
  ws.a_scaled.resize(static_cast<size_t>((Bg + 1) * N));
  for (int64_t b = 0; b <= Bg; ++b) {
    for (int64_t n = 0; n < N; ++n) {
      const float a = b < Bg ? a_all[b * N + n] : 1.0f;
      ws.a_scaled[b * N + n] = -a / w.scales[n];
    }
  }
  return Bg;
}

// dW[k, n] -= (1/sw[n]) sum_b (u_b[k] a[b, n] + v_b[k]) (SPEC section 4, two-way), as one
// rank-(Bg+1) f32 product U^T A over the Bg examples of the group.
void correct_dw(std::span<float> dw, const ErrorStats& st, const LinearInput& x,
                const LinearWeight& w, const LinearBackwardConfig& config, LinearWorkspace& ws) {
  PhaseZone zone(ws.times, &PhaseTimes::correction);
  const Examples ex(x.tokens, config);
  dw_local_factors(st, x, ex, ws);
  const int64_t Bg = dw_group_factors(st, w, ex.count, reduction_group(config.placement), ws);
  gemm::matmul_f32(dw.data(), ws.u.data(), ws.a_scaled.data(), {x.features, w.out, Bg + 1, true, false},
                   /*accumulate=*/true);
}

}  // namespace

void quantize_grad(QuantizedGrad& q, std::span<const float> g, const LinearInput& x,
                   const LinearWeight& w, const LinearBackwardConfig& config, GradRounding rounding,
                   Key key, bool stats, PhaseTimes* times) {
  PhaseZone zone(times, &PhaseTimes::quantize_grad);
  const BatchPlacement& place = config.placement;
  quantize_gradient(q, g, x.tokens, w.out, x.scales, w.scales,
                    GradQuantConfig{rounding, config.tokens_per_example, key, stats, place.first_token,
                                    reduction_group(place), place.ragged, config.g_absmax});
}

void zero_backward(std::span<float> dx, std::span<float> dw, bool accumulate_dx) {
  if (!dx.empty() && !accumulate_dx) std::fill(dx.begin(), dx.end(), 0.0f);
  std::fill(dw.begin(), dw.end(), 0.0f);
}

// dX = dequantized G_q W_q^T, with S3R-EC's term when correcting (SPEC section 4): fused into the
// product's epilogue (gemm/matmul_dx.hpp); with ragged examples, the int32 sums first, then the
// epilogue piece by piece (each block's rows cut at example boundaries, each piece with its
// example's row of wa: the terms' b = t / T is then 0).
void int8_dx(std::span<float> dx, const QuantizedGrad& q, const LinearInput& x,
             const LinearWeight& w, const LinearBackwardConfig& config, bool correct,
             LinearWorkspace& ws) {
  const int64_t T = x.tokens, K = x.features, N = w.out;
  const Examples ex(T, config);
  const float* wa = correct ? dx_correction_terms(q.stats_for_dx(), w, ex, ws) : nullptr;
  kernels::DxTerms d{q.step, x.scales.data(), wa, ws.delta.data(), w.code_row_sums.data(), config.tokens_per_example,
                     K, config.accumulate_dx};
  PhaseZone zone(ws.times, &PhaseTimes::gemm);
  const gemm::MatmulShape shape{T, K, N, false, true};
  if (ex.offsets.empty()) return gemm::matmul_s8_dx(dx.data(), q.codes_for_dx().data(), w.codes.data(), shape, d);
  ws.acc.resize(static_cast<size_t>(T * K));  // zero-fills when it grows: its time is the product's
  gemm::matmul_s8(ws.acc.data(), q.codes_for_dx().data(), w.codes.data(), shape);
  work::add_floats(static_cast<uint64_t>(T * K) * (config.accumulate_dx ? 3 : 2));  // acc read; dx (read and) written
  const auto epilogue = kernels::active_kernels().dx_epilogue;
  d.S = T;
  parallel_blocks(T, kRowBlock, [&](int64_t t0, int64_t t1) {
    int64_t b = std::upper_bound(ex.offsets.begin(), ex.offsets.end(), t0) - ex.offsets.begin() - 1;
    for (int64_t r = t0; r < t1; ++b) {
      const int64_t r1 = std::min(t1, ex.end(b));
      if (r1 > r) {
        kernels::DxTerms piece = d;
        piece.wa = wa ? wa + b * K : nullptr;
        epilogue(dx.data(), K, ws.acc.data() + r * K, K, r, r1, 0, K, piece);
      }
      r = r1;
    }
  });
}

// Over a group of ranks the int32 sums are added first (exact, so the same as one process's) and
// scaled once: float(sum) * (D / sw), the fused product's contract (s3r/gemm/matmul.hpp).
// ws.col_scale = D / sw, the dW product's column scales.
const float* dw_column_scales(float D, const LinearWeight& w, LinearWorkspace& ws) {
  ws.col_scale.resize(static_cast<size_t>(w.out));
  for (int64_t n = 0; n < w.out; ++n) ws.col_scale[n] = D / w.scales[n];
  return ws.col_scale.data();
}

// This rank's int32 dW sums (ws.dw_acc, K x N) added over the group (exact) and scaled once:
// float(sum) * (D / sw), the fused product's contract (s3r/gemm/matmul.hpp).
void group_dw(std::span<float> dw, float D, const LinearWeight& w, dist::Communicator& group, LinearWorkspace& ws) {
  const int64_t N = w.out;
  group.sum(ws.dw_acc);
  const int32_t* acc = ws.dw_acc.data();
  const float* cs = dw_column_scales(D, w, ws);
  parallel_blocks(w.in, kRowBlock, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      for (int64_t n = 0; n < N; ++n) dw[k * N + n] = static_cast<float>(acc[k * N + n]) * cs[n];
    }
  });
}

void int8_dw(std::span<float> dw, std::span<const int8_t> codes, float D, const LinearInput& x,
             const LinearWeight& w, const LinearBackwardConfig& config, LinearWorkspace& ws) {
  PhaseZone zone(ws.times, &PhaseTimes::gemm);
  const int64_t T = x.tokens, K = x.features, N = w.out;
  dist::Communicator* group = reduction_group(config.placement);
  if (group == nullptr && config.dw_transposed) {  // dW^T = Q^T Xq, D / sw per row
    gemm::matmul_s8_scaled(dw.data(), codes.data(), x.codes.data(), {N, K, T, true, false},
                           dw_column_scales(D, w, ws), nullptr);
    return;
  }
  if (group == nullptr) {
    gemm::matmul_s8_scaled(dw.data(), x.codes.data(), codes.data(), {K, N, T, true, false}, nullptr,
                           dw_column_scales(D, w, ws));
    return;
  }
  ws.dw_acc.resize(static_cast<size_t>(K * N));
  gemm::matmul_s8(ws.dw_acc.data(), x.codes.data(), codes.data(), {K, N, T, true, false});
  group_dw(dw, D, w, *group, ws);
}

void int8_backward(std::span<float> dx, std::span<float> dw, std::span<const float> g,
                   const LinearInput& x, const LinearWeight& w, const LinearBackwardConfig& config,
                   LinearWorkspace& ws) {
  const bool correct = config.correction != Correction::kNone;
  QuantizedGrad& q = ws.grad;  // one quantization (sr: two) for dX and dW
  quantize_grad(q, g, x, w, config, grad_rounding(x.mode), config.layer_key, correct, ws.times);
  if (q.step == 0.0f) return zero_backward(dx, dw, config.accumulate_dx);
  if (!dx.empty()) int8_dx(dx, q, x, w, config, correct, ws);
  int8_dw(dw, q.codes_for_dw(), q.step, x, w, config, ws);
  if (config.correction == Correction::kTwoWay) correct_dw(dw, q.stats_for_dw(), x, w, config, ws);
}

void linear_backward_without_rows(std::span<float> dw, const LinearWeight& w, const LinearBackwardConfig& config,
                                  LinearWorkspace& ws) {
  expect_size("linear_backward", "dW", dw.size(), w.in * w.out);
  dist::Communicator* group = reduction_group(config.placement);
  if (!is_int8(w.mode) || group == nullptr) return zero_backward({}, dw, false);  // a float partial of 0
  // quantize_gradient's max all-reduce, with nothing of this rank's own (section 6).
  AlignedVector<float> v{0.0f, 0.0f};
  group->max(v);
  if (v[0] > 0.0f) throw NonFiniteGradient("quantize_gradient: another rank's share of G holds a non-finite value");
  if (!std::isfinite(v[1])) throw Error("quantize_gradient: G' = sx * G * sw overflows f32 on another rank");
  const float D = v[1] / 127.0f;
  if (D == 0.0f) return zero_backward({}, dw, false);
  ws.dw_acc.assign(static_cast<size_t>(w.in * w.out), 0);  // the group's int32 dW sums with zeros
  group_dw(dw, D, w, *group, ws);
  LinearInput none;
  none.mode = w.mode;
  none.features = w.in;
  if (config.correction == Correction::kTwoWay) {
    ErrorStats st;  // no rows: every factor of this rank is 0
    const int64_t B = Examples(0, config).count;
    st.channel_mean.assign(static_cast<size_t>(B * w.out), 0.0f);
    st.grand_mean.assign(static_cast<size_t>(B), 0.0f);
    correct_dw(dw, st, none, w, config, ws);
  }
}

bool dw_transposable(LinearMode mode, const LinearBackwardConfig& config) {
  return is_int8(mode) && reduction_group(config.placement) == nullptr && config.correction != Correction::kTwoWay;
}

void linear_backward(std::span<float> dx, std::span<float> dw, std::span<const float> g,
                     const LinearInput& x, const LinearWeight& w, const LinearBackwardConfig& config,
                     LinearWorkspace& ws) {
  check_backward(dx, dw, g, x, w, config);
  if (!is_int8(x.mode)) {
    return float_backward(dx, dw, g, x, w, config, ws);
  }
  if (ws.probe != nullptr && config.dw_transposed) throw Error("linear_backward: a BackwardProbe writes dW as (K, N)");
  if (ws.probe != nullptr) return probe_linear_backward(dx, dw, g, x, w, config, ws);  // diagnostics
  int8_backward(dx, dw, g, x, w, config, ws);
}

}  // namespace s3r::nn
