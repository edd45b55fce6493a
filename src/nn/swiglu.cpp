// SwiGLU feed-forward block; see s3r/nn/swiglu.hpp.
#include "s3r/nn/swiglu.hpp"

#include <algorithm>
#include <sstream>
#include <vector>

#include "core/parallel_blocks.hpp"
#include "kernels/dispatch.hpp"
#include "nn/phase_clock.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/work.hpp"

namespace s3r::nn {

namespace {

constexpr int64_t kChunk = 1 << 14;  // elements per OpenMP task of the elementwise passes

// The int8 gradient quantizers' pass 1 over dh1 and dh3 (s3r/quant/grad_quant.hpp:
// GradAbsMax), taken by the pass that writes them.
struct GatedGradMax {
  bool taken = false;
  GradAbsMax gate, up;
};

// dh1, dh3 (T, F) from d_hidden, h1, h3, in blocks of kMaxRows rows. In the int8 modes each
// block's rows are then read again while still in the caches, for the maxima that the gate's and
// the up projection's gradient quantizers would otherwise read them from memory for (`small`:
// two 12.6 MB gradients per layer). On the Emerald Rapids VM (`bench step --preset small
// --configs s3r+dx`, four alternations) the quantize-dY phase took 24.4-25.5 ms against
// 30.4-32.2, this pass 2.5 ms more, the step 278-284 against 282-288.
GatedGradMax gated_backward_ew(AlignedVector<float>& dh1, AlignedVector<float>& dh3,
                               const AlignedVector<float>& d_hidden, const SwigluState& st) {
  constexpr int64_t kMaxRows = 16;  // 2 x 16 x F floats of dh1, dh3: 96 KB at F = 768
  const int64_t T = st.tokens, F = st.ffn_width;
  PhaseZone zone(st.times, &PhaseTimes::elementwise);
  const auto& k = kernels::active_kernels();
  const auto ew = st.activation == GatedActivation::kSilu ? k.swiglu_backward_ew : k.geglu_backward_ew;
  const bool take = is_int8(st.x_in.mode);
  // d_hidden, h1, h3 read; dh1, dh3 written. (The maxima read a block's dh1, dh3 again while
  // they are in the caches: not memory traffic, and the roofline counts a call's bytes at one
  // level, so they are not counted.)
  work::add_floats(static_cast<uint64_t>(5 * T * F));
  const int64_t blocks = (T + kMaxRows - 1) / kMaxRows;
  std::vector<GatedGradMax> part(static_cast<size_t>(take ? blocks : 0));
  parallel_blocks(T, kMaxRows, [&](int64_t t0, int64_t t1) {
    ew(dh1.data(), dh3.data(), d_hidden.data(), st.h1.data(), st.h3.data(), t0 * F, t1 * F);
    if (!take) return;
    GatedGradMax& m = part[static_cast<size_t>(t0 / kMaxRows)];
    m.gate = grad_absmax_rows(dh1, F, st.x_in.scales, st.gate_w.scales, t0, t1);
    m.up = grad_absmax_rows(dh3, F, st.x_in.scales, st.up_w.scales, t0, t1);
  });
  GatedGradMax out;
  out.taken = take;
  for (const GatedGradMax& m : part) {
    out.gate.add(m.gate);
    out.up.add(m.up);
  }
  return out;
}

}  // namespace

void swiglu_forward(std::span<float> y, std::span<const float> x, const SwigluWeights& w,
                    int64_t tokens, int64_t width, int64_t ffn_width, LinearMode mode,
                    SwigluState& st, SwigluScratch& scratch, GatedActivation activation, int64_t row_phase) {
  const int64_t T = tokens, C = width, F = ffn_width;
  expect_size("swiglu", "X", x.size(), T * C);
  expect_size("swiglu", "Y", y.size(), T * C);
  expect_size("swiglu", "W1 (gate)", w.gate.size(), C * F);
  expect_size("swiglu", "W3 (up)", w.up.size(), C * F);
  expect_size("swiglu", "W2 (down)", w.down.size(), F * C);
  st.mode = mode;
  st.activation = activation;
  st.tokens = T;
  st.width = C;
  st.ffn_width = F;
  st.h1.resize(static_cast<size_t>(T * F));
  st.h3.resize(static_cast<size_t>(T * F));
  AlignedVector<float>& hidden = scratch.hidden;
  hidden.resize(static_cast<size_t>(T * F));
  {
    PhaseZone zone(st.times, &PhaseTimes::prepare);
    prepare_input(st.x_in, x, T, C, mode, "ffn.X");
    st.x_in.row_phase = row_phase;
    prepare_weight(st.gate_w, w.gate, C, F, mode, "ffn.W1 (gate)");
    prepare_weight(st.up_w, w.up, C, F, mode, "ffn.W3 (up)");
    prepare_weight(st.down_w, w.down, F, C, mode, "ffn.W2 (down)");
  }
  {
    PhaseZone zone(st.times, &PhaseTimes::gemm);
    linear_forward(st.h1, st.x_in, st.gate_w);  // h1 = X W1
    linear_forward(st.h3, st.x_in, st.up_w);    // h3 = X W3
  }
  {
    PhaseZone zone(st.times, &PhaseTimes::elementwise);
    const auto& k = kernels::active_kernels();
    const auto ew = activation == GatedActivation::kSilu ? k.swiglu_forward_ew : k.geglu_forward_ew;
    work::add_floats(static_cast<uint64_t>(3 * T * F));  // h1, h3 read; hidden written
    parallel_blocks(T * F, kChunk, [&](int64_t i0, int64_t i1) {  // hidden = act(h1) * h3
      ew(hidden.data(), st.h1.data(), st.h3.data(), i0, i1);
    });
  }
  {
    PhaseZone zone(st.times, &PhaseTimes::prepare);
    prepare_input(st.hidden_in, hidden, T, F, mode, "ffn.hidden");
    st.hidden_in.row_phase = row_phase;
  }
  PhaseZone zone(st.times, &PhaseTimes::gemm);
  linear_forward(y, st.hidden_in, st.down_w);  // Y = hidden W2
}

void swiglu_backward(std::span<float> dx, const SwigluGrads& grads, std::span<const float> dy,
                     Correction correction, int64_t tokens_per_example, Key step_key,
                     uint32_t first_layer, SwigluState& st, SwigluScratch& scratch,
                     const BatchPlacement& placement) {
  const int64_t T = st.tokens, C = st.width, F = st.ffn_width;
  expect_size("swiglu", "dY", dy.size(), T * C);
  if (!dx.empty()) expect_size("swiglu", "dX", dx.size(), T * C);
  AlignedVector<float>&d_hidden = scratch.d_hidden, &dh1 = scratch.dh1, &dh3 = scratch.dh3;
  d_hidden.resize(static_cast<size_t>(T * F));
  dh1.resize(static_cast<size_t>(T * F));
  dh3.resize(static_cast<size_t>(T * F));
  LinearWorkspace& ws = scratch.ws;
  ws.times = st.times;
  LinearBackwardConfig cfg{correction, tokens_per_example, fold_in(step_key, first_layer + 2), false,
                           first_layer + 2, placement};

  // Y = hidden W2
  linear_backward(d_hidden, grads.down, dy, st.hidden_in, st.down_w, cfg, ws);

  // hidden = act(h1) * h3:  dh3 = d_hidden act(h1),  dh1 = d_hidden h3 act'(h1),
  // silu'(z) = sigmoid(z) (1 + z (1 - sigmoid(z))); gelu' as kernels.hpp says.
  const GatedGradMax maxima = gated_backward_ew(dh1, dh3, d_hidden, st);

  // h1 = X W1, h3 = X W3: both add into dX.
  cfg.layer_key = fold_in(step_key, first_layer);
  cfg.layer_index = first_layer;
  cfg.g_absmax = maxima.taken ? &maxima.gate : nullptr;
  linear_backward(dx, grads.gate, dh1, st.x_in, st.gate_w, cfg, ws);
  cfg.layer_key = fold_in(step_key, first_layer + 1);
  cfg.layer_index = first_layer + 1;
  cfg.accumulate_dx = true;
  cfg.g_absmax = maxima.taken ? &maxima.up : nullptr;
  linear_backward(dx, grads.up, dh3, st.x_in, st.up_w, cfg, ws);
}

}  // namespace s3r::nn
