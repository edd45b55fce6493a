#pragma once
// Llama-style decoder: token embedding; per block RMSNorm -> Q, K, V -> RoPE -> causal
// attention -> output projection -> residual; RMSNorm -> SwiGLU (gate, up, down) -> residual;
// final RMSNorm; untied LM head; mean cross-entropy. A family (config.hpp: FamilyTraits) adds to
// it: QK-norm (qwen3, gemma3); Gemma 3's gains 1 + w, RMSNorms of the attention's and the FFN's
// outputs before their residual adds, GeGLU, embeddings times sqrt(C), the LM head tied to the
// embedding, and local layers with a sliding window and their own RoPE base (docs/SPEC.md A.9).
//
// Attention is fused (s3r/model/attention.hpp): no (B, NH, S, S) tensor is kept. With
// kv_heads < heads (grouped-query attention) K and V have NKV HD columns and query head h reads
// key/value head h / (NH / NKV); Wk and Wv are (C, NKV HD).
// All seven projections of every block are QuantLinear in the recipe's mode and correction
// (s3r/nn/recipe.hpp). The embedding and the attention products run in f32 and the LM head in
// bf16 (f32 in f32 mode) in every mode, so mode comparisons measure only the quantized
// projections; with a /head-int8 recipe an int8 model's LM head is an eighth quantized projection
// (layer index 7 L).
// Threshold keys: layer index layer_index(l, p) = 7 l + p for projection p in (q, k, v, o, gate,
// up, down) of block l (s3r/model/params.hpp), layer key fold_in(fold_in(key(seed), step), index)
// (SPEC section 3).
//
// Parameters and gradients live in one f32 arena each (param_table() names every tensor);
// activations are allocated once at construction and reused every step.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/dist/communicator.hpp"
#include "s3r/model/config.hpp"
#include "s3r/model/layers.hpp"
#include "s3r/model/params.hpp"
#include "s3r/nn/moe.hpp"
#include "s3r/nn/quant_linear.hpp"
#include "s3r/nn/recipe.hpp"
#include "s3r/nn/swiglu.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r::model {

// Wall-clock milliseconds and work (s3r/core/work.hpp) per phase of forward + backward,
// accumulated while attached (Model::set_breakdown; `s3r bench step --breakdown`). The
// projections' own split (operand preparation, GEMMs, gradient quantization, corrections,
// SwiGLU's element-wise work) is in `projection_phases`; `projections` and `ffn` hold the whole
// calls.
struct StepBreakdown {
  work::Phase embedding;      // token embedding, forward and backward
  work::Phase norms;          // RMSNorm forward and backward
  work::Phase projections;    // the four attention projections (Q, K, V, O), forward and backward
  work::Phase rope;           // RoPE forward and backward
  work::Phase attention;      // causal softmax attention, forward and backward
  work::Phase residual;       // residual additions
  work::Phase ffn;            // SwiGLU blocks (gate, up, down and the element-wise work)
  work::Phase lm_head;        // the LM head's operands and products, forward and backward
  work::Phase cross_entropy;  // softmax, loss and its gradient
  work::Phase zeroing;        // clearing the gradients
  nn::PhaseTimes projection_phases;  // inside `projections` and `ffn`
  double total_ms() const {
    return embedding.ms + norms.ms + projections.ms + rope.ms + attention.ms + residual.ms + ffn.ms + lm_head.ms +
           cross_entropy.ms + zeroing.ms;
  }
};

// Where this model's batch sits in a data-parallel step (SPEC section 6; docs/DISTRIBUTED.md).
// The default is one process holding the whole step.
struct DataParallel {
  // The ranks that hold the rest of this batch: they share D, the int8 dW sums and the loss.
  // nullptr: this process holds the whole batch (it may still be one micro-batch of a step).
  dist::Communicator* group = nullptr;
  int64_t first_example = 0;  // global index of this batch's example 0 (thresholds, sr bits)
  int64_t step_tokens = 0;    // tokens of the whole step: the loss gradient is divided by it; 0: T
  int64_t leaves = 0;         // reduction leaves in this batch (dist/tree_sum.hpp); 0: default_leaves(B)
  // A tied LM head's gradient stays in its own slot after backward, for the caller to reduce like
  // the other gradients and fold once the step's is complete (fold_tied_head): the fold after the
  // reduction keeps the sums the same for any rank and micro-batch count. false: backward folds.
  bool defer_tied_fold = false;
};


class Model {
 public:
  // A Recipe is valid by construction, so a Model is never built in an invalid numerics state.
  Model(const ModelConfig& config, const nn::Recipe& recipe);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Parameters of a model of this configuration (the size of params()).
  static int64_t parameter_count(const Architecture& architecture);
  // Bytes a Model of this configuration and recipe holds once it has run a training step
  // (parameters, gradients, activations, quantized copies, workspaces), within about 30%
  // (tests/model checks it against the measured resident memory). The trainer adds AdamW's
  // moments and compares the sum with the available memory before it starts.
  static int64_t estimate_bytes(const ModelConfig& config, const nn::Recipe& recipe);

  // Normal(0, 0.02) matrices (output projections scaled by 1/sqrt(2L)), unit norm gains.
  void init_weights(uint32_t seed);

  std::span<float> params() { return params_; }
  std::span<float> grads() { return grads_; }
  const std::vector<ParamInfo>& param_table() const { return table_; }
  // The parameter named `name` (param_table()); throws s3r::Error naming it when there is none.
  const ParamInfo& param_info(std::string_view name) const;
  const ModelConfig& config() const { return cfg_; }
  const nn::Recipe& recipe() const { return recipe_; }

  // inputs, targets: (B*S) token ids. Returns the mean cross-entropy over the tokens of the
  // group (data_parallel().group: every rank's batch; else this batch), NaN on every rank when a
  // rank's loss is not finite. Throws s3r::Error on tokens outside the vocabulary and
  // NonFiniteError on non-finite activations (naming the tensor).
  double forward(std::span<const int32_t> inputs, std::span<const int32_t> targets);
  // The last forward's loss sums per reduction leaf of this batch (in token order, double).
  std::span<const double> leaf_losses() const { return leaf_loss_; }
  // Tokens all forward passes of this object have seen (a data-parallel rank's share of the work).
  int64_t tokens_forwarded() const { return tokens_forwarded_; }
  // Gradients of the last forward's loss into grads() (overwritten). step_key =
  // fold_in(key(seed), step). Throws NonFiniteGradient when a gradient is NaN/Inf.
  // With a group, the int8 projections' gradients come out reduced over it (reduced_over_group);
  // every other gradient is this process's partial, a subtree of the fixed leaf tree, which
  // Communicator::tree_sum completes.
  void backward(Key step_key);
  // With a tied LM head: its gradient (C, V) added, transposed, into the embedding's (V, C), then
  // cleared; no-op without one. backward calls it unless data_parallel().defer_tied_fold.
  void fold_tied_head();

  void set_data_parallel(const DataParallel& placement);
  const DataParallel& data_parallel() const { return dp_; }
  // Whether backward reduces param_table()[i]'s gradient over the group itself (the int8 modes'
  // projections: exact int32 sums) rather than leaving a float partial.
  bool reduced_over_group(size_t i) const;

  // Diagnostics (`s3r diag grad-error`; the trainer uses neither). A probe changes every int8
  // projection's backward (s3r/nn/backward_probe.hpp); nullptr restores the normal one. With
  // capture on, backward keeps dL/d(input of block l) for block_input_grad(l) (empty until then).
  void set_backward_probe(const nn::BackwardProbe* probe);
  void set_capture_input_grads(bool on);
  // Phase times of every later forward and backward are added to *breakdown (nullptr: off).
  void set_breakdown(StepBreakdown* breakdown);
  std::span<const float> block_input_grad(int64_t layer) const;

  // A mixture of experts (qwen3moe): the routing losses' coefficients (default 0.001 and 0), and
  // per block the last forward's expert load and load-balancing loss (its mean over examples;
  // k for a perfectly even routing), over every rank's examples: a collective that every rank
  // of the data-parallel group calls at the same point. Empty without experts.
  void set_moe_losses(const nn::MoeLossWeights& losses) { moe_losses_ = losses; }
  const nn::MoeLossWeights& moe_losses() const { return moe_losses_; }
  struct MoeTelemetry {
    std::vector<nn::ExpertLoad> load;
    std::vector<double> balance;
    std::vector<std::vector<int64_t>> rows;  // [block][expert] rows routed to the expert
  };
  MoeTelemetry moe_telemetry();

 private:
  struct Block;
  float* param(int64_t offset) { return params_.data() + offset; }
  float* grad(int64_t offset) { return grads_.data() + offset; }
  // Appends a parameter named `local` (inside block `block` when >= 0) to the schema.
  int64_t add_param(const std::string& local, std::vector<int64_t> shape, ParamRole role, int64_t block = -1,
                    Projection projection = {});
  // The passes, one function per sub-block (model.cpp).
  void forward_local(std::span<const int32_t> inputs, std::span<const int32_t> targets);
  void attention_forward(Block& b);
  void qkv_forward(Block& b);
  void qk_norm_forward(Block& b);
  void qk_norm_backward(Block& b);
  // The gain an RMSNorm applies: the parameter at `offset` (n values), or norm_offset + w in
  // gain_ (Gemma).
  std::span<const float> gain(int64_t offset, int64_t n);
  // out (T, C) = rmsnorm(raw) with the post-norm at `norm` (Gemma), forward and backward: d_raw
  // (zeroed here) from d_out.
  void post_norm_forward(AlignedVector<float>& out, AlignedVector<float>& rstd, const AlignedVector<float>& raw,
                         int64_t norm);
  void post_norm_backward(AlignedVector<float>& d_raw, const AlignedVector<float>& d_out,
                          const AlignedVector<float>& raw, const AlignedVector<float>& rstd, int64_t norm);
  void embed_forward();
  void head_forward();
  void ffn_forward(Block& b, AlignedVector<float>& out);
  // A mixture of experts' parameters (model_moe.cpp), its forward (out = the FFN's output) and
  // backward (d_out into dxn_).
  void add_moe_params(Block& b, int64_t layer);
  void moe_forward(Block& b, AlignedVector<float>& out);
  void moe_backward(int64_t layer, const AlignedVector<float>& d_out);
  void clear_accumulated_grads();
  void ffn_backward(int64_t layer);
  void attention_backward(int64_t layer);
  nn::LinearBackwardConfig layer_backward(int64_t layer, Projection p, bool accumulate_dx) const;
  nn::PhaseTimes* projection_phases() const;
  double group_loss();  // the mean of the group's leaf losses (all-gathered in rank order)

  ModelConfig cfg_;
  nn::Recipe recipe_;
  // recipe_'s parts, named for the many places that use them.
  nn::LinearMode mode_, head_mode_;  // the projections', the LM head's
  nn::Correction correction_;
  std::vector<ParamInfo> table_;
  AlignedVector<float> params_, grads_;
  int64_t tok_emb_ = 0, final_norm_ = 0, lm_head_ = 0;
  int64_t tokens_forwarded_ = 0;
  std::vector<Block> blocks_;

  // Activations and scratch (allocated once).
  std::vector<int32_t> inputs_, targets_;
  AlignedVector<float> x_final_, xn_final_, rstd_final_;
  AlignedVector<float> logits_;  // (T, V): the logits, then (cross_entropy_fused) their gradient
  AlignedVector<float> dx_, dxn_;              // (T, C)
  AlignedVector<float> dq_, datt_;             // (T, Cq)
  AlignedVector<float> dk_, dv_;               // (T, Ckv)
  AlignedVector<float> dq_raw_, dk_raw_;       // QK-norm: d(q), d(k) before their norms
  AlignedVector<float> d_post_;                // post-norms: d(output) before its norm (T, C)
  AlignedVector<float> gain_;                  // gain(): 1 + w of the norm at hand
  float embed_scale_ = 1.0f;                 // sqrt(C) with embed_scale, else 1
  Key step_key_{};                           // the running backward's step key
  nn::BatchPlacement place_;                 // ... and this batch's place in the step
  nn::LinearInput head_in_;
  nn::LinearWeight head_w_;
  nn::LinearWorkspace ws_, head_ws_;  // attention projections; LM head
  nn::SwigluScratch ffn_scratch_;     // every block's SwiGLU, one block at a time
  nn::MoeScratch moe_scratch_;        // every block's mixture of experts, likewise
  nn::MoeLossWeights moe_losses_{0.001f, 0.0f};
  StepBreakdown* breakdown_ = nullptr;
  bool capture_input_grads_ = false;
  DataParallel dp_;
  std::vector<double> leaf_loss_, group_leaf_loss_;
  LeafScratch embedding_scratch_;
};

}  // namespace s3r::model
