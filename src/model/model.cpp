// The decoder's forward and backward passes; see s3r/model/model.hpp.
#include "s3r/model/model.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/parallel_blocks.hpp"
#include "model/model_block.hpp"
#include "nn/phase_clock.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/work.hpp"
#include "s3r/dist/tree_sum.hpp"
#include "s3r/gemm/backend.hpp"
#include "s3r/model/attention.hpp"
#include "s3r/model/layers.hpp"

namespace s3r::model {

using nn::LinearMode;

int64_t Model::add_param(const std::string& local, std::vector<int64_t> shape, ParamRole role, int64_t block,
                         Projection projection) {
  const int64_t offset = table_.empty() ? 0 : table_.back().offset + table_.back().size;
  int64_t size = 1;
  for (int64_t d : shape) size *= d;
  const bool decay = role == ParamRole::kProjection || role == ParamRole::kHead || role == ParamRole::kRouter;
  const std::string name = block >= 0 ? "blocks." + std::to_string(block) + "." + local : local;
  table_.push_back(ParamInfo{name, local, offset, size, std::move(shape), role, block, projection, decay});
  return offset;
}

const ParamInfo& Model::param_info(std::string_view name) const {
  for (const ParamInfo& p : table_) {
    if (p.name == name) return p;
  }
  throw Error("the model has no parameter '" + std::string(name) + "'");
}

std::string_view to_string(Projection p) {
  static constexpr std::string_view kNames[] = {"attn.q", "attn.k", "attn.v", "attn.o", "ffn.gate", "ffn.up",
                                                "ffn.down"};
  return kNames[static_cast<uint32_t>(p)];
}

int64_t Model::parameter_count(const Architecture& a) {
  const int64_t C = a.width, Cq = a.q_width(), Ckv = a.kv_width(), F = a.ffn_width, V = a.vocab;
  const int64_t qk_norm = a.traits().qk_norm ? 2 * a.head_dim() : 0;
  const int64_t norms = a.traits().post_norms ? 4 * C : 2 * C;
  const int64_t ffn = a.traits().moe ? a.experts * 3 * C * F + C * a.experts : 3 * C * F;  // experts and router
  return 2 * V * C + C + a.layers * (norms + qk_norm + 2 * C * Cq + 2 * C * Ckv + ffn);
}

int64_t Model::estimate_bytes(const ModelConfig& c, const nn::Recipe& recipe) {
  const double C = static_cast<double>(c.width), F = static_cast<double>(c.ffn_width);
  const double Ckv = static_cast<double>(c.kv_width()), Cq = static_cast<double>(c.q_width());
  const double V = static_cast<double>(c.vocab), T = static_cast<double>(c.tokens());
  const double S = static_cast<double>(c.seq_len), B = static_cast<double>(c.batch);
  const double NH = static_cast<double>(c.heads), L = static_cast<double>(c.layers);
  // Bytes per element of a projection's operand copies: int8 codes, bf16 (plus its f32 widening
  // where bf16 products are emulated), or f32.
  const bool emulated = gemm::bf16_backend() == gemm::Bf16Backend::kF32;
  const LinearMode mode = recipe.projections(), head_mode = recipe.head();
  const double operand = nn::is_int8(mode) ? 1.0 : mode == nn::LinearMode::kBf16 ? (emulated ? 6.0 : 2.0) : 4.0;
  const double head = head_mode == LinearMode::kF32 ? 4.0 : nn::is_int8(head_mode) ? 1.0 : (emulated ? 6.0 : 2.0);
  double f32 = 2.0 * static_cast<double>(parameter_count(c));  // parameters, gradients
  f32 += L * (4.0 * T * C + 2.0 * T * Cq + 2.0 * T * Ckv + 2.0 * T + B * NH * S);  // per block: saved activations
  if (c.traits().qk_norm) f32 += L * (T * (Cq + Ckv) + T * (NH + c.kv_heads)) + T * (Cq + Ckv);  // QK-norm
  if (c.traits().post_norms) f32 += L * (2.0 * T * C + 2.0 * T) + T * C;  // post-norms' inputs, d_post_
  // The FFN's rows: T, or T k (token, slot) rows over E experts' weights with a mixture of experts.
  const bool moe = c.traits().moe;
  const double R = moe ? T * static_cast<double>(c.experts_used) : T, Ex = moe ? static_cast<double>(c.experts) : 1.0;
  f32 += L * 2.0 * R * F + 4.0 * R * F;  // SwiGLU: h1, h3 per block; one scratch (hidden, gradients)
  if (moe) f32 += L * (2.0 * R * C + 2.0 * T * Ex) + 2.0 * R * C;  // sorted inputs, outputs; probabilities
  f32 += 4.0 * T * C + 2.0 * T * Cq + 2.0 * T * Ckv + T + 1.0 * T * V;  // final norm, gradients, logits
  double bytes = 4.0 * f32;
  bytes += L * operand * (T * C + T * Cq + R * C + R * F);     // quantized or rounded inputs
  bytes += L * operand * (2.0 * C * Cq + 2.0 * C * Ckv + 3.0 * C * F * Ex);  // quantized or rounded weights
  bytes += (4.0 + 1.0 + (nn::is_int8(mode) ? 0.0 : operand)) * R * F;  // the SwiGLU workspace
  bytes += head * (T * C + C * V);                           // LM head operands
  return static_cast<int64_t>(bytes);
}

Model::Model(const ModelConfig& config, const nn::Recipe& recipe)
    : cfg_(config), recipe_(recipe), mode_(recipe.projections()), head_mode_(recipe.head()),
      correction_(recipe.correction()) {
  cfg_.validate();
  const int64_t C = cfg_.width, Cq = cfg_.q_width(), Ckv = cfg_.kv_width(), F = cfg_.ffn_width, V = cfg_.vocab;
  const int64_t T = cfg_.tokens(), S = cfg_.seq_len, B = cfg_.batch, NH = cfg_.heads;
  // The parameter schema (s3r/model/params.hpp), in arena order.
  tok_emb_ = add_param("tok_emb", {V, C}, ParamRole::kEmbedding);
  blocks_.resize(static_cast<size_t>(cfg_.layers));
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    Block& b = blocks_[l];
    b.prefix = "blocks." + std::to_string(l) + ".";
    b.rope_theta = cfg_.rope_theta_of(l);
    b.window = cfg_.window_of(l);
    const auto projection = [&](Projection j, int64_t in, int64_t out) {
      return add_param(std::string(to_string(j)), {in, out}, ParamRole::kProjection, l, j);
    };
    b.attn_norm = add_param("attn_norm", {C}, ParamRole::kNorm, l);
    b.wq = projection(Projection::kQ, C, Cq);
    b.wk = projection(Projection::kK, C, Ckv);
    b.wv = projection(Projection::kV, C, Ckv);
    b.wo = projection(Projection::kO, Cq, C);
    if (cfg_.traits().qk_norm) {
      b.q_norm = add_param("attn.q_norm", {cfg_.head_dim()}, ParamRole::kNorm, l);
      b.k_norm = add_param("attn.k_norm", {cfg_.head_dim()}, ParamRole::kNorm, l);
      b.q_raw.resize(T * Cq);
      b.k_raw.resize(T * Ckv);
      b.q_rstd.resize(T * NH);
      b.k_rstd.resize(T * cfg_.kv_heads);
    }
    if (cfg_.traits().post_norms) {
      b.attn_post = add_param("attn_post_norm", {C}, ParamRole::kNorm, l);
      for (auto* v : {&b.o_raw, &b.f_raw}) v->resize(T * C);
      b.rstd_o.resize(T);
      b.rstd_f.resize(T);
    }
    b.ffn_norm = add_param("ffn_norm", {C}, ParamRole::kNorm, l);
    if (cfg_.traits().moe) {
      add_moe_params(b, l);
    } else {
      b.w_gate = projection(Projection::kGate, C, F);
      b.w_up = projection(Projection::kUp, C, F);
      b.w_down = projection(Projection::kDown, F, C);
    }
    if (cfg_.traits().post_norms) b.ffn_post = add_param("ffn_post_norm", {C}, ParamRole::kNorm, l);
    for (auto* v : {&b.x_in, &b.xn1, &b.x_mid, &b.xn2}) v->resize(T * C);
    b.q.resize(T * Cq);
    b.att.resize(T * Cq);
    b.k.resize(T * Ckv);
    b.v.resize(T * Ckv);
    b.rstd1.resize(T);
    b.rstd2.resize(T);
    b.lse.resize(B * NH * S);
  }
  final_norm_ = add_param("final_norm", {C}, ParamRole::kNorm);
  lm_head_ = add_param("lm_head", {C, V}, ParamRole::kHead);
  if (cfg_.traits().tied_head) {
    table_.back().tied = true;
    table_.back().decay = false;  // its gradient is the embedding's, which has no decay
  }
  if (cfg_.traits().post_norms) d_post_.resize(T * C);
  if (cfg_.traits().embed_scale) embed_scale_ = static_cast<float>(std::sqrt(static_cast<double>(C)));
  params_.assign(static_cast<size_t>(table_.back().offset + table_.back().size), 0.0f);
  grads_.assign(params_.size(), 0.0f);
  for (auto* v : {&x_final_, &xn_final_, &dx_, &dxn_}) v->resize(T * C);
  dq_.resize(T * Cq);
  datt_.resize(T * Cq);
  if (cfg_.traits().qk_norm) {
    dq_raw_.resize(T * Cq);
    dk_raw_.resize(T * Ckv);
  }
  dk_.resize(T * Ckv);
  dv_.resize(T * Ckv);
  rstd_final_.resize(T);
  logits_.resize(T * V);
  set_data_parallel(DataParallel{});
}

Model::~Model() = default;

void Model::set_backward_probe(const nn::BackwardProbe* probe) {
  ws_.probe = probe;
  ffn_scratch_.ws.probe = probe;
  moe_scratch_.ffn.ws.probe = probe;
}

void Model::set_capture_input_grads(bool on) { capture_input_grads_ = on; }

void Model::set_breakdown(StepBreakdown* breakdown) {
  breakdown_ = breakdown;
  nn::PhaseTimes* phases = breakdown ? &breakdown->projection_phases : nullptr;
  ws_.times = phases;
  for (Block& b : blocks_) b.ffn.times = b.moe.times = phases;
}

std::span<const float> Model::block_input_grad(int64_t layer) const {
  if (layer < 0 || layer >= cfg_.layers) {
    throw Error("block_input_grad: layer " + std::to_string(layer) + " outside [0, " +
                std::to_string(cfg_.layers) + ")");
  }
  return blocks_[layer].x_in_grad;
}

void Model::init_weights(uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const float residual_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(cfg_.layers));
  for (const ParamInfo& p : table_) {
    if (p.tied) continue;  // written from the embedding by every forward
    float* w = param(p.offset);
    const bool gain = p.role == ParamRole::kNorm;
    const bool residual = p.role == ParamRole::kProjection &&
                          (p.projection == Projection::kO || p.projection == Projection::kDown);
    for (int64_t i = 0; i < p.size; ++i) {
      w[i] = gain ? 1.0f - cfg_.traits().norm_offset : normal(gen) * (residual ? residual_scale : 1.0f);
    }
  }
}

void Model::set_data_parallel(const DataParallel& placement) {
  const int64_t leaves = placement.leaves ? placement.leaves : dist::default_leaves(cfg_.batch);
  if (leaves < 1 || cfg_.batch % leaves != 0 || placement.first_example < 0 || placement.step_tokens < 0) {
    throw Error("data parallel placement: " + std::to_string(leaves) + " reduction leaves for a batch of " +
                std::to_string(cfg_.batch) + " examples (they must divide it), first example " +
                std::to_string(placement.first_example));
  }
  dp_ = placement;
  dp_.leaves = leaves;
}

bool Model::reduced_over_group(size_t i) const {
  const ParamInfo& p = table_.at(i);
  if (!nn::is_int8(mode_)) return false;  // float modes: every gradient is a float partial
  return p.role == ParamRole::kProjection || (p.role == ParamRole::kHead && nn::is_int8(head_mode_));
}

double Model::group_loss() {
  dist::Communicator* group = dp_.group != nullptr && dp_.group->size() > 1 ? dp_.group : nullptr;
  std::span<const double> all = leaf_loss_;
  if (group != nullptr) {
    group_leaf_loss_.resize(leaf_loss_.size() * static_cast<size_t>(group->size()));
    group->all_gather<double>(leaf_loss_, group_leaf_loss_);
    all = group_leaf_loss_;
  }
  double total = 0.0;
  for (double l : all) total += l;  // leaves in global order: the same sum for any rank count
  return total / static_cast<double>(cfg_.tokens() * (group ? group->size() : 1));
}

double Model::forward(std::span<const int32_t> inputs, std::span<const int32_t> targets) {
  tokens_forwarded_ += static_cast<int64_t>(inputs.size());
  try {
    forward_local(inputs, targets);
  } catch (const NonFiniteError&) {
    // The other ranks wait for this rank's loss: send NaN (they skip the step too), then throw.
    if (dp_.group != nullptr && dp_.group->size() > 1) {
      std::fill(leaf_loss_.begin(), leaf_loss_.end(), std::nan(""));
      group_loss();
    }
    throw;
  }
  return group_loss();
}

// The passes below read as the layer list: one statement per phase, each timed by a scoped zone
// of the breakdown (no-ops without one).
using Zone = nn::PhaseZone<StepBreakdown>;
using B = StepBreakdown;

void Model::forward_local(std::span<const int32_t> inputs, std::span<const int32_t> targets) {
  leaf_loss_.assign(static_cast<size_t>(dp_.leaves), std::nan(""));
  const int64_t C = cfg_.width, V = cfg_.vocab, T = cfg_.tokens();
  if (inputs.size() != static_cast<size_t>(T) || targets.size() != static_cast<size_t>(T)) {
    throw Error("model forward: inputs and targets must hold B*S = " + std::to_string(T) + " tokens");
  }
  inputs_.assign(inputs.begin(), inputs.end());
  targets_.assign(targets.begin(), targets.end());
  {
    const Zone z(breakdown_, &B::embedding);
    embed_forward();
  }
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    attention_forward(blocks_[l]);
    ffn_forward(blocks_[l], l + 1 < cfg_.layers ? blocks_[l + 1].x_in : x_final_);
  }
  {
    const Zone z(breakdown_, &B::norms);
    rmsnorm_forward(xn_final_, rstd_final_, x_final_, gain(final_norm_, C), C, cfg_.norm_eps);
  }
  {
    const Zone z(breakdown_, &B::lm_head);
    head_forward();
  }
  // logits_ becomes dL/dlogits here: the backward starts from it, divided by the step's tokens.
  const Zone z(breakdown_, &B::cross_entropy);
  const int64_t step_tokens = dp_.step_tokens ? dp_.step_tokens : T;
  cross_entropy_fused(logits_, targets_, V, 1.0f / static_cast<float>(step_tokens), leaf_loss_);
}

// x = embedding rows of the inputs (times sqrt(C) with embed_scale).
void Model::embed_forward() {
  const int64_t C = cfg_.width, V = cfg_.vocab;
  AlignedVector<float>& x = blocks_.empty() ? x_final_ : blocks_[0].x_in;
  embedding_forward(x, inputs_, {param(tok_emb_), size_t(V * C)}, V, C);
  if (embed_scale_ != 1.0f) scale_in_place(x, embed_scale_);
}

// logits = xn_final W_head; a tied head's W is the embedding transposed, written here.
void Model::head_forward() {
  const int64_t C = cfg_.width, V = cfg_.vocab, T = cfg_.tokens();
  if (table_.back().tied) transpose_into(param(lm_head_), param(tok_emb_), V, C);
  nn::prepare_input(head_in_, xn_final_, T, C, head_mode_, "lm_head.X");
  nn::prepare_weight(head_w_, {param(lm_head_), size_t(C * V)}, C, V, head_mode_, "lm_head.W");
  nn::linear_forward(logits_, head_in_, head_w_);
}

std::span<const float> Model::gain(int64_t offset, int64_t n) {
  const float base = cfg_.traits().norm_offset;
  if (base == 0.0f) return {param(offset), size_t(n)};
  gain_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) gain_[i] = base + param(offset)[i];
  return gain_;
}

void Model::post_norm_forward(AlignedVector<float>& out, AlignedVector<float>& rstd, const AlignedVector<float>& raw,
                              int64_t norm) {
  const int64_t C = cfg_.width;
  rmsnorm_forward(out, rstd, raw, gain(norm, C), C, cfg_.norm_eps);
}

void Model::post_norm_backward(AlignedVector<float>& d_raw, const AlignedVector<float>& d_out,
                               const AlignedVector<float>& raw, const AlignedVector<float>& rstd, int64_t norm) {
  const int64_t C = cfg_.width;
  std::fill(d_raw.begin(), d_raw.end(), 0.0f);
  rmsnorm_backward(d_raw, {grad(norm), size_t(C)}, d_out, raw, gain(norm, C), rstd, C, dp_.leaves);
}

// x_mid = x_in + attention(rmsnorm(x_in)) W_o (with post-norms: + rmsnorm(attention(...) W_o)).
void Model::attention_forward(Block& b) {
  const int64_t C = cfg_.width, Cq = cfg_.q_width(), T = cfg_.tokens(), S = cfg_.seq_len;
  const int64_t NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim();
  {
    const Zone z(breakdown_, &B::norms);
    rmsnorm_forward(b.xn1, b.rstd1, b.x_in, gain(b.attn_norm, C), C, cfg_.norm_eps);
  }
  {
    const Zone z(breakdown_, &B::projections);
    qkv_forward(b);
  }
  if (b.q_norm >= 0) {
    const Zone z(breakdown_, &B::norms);
    qk_norm_forward(b);
  }
  {
    const Zone z(breakdown_, &B::rope);
    rope_forward(b.q, S, NH, HD, b.rope_theta);
    rope_forward(b.k, S, NKV, HD, b.rope_theta);
  }
  {
    const Zone z(breakdown_, &B::attention);
    flash_attention_forward(b.att, b.lse, b.q, b.k, b.v, S, NH, NKV, HD, b.window);
  }
  {
    const Zone z(breakdown_, &B::projections);
    const nn::PhaseZone<nn::PhaseTimes> prepare(projection_phases(), &nn::PhaseTimes::prepare);
    nn::prepare_input(b.o_in, b.att, T, Cq, mode_, b.prefix + "attn.o.X");
  }
  {
    const Zone z(breakdown_, &B::projections);
    const nn::PhaseZone<nn::PhaseTimes> gemm(projection_phases(), &nn::PhaseTimes::gemm);
    nn::linear_forward(b.attn_post >= 0 ? b.o_raw : b.x_mid, b.o_in, b.wo_w);
  }
  if (b.attn_post >= 0) {
    const Zone z(breakdown_, &B::norms);
    post_norm_forward(b.x_mid, b.rstd_o, b.o_raw, b.attn_post);
  }
  const Zone z(breakdown_, &B::residual);
  dist::add_into(b.x_mid, b.x_in);  // threaded, one addition per element
}

// q, k, v = X Wq, X Wk, X Wv with X = xn1 prepared once; all four weights prepared here (W_o's
// too: its input comes after the attention). Timed as operand preparation and GEMMs inside the
// `projections` phase, as the backward's and the FFN's projections are.
void Model::qkv_forward(Block& b) {
  const int64_t C = cfg_.width, Cq = cfg_.q_width(), Ckv = cfg_.kv_width(), T = cfg_.tokens();
  const std::string& p = b.prefix;
  {
    const nn::PhaseZone<nn::PhaseTimes> prepare(projection_phases(), &nn::PhaseTimes::prepare);
    nn::prepare_input(b.qkv_in, b.xn1, T, C, mode_, p + "attn.X");
    nn::prepare_weight(b.wq_w, {param(b.wq), size_t(C * Cq)}, C, Cq, mode_, p + "attn.q.W");
    nn::prepare_weight(b.wk_w, {param(b.wk), size_t(C * Ckv)}, C, Ckv, mode_, p + "attn.k.W");
    nn::prepare_weight(b.wv_w, {param(b.wv), size_t(C * Ckv)}, C, Ckv, mode_, p + "attn.v.W");
    nn::prepare_weight(b.wo_w, {param(b.wo), size_t(Cq * C)}, Cq, C, mode_, p + "attn.o.W");
  }
  const nn::PhaseZone<nn::PhaseTimes> gemm(projection_phases(), &nn::PhaseTimes::gemm);
  // With QK-norm, q and k come out of their norms (qk_norm_forward), from q_raw and k_raw.
  nn::linear_forward(b.q_norm >= 0 ? b.q_raw : b.q, b.qkv_in, b.wq_w);
  nn::linear_forward(b.q_norm >= 0 ? b.k_raw : b.k, b.qkv_in, b.wk_w);
  nn::linear_forward(b.v, b.qkv_in, b.wv_w);
}

// q = rmsnorm(q_raw) and k = rmsnorm(k_raw) over each head's HD elements (rows of HD), with the
// gains of HD shared by the heads.
void Model::qk_norm_forward(Block& b) {
  const int64_t HD = cfg_.head_dim();
  rmsnorm_forward(b.q, b.q_rstd, b.q_raw, gain(b.q_norm, HD), HD, cfg_.norm_eps);
  rmsnorm_forward(b.k, b.k_rstd, b.k_raw, gain(b.k_norm, HD), HD, cfg_.norm_eps);
}

// dq_ and dk_ (of the normed q, k) become dq_raw_ and dk_raw_; the gains' gradients add up over
// the rows, per reduction leaf (a leaf's tokens are whole rows of heads).
void Model::qk_norm_backward(Block& b) {
  const int64_t HD = cfg_.head_dim();
  std::fill(dq_raw_.begin(), dq_raw_.end(), 0.0f);
  std::fill(dk_raw_.begin(), dk_raw_.end(), 0.0f);
  rmsnorm_backward(dq_raw_, {grad(b.q_norm), size_t(HD)}, dq_, b.q_raw, gain(b.q_norm, HD), b.q_rstd, HD, dp_.leaves);
  rmsnorm_backward(dk_raw_, {grad(b.k_norm), size_t(HD)}, dk_, b.k_raw, gain(b.k_norm, HD), b.k_rstd, HD, dp_.leaves);
}

// out = x_mid + ffn(rmsnorm(x_mid)) (with post-norms: + rmsnorm(ffn(...))); ffn = SwiGLU or GeGLU.
void Model::ffn_forward(Block& b, AlignedVector<float>& out) {
  const int64_t C = cfg_.width, F = cfg_.ffn_width, T = cfg_.tokens();
  {
    const Zone z(breakdown_, &B::norms);
    rmsnorm_forward(b.xn2, b.rstd2, b.x_mid, gain(b.ffn_norm, C), C, cfg_.norm_eps);
  }
  if (b.router >= 0) {
    moe_forward(b, b.ffn_post >= 0 ? b.f_raw : out);
  } else {
    const Zone z(breakdown_, &B::ffn);
    nn::swiglu_forward(b.ffn_post >= 0 ? b.f_raw : out, b.xn2,
                       {{param(b.w_gate), size_t(C * F)}, {param(b.w_up), size_t(C * F)},
                        {param(b.w_down), size_t(F * C)}},
                       T, C, F, mode_, b.ffn, ffn_scratch_,
                       cfg_.traits().gelu ? nn::GatedActivation::kGeluTanh : nn::GatedActivation::kSilu);
  }
  if (b.ffn_post >= 0) {
    const Zone z(breakdown_, &B::norms);
    post_norm_forward(out, b.rstd_f, b.f_raw, b.ffn_post);
  }
  const Zone z(breakdown_, &B::residual);
  dist::add_into(out, b.x_mid);
}

nn::PhaseTimes* Model::projection_phases() const {
  return breakdown_ != nullptr ? &breakdown_->projection_phases : nullptr;
}

// The configuration of projection j's backward in block l: its threshold layer and key.
nn::LinearBackwardConfig Model::layer_backward(int64_t l, Projection j, bool accumulate_dx) const {
  const uint32_t index = layer_index(l, j);
  return nn::LinearBackwardConfig{correction_, cfg_.seq_len, fold_in(step_key_, index), accumulate_dx, index, place_};
}

void Model::backward(Key step_key) {
  const int64_t C = cfg_.width, V = cfg_.vocab;
  step_key_ = step_key;
  // Where this batch sits in the step: global token indices, the group, the reduction leaves.
  place_ = nn::BatchPlacement{dp_.group, static_cast<uint64_t>(dp_.first_example * cfg_.seq_len), dp_.leaves};
  {
    const Zone z(breakdown_, &B::zeroing);
    clear_accumulated_grads();
  }
  {
    const Zone z(breakdown_, &B::lm_head);
    // The bf16/f32 head draws no random bits; an int8 head is the layer after the blocks'.
    const uint32_t head_index = head_layer_index(cfg_.layers);
    const nn::LinearBackwardConfig head_cfg =
        nn::is_int8(head_mode_)
            ? nn::LinearBackwardConfig{correction_, cfg_.seq_len, fold_in(step_key, head_index), false, head_index, place_}
            : nn::LinearBackwardConfig{nn::Correction::kNone, cfg_.seq_len, step_key, false, -1, place_};
    nn::linear_backward(dxn_, {grad(lm_head_), size_t(C * V)}, logits_, head_in_, head_w_, head_cfg, head_ws_);
  }
  {
    const Zone z(breakdown_, &B::norms);
    rmsnorm_backward(dx_, {grad(final_norm_), size_t(C)}, dxn_, x_final_, gain(final_norm_, C), rstd_final_, C,
                     dp_.leaves);
  }
  for (int64_t l = cfg_.layers - 1; l >= 0; --l) {
    ffn_backward(l);
    attention_backward(l);
    if (capture_input_grads_) blocks_[l].x_in_grad = dx_;
  }
  {
    const Zone z(breakdown_, &B::embedding);
    if (embed_scale_ != 1.0f) scale_in_place(dx_, embed_scale_);  // d(embedding rows) = dx sqrt(C)
    embedding_backward({grad(tok_emb_), size_t(V * C)}, dx_, inputs_, C, dp_.leaves, &embedding_scratch_);
  }
  if (!dp_.defer_tied_fold) fold_tied_head();
}

void Model::fold_tied_head() {
  if (!table_.back().tied) return;
  const int64_t C = cfg_.width, V = cfg_.vocab;
  add_transposed(grad(tok_emb_), grad(lm_head_), C, V);  // dE[v, c] += dW[c, v]
  std::fill_n(grad(lm_head_), C * V, 0.0f);
}

// Every projection's and the LM head's backward overwrites its weight gradient; the embedding
// and the RMSNorm gains add into theirs (layers.hpp), and dx_ (dL/d(residual stream)) is
// accumulated: only those are cleared (the embedding's V x C and dx_'s T x C, not 4 bytes per
// parameter).
void Model::clear_accumulated_grads() {
  const int64_t C = cfg_.width, V = cfg_.vocab;
  const auto clear = [](float* data, int64_t n) {
    work::add_floats(static_cast<uint64_t>(n));
    parallel_blocks(n, int64_t{1} << 16, [&](int64_t i0, int64_t i1) { std::fill(data + i0, data + i1, 0.0f); });
  };
  clear(grad(tok_emb_), V * C);
  clear(dx_.data(), static_cast<int64_t>(dx_.size()));
  std::fill_n(grad(final_norm_), C, 0.0f);
  for (Block& b : blocks_) {
    std::fill_n(grad(b.attn_norm), C, 0.0f);
    std::fill_n(grad(b.ffn_norm), C, 0.0f);
    if (b.attn_post >= 0) {
      std::fill_n(grad(b.attn_post), C, 0.0f);
      std::fill_n(grad(b.ffn_post), C, 0.0f);
    }
    if (b.q_norm >= 0) {
      std::fill_n(grad(b.q_norm), cfg_.head_dim(), 0.0f);
      std::fill_n(grad(b.k_norm), cfg_.head_dim(), 0.0f);
    }
  }
}

// out = x_mid + swiglu(xn2): dx_ is d(out) and becomes d(x_mid).
void Model::ffn_backward(int64_t l) {
  const int64_t C = cfg_.width, F = cfg_.ffn_width;
  Block& b = blocks_[l];
  {
    // The FFN adds into d(x_mid) through xn2. Its three projections are the consecutive layers
    // gate, up, down (params.hpp).
    if (b.ffn_post >= 0) {
      const Zone zn(breakdown_, &B::norms);
      post_norm_backward(d_post_, dx_, b.f_raw, b.rstd_f, b.ffn_post);
    }
    if (b.router >= 0) {
      moe_backward(l, b.ffn_post >= 0 ? d_post_ : dx_);
    } else {
      const Zone z(breakdown_, &B::ffn);
      nn::swiglu_backward(dxn_, {{grad(b.w_gate), size_t(C * F)}, {grad(b.w_up), size_t(C * F)},
                               {grad(b.w_down), size_t(F * C)}},
                          b.ffn_post >= 0 ? d_post_ : dx_, correction_, cfg_.seq_len, step_key_,
                          layer_index(l, Projection::kGate), b.ffn, ffn_scratch_, place_);
    }
  }
  const Zone z(breakdown_, &B::norms);
  rmsnorm_backward(dx_, {grad(b.ffn_norm), size_t(C)}, dxn_, b.x_mid, gain(b.ffn_norm, C), b.rstd2, C, dp_.leaves);
}

// x_mid = x_in + attention(rmsnorm(x_in)) W_o: dx_ is d(x_mid) and becomes d(x_in).
void Model::attention_backward(int64_t l) {
  const int64_t C = cfg_.width, Cq = cfg_.q_width(), Ckv = cfg_.kv_width(), S = cfg_.seq_len;
  const int64_t NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim();
  Block& b = blocks_[l];
  if (b.attn_post >= 0) {
    const Zone z(breakdown_, &B::norms);
    post_norm_backward(d_post_, dx_, b.o_raw, b.rstd_o, b.attn_post);
  }
  {
    const Zone z(breakdown_, &B::projections);
    nn::linear_backward(datt_, {grad(b.wo), size_t(Cq * C)}, b.attn_post >= 0 ? d_post_ : dx_, b.o_in, b.wo_w,
                        layer_backward(l, Projection::kO, false), ws_);
  }
  {
    const Zone z(breakdown_, &B::attention);
    flash_attention_backward(dq_, dk_, dv_, datt_, b.att, b.q, b.k, b.v, b.lse, S, NH, NKV, HD, b.window);
  }
  {
    const Zone z(breakdown_, &B::rope);
    rope_backward(dq_, S, NH, HD, b.rope_theta);
    rope_backward(dk_, S, NKV, HD, b.rope_theta);
  }
  if (b.q_norm >= 0) {
    const Zone z(breakdown_, &B::norms);
    qk_norm_backward(b);
  }
  {
    const Zone z(breakdown_, &B::projections);
    const AlignedVector<float>& dq = b.q_norm >= 0 ? dq_raw_ : dq_;
    const AlignedVector<float>& dk = b.q_norm >= 0 ? dk_raw_ : dk_;
    nn::linear_backward(dxn_, {grad(b.wq), size_t(C * Cq)}, dq, b.qkv_in, b.wq_w, layer_backward(l, Projection::kQ, false), ws_);
    nn::linear_backward(dxn_, {grad(b.wk), size_t(C * Ckv)}, dk, b.qkv_in, b.wk_w, layer_backward(l, Projection::kK, true), ws_);
    nn::linear_backward(dxn_, {grad(b.wv), size_t(C * Ckv)}, dv_, b.qkv_in, b.wv_w, layer_backward(l, Projection::kV, true), ws_);
  }
  const Zone z(breakdown_, &B::norms);
  rmsnorm_backward(dx_, {grad(b.attn_norm), size_t(C)}, dxn_, b.x_in, gain(b.attn_norm, C), b.rstd1, C, dp_.leaves);
}

}  // namespace s3r::model
