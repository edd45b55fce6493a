// QuantLinear forward and backward (SPEC sections 1-4); see s3r/nn/quant_linear.hpp.
#include "s3r/nn/quant_linear.hpp"

#include <algorithm>
#include <sstream>

#include "core/parallel_blocks.hpp"
#include "kernels/dispatch.hpp"
#include "nn/phase_clock.hpp"
#include "nn/probe_backward.hpp"
#include "s3r/dist/tree_sum.hpp"
#include "s3r/core/error.hpp"
#include "s3r/gemm/backend.hpp"
#include "s3r/gemm/matmul.hpp"
#include "s3r/quant/forward_quant.hpp"

namespace s3r::nn {

namespace {

constexpr int64_t kRowBlock = 16;  // rows per OpenMP task of the elementwise passes


// bf16 operands: the values rounded to bf16 or, when this CPU's bf16 products are emulated in
// f32 (s3r/gemm/backend.hpp), those values widened back to f32 (exact) instead, so that the
// products that read them (forward and backward) do not widen them again; the emulated products
// read only the widened values, so the bf16 ones are not kept beside them (2 bytes per element
// less; 0.5 GB at `wide` with the workspace's G below).
void to_bf16(std::vector<bf16>& out, std::vector<float>& widened, std::span<const float> in) {
  const bool widen = gemm::bf16_backend() == gemm::Bf16Backend::kF32;
  out.resize(widen ? 0 : in.size());
  widened.resize(widen ? in.size() : 0);
  const int64_t n = static_cast<int64_t>(in.size());
  if (widen) {
    float* w = widened.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) w[i] = s3r::to_float(s3r::to_bf16(in[i]));
    return;
  }
  bf16* o = out.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = s3r::to_bf16(in[i]);
}

gemm::Bf16Operand bf16_operand(const std::vector<bf16>& values, const std::vector<float>& widened) {
  return {values.empty() ? nullptr : values.data(), widened.empty() ? nullptr : widened.data()};
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
    case LinearMode::kF32: out.f32_values.assign(x.begin(), x.end()); break;
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
    case LinearMode::kF32: out.f32_values.assign(w.begin(), w.end()); break;
    case LinearMode::kBf16: to_bf16(out.bf16_values, out.f32_values, w); break;
    default: {
      out.codes.resize(w.size());
      out.scales.resize(static_cast<size_t>(out_features));
      quantize_cols_rtne(out.codes, out.scales, w, in, out_features, name);
      out.code_row_sums.resize(static_cast<size_t>(in));
      const int8_t* codes = out.codes.data();
#pragma omp parallel for schedule(static)
      for (int64_t k = 0; k < in; ++k) {
        int32_t sum = 0;  // |sum| <= 127 * N: exact in int32 and in f32 for N < 2^17
        for (int64_t n = 0; n < out_features; ++n) sum += codes[k * out_features + n];
        out.code_row_sums[k] = static_cast<float>(sum);
      }
    }
  }
}

void linear_forward(std::span<float> y, const LinearInput& x, const LinearWeight& w) {
  check_modes(x, w, "linear_forward");
  expect_size("linear_forward", "Y", y.size(), x.tokens * w.out);
  const gemm::MatmulShape shape{x.tokens, w.out, x.features};
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

// dX (T, K) and dW (K, N) of the float modes. dW = X^T G is a float sum over tokens: formed
// per reduction leaf (rows [l T/leaves, (l+1) T/leaves)) and added in the fixed tree, so that
// it is the same for any split of the batch over ranks (s3r/dist/tree_sum.hpp).
void float_backward(std::span<float> dx, std::span<float> dw, std::span<const float> g,
                    const LinearInput& x, const LinearWeight& w, bool accumulate_dx, int64_t leaves,
                    LinearWorkspace& ws) {
  const int64_t T = x.tokens, K = x.features, N = w.out, rows = T / leaves;
  const gemm::MatmulShape dx_shape{T, K, N, false, true};  // dX = G W^T
  const gemm::MatmulShape dw_shape{K, N, rows, true, false};  // one leaf's dW = X_l^T G_l
  if (x.mode == LinearMode::kF32) {
    if (!dx.empty()) gemm::matmul_f32(dx.data(), g.data(), w.f32_values.data(), dx_shape, accumulate_dx);
    dist::tree_sum_leaves(dw, leaves, [&](int64_t l, std::span<float> out) {
      gemm::matmul_f32(out.data(), x.f32_values.data() + l * rows * K, g.data() + l * rows * N, dw_shape);
    }, ws.tree_scratch);
    return;
  }
  // G in bf16 lives only for this call: one buffer per thread for every layer (a workspace
  // each would hold a (T, N) copy per layer kind, 0.3 GB at `wide`).
  thread_local std::vector<bf16> g_bf16;
  thread_local std::vector<float> g_widened;
  to_bf16(g_bf16, g_widened, g);
  const gemm::Bf16Operand gq = bf16_operand(g_bf16, g_widened);
  if (!dx.empty()) {
    gemm::matmul_bf16(dx.data(), gq, bf16_operand(w.bf16_values, w.f32_values), dx_shape,
                      accumulate_dx);
  }
  const gemm::Bf16Operand xq = bf16_operand(x.bf16_values, x.f32_values);
  dist::tree_sum_leaves(dw, leaves, [&](int64_t l, std::span<float> out) {
    const auto leaf = [&](const gemm::Bf16Operand& op, int64_t cols) {
      return gemm::Bf16Operand{op.values ? op.values + l * rows * cols : nullptr,
                               op.widened ? op.widened + l * rows * cols : nullptr};
    };
    gemm::matmul_bf16(out.data(), leaf(xq, K), leaf(gq, N), dw_shape);
  }, ws.tree_scratch);
}

}  // namespace

void linear_backward(std::span<float> dx, std::span<float> dw, std::span<const float> g,
                     const LinearInput& x, const LinearWeight& w, const LinearBackwardConfig& config,
                     LinearWorkspace& ws) {
  check_modes(x, w, "linear_backward");
  const int64_t T = x.tokens, K = x.features, N = w.out, S = config.tokens_per_example;
  expect_size("linear_backward", "G", g.size(), T * N);
  expect_size("linear_backward", "dW", dw.size(), K * N);
  if (!dx.empty()) expect_size("linear_backward", "dX", dx.size(), T * K);
  const BatchPlacement& place = config.placement;
  if (place.leaves < 1 || S < 1 || (T / S) % place.leaves != 0) {
    throw Error("linear_backward: " + std::to_string(place.leaves) + " reduction leaves do not divide the " +
                std::to_string(S >= 1 ? T / S : 0) + " examples of the batch");
  }
  if (!is_int8(x.mode)) {
    PhaseClock clock(ws.times);
    float_backward(dx, dw, g, x, w, config.accumulate_dx, place.leaves, ws);
    clock.lap(&PhaseTimes::gemm);
    return;
  }
  const bool correct_dx = config.correction != Correction::kNone && !dx.empty();
  const bool correct_dw = config.correction == Correction::kTwoWay;
  const BackwardProbe* probe = ws.probe;
  if (probe != nullptr) {
    if (probe->telemetry != nullptr) {
      probe->telemetry->push_back(grad_telemetry(g, T, N, x.scales, w.scales, config.layer_index));
    }
    if (probe->exact_grad) {
      exact_int8_backward(dx, dw, g, x, w, config.accumulate_dx, ws);
      return;
    }
    if (probe->dw_rounding && config.correction != Correction::kNone) {
      throw Error("linear_backward: a probe's separate dW rounding needs correction none");
    }
  }
  PhaseClock clock(ws.times);

  // One (sr: two) quantization of G' = sx G sw, with the statistics when a correction wants them.
  QuantizedGrad& q = ws.grad;
  dist::Communicator* group = place.group != nullptr && place.group->size() > 1 ? place.group : nullptr;
  quantize_gradient(q, g, T, N, x.scales, w.scales,
                    GradQuantConfig{grad_rounding(x.mode), S, config.layer_key,
                                    config.correction != Correction::kNone, place.first_token, group});
  clock.lap(&PhaseTimes::quantize_grad);
  const float D = q.step;
  const int64_t B = T / S;
  const auto& k = kernels::active_kernels();

  if (D == 0.0f) {  // every gradient of this layer is exactly 0
    if (!dx.empty() && !config.accumulate_dx) std::fill(dx.begin(), dx.end(), 0.0f);
    std::fill(dw.begin(), dw.end(), 0.0f);
    return;
  }

  if (!dx.empty()) {
    // acc = Q Wq^T exactly in int32, then one pass: dX (+)= (D acc - [Wq a_b + (c - m) rowsum]) / sx.
    ws.acc.resize(static_cast<size_t>(T * K));
    gemm::matmul_s8(ws.acc.data(), q.codes_for_dx().data(), w.codes.data(), {T, K, N, false, true});
    clock.lap(&PhaseTimes::gemm);
    const float* wa = nullptr;
    if (correct_dx) {
      const ErrorStats& st = q.stats_for_dx();
      ws.wa.resize(static_cast<size_t>(B * K));
      ws.delta.resize(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) ws.delta[t] = st.token_mean[t] - st.grand_mean[t / S];
      parallel_blocks(K, 64, [&](int64_t k0, int64_t k1) {
        k.gemv_s8_f32(ws.wa.data(), w.codes.data(), st.channel_mean.data(), B, K, N, k0, k1);
      });
      wa = ws.wa.data();
      clock.lap(&PhaseTimes::correction);
    }
    parallel_blocks(T, kRowBlock, [&](int64_t t0, int64_t t1) {
      k.dx_epilogue(dx.data(), ws.acc.data(), t0, t1, K, D, x.scales.data(), wa, ws.delta.data(),
                    w.code_row_sums.data(), S, config.accumulate_dx);
    });
    clock.lap(&PhaseTimes::gemm);
  }

  // dW = (D / sw) * Xq^T Q, the column scale fused into the int8 product. Over a group of ranks
  // the int32 sums are added first (exact, so the same as one process's) and scaled once:
  // float(sum) * (D / sw), the fused product's contract (s3r/gemm/matmul.hpp).
  const std::vector<int8_t>* dw_codes = &q.codes_for_dw();
  if (probe != nullptr && probe->dw_rounding) {  // causal ablation: G quantized again for dW
    quantize_gradient(ws.grad_dw, g, T, N, x.scales, w.scales,
                      GradQuantConfig{*probe->dw_rounding, S, fold_in(config.layer_key, 1), false,
                                      place.first_token, group});
    dw_codes = &ws.grad_dw.codes_for_dw();  // same D: it depends only on G'
  }
  ws.col_scale.resize(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) ws.col_scale[n] = D / w.scales[n];
  if (group == nullptr) {
    gemm::matmul_s8_scaled(dw.data(), x.codes.data(), dw_codes->data(), {K, N, T, true, false},
                           nullptr, ws.col_scale.data());
  } else {
    ws.dw_acc.resize(static_cast<size_t>(K * N));
    gemm::matmul_s8(ws.dw_acc.data(), x.codes.data(), dw_codes->data(), {K, N, T, true, false});
    group->sum(ws.dw_acc);
    const int32_t* acc = ws.dw_acc.data();
    const float* cs = ws.col_scale.data();
#pragma omp parallel for schedule(static)
    for (int64_t kk = 0; kk < K; ++kk) {
      for (int64_t n = 0; n < N; ++n) dw[kk * N + n] = static_cast<float>(acc[kk * N + n]) * cs[n];
    }
  }
  clock.lap(&PhaseTimes::gemm);

  if (correct_dw) {
    // dW[k, n] -= (1/sw[n]) sum_b (u_b[k] a[b, n] + v_b[k]) as one rank-(Bg+1) f32 product
    // U^T A with U = [u_0 .. u_{Bg-1}; sum_b v_b] (Bg+1, K) and A = -[a_b / sw ; 1 / sw]
    // (Bg+1, N), over the Bg examples of the group: the per-example factors u_b, v_b and a_b are
    // gathered from every rank (SPEC section 6), and every rank forms the same product.
    const ErrorStats& st = q.stats_for_dw();
    ws.u_local.assign(static_cast<size_t>(2 * B * K), 0.0f);
    float* u_loc = ws.u_local.data();
    float* v_loc = u_loc + B * K;
    const int8_t* xq = x.codes.data();
    parallel_blocks(K, 256, [&](int64_t k0, int64_t k1) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t b = t / S;
        const float d = st.token_mean[t] - st.grand_mean[b];
        for (int64_t kk = k0; kk < k1; ++kk) {
          const float xv = xq[t * K + kk];
          u_loc[b * K + kk] += xv;  // exact: integers below 2^24 for S * 127 < 2^24
          v_loc[b * K + kk] += xv * d;
        }
      }
    });
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
    gemm::matmul_f32(dw.data(), ws.u.data(), ws.a_scaled.data(), {K, N, Bg + 1, true, false},
                     /*accumulate=*/true);
    clock.lap(&PhaseTimes::correction);
  }
}

}  // namespace s3r::nn
