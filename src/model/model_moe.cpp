// A mixture of experts in place of a block's FFN (qwen3moe; docs/SPEC.md A.10): its parameters,
// forward and backward inside the decoder (s3r/model/model.hpp, s3r/nn/moe.hpp).
#include <algorithm>
#include <span>

#include "model/model_block.hpp"
#include "nn/phase_clock.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/dist/communicator.hpp"
#include "s3r/model/model.hpp"

namespace s3r::model {

using Zone = nn::PhaseZone<StepBreakdown>;

// ffn.router (C, E) in f32; the experts' gate and up (E, C, F) and down (E, F, C), each one
// quantized projection per expert with the dense FFN's threshold layers (params.hpp).
void Model::add_moe_params(Block& b, int64_t l) {
  const int64_t C = cfg_.width, F = cfg_.ffn_width, E = cfg_.experts;
  b.router = add_param("ffn.router", {C, E}, ParamRole::kRouter, l);
  b.w_gate = add_param("ffn.experts.gate", {E, C, F}, ParamRole::kProjection, l, Projection::kGate);
  b.w_up = add_param("ffn.experts.up", {E, C, F}, ParamRole::kProjection, l, Projection::kUp);
  b.w_down = add_param("ffn.experts.down", {E, F, C}, ParamRole::kProjection, l, Projection::kDown);
}

void Model::moe_forward(Block& b, AlignedVector<float>& out) {
  const int64_t C = cfg_.width, F = cfg_.ffn_width, E = cfg_.experts;
  const Zone z(breakdown_, &StepBreakdown::ffn);
  const nn::MoeShape shape{cfg_.tokens(), C, F, E, cfg_.experts_used, cfg_.seq_len};
  nn::moe_forward(out, b.xn2,
                  {{param(b.router), size_t(C * E)}, {param(b.w_gate), size_t(E * C * F)},
                   {param(b.w_up), size_t(E * C * F)}, {param(b.w_down), size_t(E * F * C)}},
                  shape, mode_, static_cast<uint64_t>(dp_.first_example * cfg_.seq_len), b.moe, moe_scratch_,
                  dp_.group);
}

void Model::moe_backward(int64_t l, const AlignedVector<float>& d_out) {
  const int64_t C = cfg_.width, F = cfg_.ffn_width, E = cfg_.experts;
  Block& b = blocks_[l];
  const Zone z(breakdown_, &StepBreakdown::ffn);
  const int64_t step_tokens = dp_.step_tokens ? dp_.step_tokens : cfg_.tokens();
  nn::moe_backward(dxn_,
                   {{grad(b.router), size_t(C * E)}, {grad(b.w_gate), size_t(E * C * F)},
                    {grad(b.w_up), size_t(E * C * F)}, {grad(b.w_down), size_t(E * F * C)}},
                   d_out, correction_, step_key_, layer_index(l, Projection::kGate), moe_losses_,
                   1.0f / static_cast<float>(step_tokens), b.moe, moe_scratch_, place_);
}

Model::MoeTelemetry Model::moe_telemetry() {
  MoeTelemetry out;
  dist::Communicator* group = dp_.group != nullptr && dp_.group->size() > 1 ? dp_.group : nullptr;
  for (const Block& b : blocks_) {
    if (b.router < 0 || b.moe.expert_offsets.empty()) continue;
    const nn::MoeState& st = b.moe;
    std::vector<int32_t> rows(static_cast<size_t>(st.shape.experts));  // < 2^31: rows are T k
    for (size_t e = 0; e < rows.size(); ++e) rows[e] = static_cast<int32_t>(st.rows_of(static_cast<int64_t>(e)));
    std::vector<double> aux = st.aux_per_example;
    if (group != nullptr) {  // ranks hold contiguous examples in rank order
      group->sum(rows);
      std::vector<double> all(aux.size() * static_cast<size_t>(group->size()));
      group->all_gather_bytes(std::as_bytes(std::span<const double>(aux)), std::as_writable_bytes(std::span<double>(all)));
      aux = std::move(all);
    }
    out.rows.emplace_back(rows.begin(), rows.end());
    out.load.push_back(nn::expert_load(out.rows.back()));
    double sum = 0.0;  // in example order, as one process sums them
    for (const double a : aux) sum += a;
    out.balance.push_back(aux.empty() ? 0.0 : sum / static_cast<double>(aux.size()));
  }
  return out;
}

}  // namespace s3r::model
