// Inference with a KV cache; see s3r/infer/decoder.hpp.
#include "s3r/infer/decoder.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <tuple>

#include "core/parallel_blocks.hpp"
#include "kernels/dispatch.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/model/layers.hpp"
#include "s3r/nn/moe.hpp"
#include "s3r/nn/quant_linear.hpp"

namespace s3r::infer {

using nn::LinearMode;

Precision parse_precision(const std::string& name) {
  if (name == "trained") return Precision::kTrained;
  if (name == "f32") return Precision::kF32;
  throw Error("unknown precision '" + name + "'; expected trained or f32");
}

const char* to_string(Precision p) { return p == Precision::kTrained ? "trained" : "f32"; }

nn::Recipe inference_recipe(const nn::Recipe& trained, Precision precision) {
  return precision == Precision::kF32 ? nn::Recipe::make(LinearMode::kF32, nn::Correction::kNone) : trained;
}

LoadedCheckpoint load_for_inference(const std::string& dir) {
  LoadedCheckpoint out;
  const ckpt::CheckpointInfo info = ckpt::read_checkpoint_info(dir);
  model::ModelConfig c = info.model;
  c.batch = 1;  // only the weights are used: the smallest activations
  c.seq_len = 1;
  out.model = std::make_unique<model::Model>(c, info.recipe);
  out.info = ckpt::load_checkpoint_for_inference(dir, *out.model);
  return out;
}

struct Decoder::Impl {
  struct Layer {
    // The gains each RMSNorm applies (the family's offset added: Gemma's 1 + w); q_norm, k_norm
    // (HD) with QK-norm, attn_post, ffn_post with post-norms, else empty.
    AlignedVector<float> attn_norm, ffn_norm, q_norm, k_norm, attn_post, ffn_post;
    float rope_theta = 0;
    int64_t window = 0;
    std::array<nn::LinearWeight, model::kProjectionsPerBlock> w;  // by model::Projection
    const nn::LinearWeight& operator[](model::Projection p) const { return w[static_cast<size_t>(p)]; }
    AlignedVector<float> k_cache, v_cache;  // (context, Ckv)
    nn::MoeWeights moe;                   // a mixture of experts' router and experts (into the model's parameters)
  };
  model::ModelConfig cfg;
  LinearMode mode, head_mode;
  const float* tok_emb;
  AlignedVector<float> final_norm;
  float embed_scale = 1.0f;  // sqrt(C) with the family's embed_scale
  nn::LinearWeight head;
  std::vector<Layer> layers;
  // Scratch for n tokens (grown on demand).
  AlignedVector<float> x, xn, rstd, q, k, v, att, o, h1, h3, hidden, ff, logits;
  AlignedVector<float> qk_raw, qk_rstd;  // QK-norm: q or k before its norm, and its rstd
  AlignedVector<float> post_raw;         // post-norms: the output before its norm
  nn::LinearInput in, hid_in;
  std::vector<double> scores;
  nn::MoeState moe_state;  // a mixture of experts: one block at a time
  nn::MoeScratch moe_scratch;

  // The steps of feed() for n tokens at positions pos, pos + 1, ...: the scratch grown for them,
  // x += each block's attention and FFN, and the head's logits (all rows, or the last).
  void resize(int64_t n);
  void attention_block(Layer& L, int64_t l, int64_t pos, int64_t n);
  void ffn_block(const Layer& L, int64_t n);
  void head_logits(int64_t n, bool all_rows);
  // y (n, C) = rmsnorm(y) with the post-norm gains g (Gemma), in place; no-op without them.
  void post_norm(AlignedVector<float>& y, const AlignedVector<float>& g, int64_t n);
};

namespace {

const float* param(const model::Model& m, const model::ParamInfo& p) {
  return const_cast<model::Model&>(m).params().data() + p.offset;
}
const float* param(const model::Model& m, const std::string& name) { return param(m, m.param_info(name)); }

// The gain the RMSNorm `name` applies: the family's norm_offset + w, as Model::gain computes it.
AlignedVector<float> gain(const model::Model& m, const std::string& name) {
  const model::ParamInfo& p = m.param_info(name);
  const float base = m.config().traits().norm_offset;
  AlignedVector<float> g(static_cast<size_t>(p.size));
  for (int64_t i = 0; i < p.size; ++i) g[i] = base == 0.0f ? param(m, p)[i] : base + param(m, p)[i];
  return g;
}

// RoPE at absolute positions first, first + 1, ...: the model's rope_forward (layers.cpp) with
// positions taken from the cache instead of t % S; the same operations in the same order.
void rope_at(std::span<float> x, int64_t first, int64_t n, int64_t heads, int64_t head_dim, float theta) {
  const int64_t C = heads * head_dim, pairs = head_dim / 2;
  for (int64_t t = 0; t < n; ++t) {
    const double pos = static_cast<double>(first + t);
    for (int64_t i = 0; i < pairs; ++i) {
      const double freq = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / head_dim);
      const double angle = pos * freq;
      const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
      for (int64_t h = 0; h < heads; ++h) {
        float* p = x.data() + t * C + h * head_dim;
        const float a = p[2 * i], b = p[2 * i + 1];
        p[2 * i] = a * c - b * s;
        p[2 * i + 1] = a * s + b * c;
      }
    }
  }
}

// Causal attention of n new tokens at positions first, first + 1, ... over the cache up to each
// token's own position: scores as f32 products scaled as the model does (q . k) / sqrt(HD), the
// softmax and the weighted sum in double. q, att (n, NH HD); caches (context, NKV HD); query head
// h reads key/value head h / (NH / NKV), as the model's attention does.
// With a sliding window W > 0, the token at position i attends to positions i - W < j <= i only.
void cached_attention(std::span<float> att, std::span<const float> q, const AlignedVector<float>& k_cache,
                      const AlignedVector<float>& v_cache, int64_t first, int64_t n, const model::Architecture& a,
                      int64_t window) {
  const int64_t NH = a.heads, HD = a.head_dim(), Cq = a.q_width(), Ckv = a.kv_width(), group = a.heads / a.kv_heads;
  const double scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HD)));
  // One (token, head) per task; each task's arithmetic is its own.
  parallel_blocks(n * NH, 1, [&](int64_t task, int64_t) {
    const int64_t t = task / NH, h = task % NH, kv_offset = (h / group) * HD;
    const int64_t upto = first + t + 1, from = window > 0 ? std::max<int64_t>(0, upto - window) : 0;
    std::vector<double> s(static_cast<size_t>(upto));
    const float* qv = q.data() + t * Cq + h * HD;
    double mx = -INFINITY;
    for (int64_t j = from; j < upto; ++j) {
      const float* kv = k_cache.data() + j * Ckv + kv_offset;
      double dot = 0;
      for (int64_t d = 0; d < HD; ++d) dot += static_cast<double>(qv[d]) * kv[d];
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (int64_t j = from; j < upto; ++j) sum += (s[j] = std::exp(s[j] - mx));
    std::vector<double> acc(static_cast<size_t>(HD), 0.0);
    for (int64_t j = from; j < upto; ++j) {
      const float* vv = v_cache.data() + j * Ckv + kv_offset;
      const double pj = s[j] / sum;
      for (int64_t d = 0; d < HD; ++d) acc[d] += pj * vv[d];
    }
    float* out = att.data() + t * Cq + h * HD;
    for (int64_t d = 0; d < HD; ++d) out[d] = static_cast<float>(acc[d]);
  });
}

}  // namespace

Decoder::Decoder(const LoadedCheckpoint& w, Precision precision, int64_t context)
    : impl_(std::make_unique<Impl>()), context_(context) {
  Impl& m = *impl_;
  m.cfg = w.info.model;
  const int64_t C = m.cfg.width, Ckv = m.cfg.kv_width(), V = m.cfg.vocab;
  V_ = V;
  if (context < 1) throw Error("decoder: the context must hold at least one position, got " + std::to_string(context));
  const nn::Recipe recipe = inference_recipe(w.info.recipe, precision);
  m.mode = recipe.projections();
  m.head_mode = recipe.head();
  const model::Model& model = *w.model;
  const model::FamilyTraits& fam = m.cfg.traits();
  m.tok_emb = param(model, "tok_emb");
  m.final_norm = gain(model, "final_norm");
  if (fam.embed_scale) m.embed_scale = static_cast<float>(std::sqrt(static_cast<double>(C)));
  AlignedVector<float> tied;  // (C, V): the embedding transposed, for a tied head
  if (fam.tied_head) {
    tied.resize(static_cast<size_t>(C * V));
    model::transpose_into(tied.data(), m.tok_emb, V, C);
  }
  nn::prepare_weight(m.head, {fam.tied_head ? tied.data() : param(model, "lm_head"), size_t(C * V)}, C, V, m.head_mode,
                     "lm_head.W");
  m.layers.resize(static_cast<size_t>(m.cfg.layers));
  for (int64_t l = 0; l < m.cfg.layers; ++l) {
    Impl::Layer& L = m.layers[l];
    const std::string p = "blocks." + std::to_string(l) + ".";
    L.attn_norm = gain(model, p + "attn_norm");
    L.ffn_norm = gain(model, p + "ffn_norm");
    if (fam.qk_norm) {
      L.q_norm = gain(model, p + "attn.q_norm");
      L.k_norm = gain(model, p + "attn.k_norm");
    }
    if (fam.post_norms) {
      L.attn_post = gain(model, p + "attn_post_norm");
      L.ffn_post = gain(model, p + "ffn_post_norm");
    }
    if (fam.moe) {
      const auto span_of = [&](const std::string& name) {
        const model::ParamInfo& info = model.param_info(p + name);
        return std::span<const float>(param(model, info), size_t(info.size));
      };
      L.moe = {span_of("ffn.router"), span_of("ffn.experts.gate"), span_of("ffn.experts.up"),
               span_of("ffn.experts.down")};
    }
    L.rope_theta = m.cfg.rope_theta_of(l);
    L.window = m.cfg.window_of(l);
    L.k_cache.assign(static_cast<size_t>(context * Ckv), 0.0f);
    L.v_cache.assign(static_cast<size_t>(context * Ckv), 0.0f);
  }
  // Every block's projections, with the shapes of the parameter schema.
  for (const model::ParamInfo& p : model.param_table()) {
    if (p.role != model::ParamRole::kProjection || p.shape.size() != 2) continue;  // experts: moe_forward's
    nn::prepare_weight(m.layers[p.block].w[static_cast<size_t>(p.projection)], {param(model, p), size_t(p.size)},
                       p.shape[0], p.shape[1], m.mode, p.name + ".W");
  }
}

Decoder::~Decoder() = default;

void Decoder::Impl::resize(int64_t n) {
  const int64_t C = cfg.width, Cq = cfg.q_width(), Ckv = cfg.kv_width(), F = cfg.ffn_width;
  for (auto* b : {&x, &xn, &o, &ff}) b->resize(static_cast<size_t>(n * C));
  for (auto* b : {&q, &att}) b->resize(static_cast<size_t>(n * Cq));
  for (auto* b : {&k, &v}) b->resize(static_cast<size_t>(n * Ckv));
  for (auto* b : {&h1, &h3, &hidden}) b->resize(static_cast<size_t>(n * F));
  rstd.resize(static_cast<size_t>(n));
}

void Decoder::Impl::post_norm(AlignedVector<float>& y, const AlignedVector<float>& g, int64_t n) {
  if (g.empty()) return;
  const int64_t C = cfg.width;
  post_raw.assign(y.begin(), y.begin() + n * C);
  model::rmsnorm_forward(std::span<float>(y.data(), size_t(n * C)), std::span<float>(rstd.data(), size_t(n)),
                         post_raw, g, C, cfg.norm_eps);
}

void Decoder::Impl::attention_block(Layer& L, int64_t l, int64_t pos, int64_t n) {
  using P = model::Projection;
  const int64_t C = cfg.width, Cq = cfg.q_width(), Ckv = cfg.kv_width();
  const int64_t NH = cfg.heads, NKV = cfg.kv_heads, HD = cfg.head_dim();
  const std::string p = "blocks." + std::to_string(l) + ".";
  model::rmsnorm_forward(xn, rstd, x, L.attn_norm, C, cfg.norm_eps);
  nn::prepare_input(in, xn, n, C, mode, p + "attn.X");
  nn::linear_forward(q, in, L[P::kQ]);
  nn::linear_forward(k, in, L[P::kK]);
  nn::linear_forward(v, in, L[P::kV]);
  if (!L.q_norm.empty()) {  // QK-norm: RMSNorm over each head's HD elements, as the model does
    for (auto [y, g, heads] : {std::tuple{&q, &L.q_norm, NH}, std::tuple{&k, &L.k_norm, NKV}}) {
      qk_raw.assign(y->begin(), y->end());
      qk_rstd.resize(static_cast<size_t>(n * heads));
      model::rmsnorm_forward(*y, qk_rstd, qk_raw, *g, HD, cfg.norm_eps);
    }
  }
  rope_at(q, pos, n, NH, HD, L.rope_theta);
  rope_at(k, pos, n, NKV, HD, L.rope_theta);
  std::copy(k.begin(), k.end(), L.k_cache.begin() + pos * Ckv);
  std::copy(v.begin(), v.end(), L.v_cache.begin() + pos * Ckv);
  cached_attention(att, q, L.k_cache, L.v_cache, pos, n, cfg, L.window);
  nn::prepare_input(in, att, n, Cq, mode, p + "attn.o.X");
  nn::linear_forward(o, in, L[P::kO]);
  post_norm(o, L.attn_post, n);
  for (int64_t i = 0; i < n * C; ++i) x[i] += o[i];  // x is now the block's x_mid
}

void Decoder::Impl::ffn_block(const Layer& L, int64_t n) {
  using P = model::Projection;
  const int64_t C = cfg.width, F = cfg.ffn_width;
  model::rmsnorm_forward(xn, rstd, x, L.ffn_norm, C, cfg.norm_eps);
  if (cfg.traits().moe) {
    nn::moe_forward(ff, xn, L.moe, {n, C, F, cfg.experts, cfg.experts_used, n}, mode, 0, moe_state, moe_scratch);
  } else {
    nn::prepare_input(in, xn, n, C, mode, "ffn.X");
    nn::linear_forward(h1, in, L[P::kGate]);
    nn::linear_forward(h3, in, L[P::kUp]);
    const auto& kernels = kernels::active_kernels();
    (cfg.traits().gelu ? kernels.geglu_forward_ew : kernels.swiglu_forward_ew)(hidden.data(), h1.data(), h3.data(),
                                                                                0, n * F);  // act(h1) * h3
    nn::prepare_input(hid_in, hidden, n, F, mode, "ffn.hidden");
    nn::linear_forward(ff, hid_in, L[P::kDown]);
    post_norm(ff, L.ffn_post, n);
  }
  for (int64_t i = 0; i < n * C; ++i) x[i] += ff[i];
}

void Decoder::Impl::head_logits(int64_t n, bool all_rows) {
  const int64_t C = cfg.width, first = all_rows ? 0 : n - 1, rows = n - first;
  std::span<const float> last_x(x.data() + first * C, static_cast<size_t>(rows * C));
  std::span<float> xn_rows(xn.data(), static_cast<size_t>(rows * C));
  model::rmsnorm_forward(xn_rows, std::span<float>(rstd.data(), size_t(rows)), last_x, final_norm, C, cfg.norm_eps);
  nn::prepare_input(in, xn_rows, rows, C, head_mode, "lm_head.X");
  logits.resize(static_cast<size_t>(rows * cfg.vocab));
  nn::linear_forward(logits, in, head);
}

std::span<const float> Decoder::feed(std::span<const int32_t> tokens, AlignedVector<float>* all_logits) {
  Impl& m = *impl_;
  const int64_t n = static_cast<int64_t>(tokens.size()), C = m.cfg.width, V = m.cfg.vocab;
  if (n < 1) throw Error("decoder: no tokens to feed");
  if (pos_ + n > context_) {
    throw Error("decoder: " + std::to_string(pos_) + " + " + std::to_string(n) + " tokens exceed the context of " +
                std::to_string(context_) + " positions");
  }
  m.resize(n);
  model::embedding_forward(m.x, tokens, {m.tok_emb, size_t(V * C)}, V, C);
  if (m.embed_scale != 1.0f) model::scale_in_place(m.x, m.embed_scale);
  for (int64_t l = 0; l < m.cfg.layers; ++l) {
    m.attention_block(m.layers[l], l, pos_, n);
    m.ffn_block(m.layers[l], n);
  }
  pos_ += n;
  // The head on every row when all logits are wanted, else on the last one only.
  m.head_logits(n, all_logits != nullptr);
  if (all_logits) all_logits->assign(m.logits.begin(), m.logits.end());
  return {m.logits.data() + m.logits.size() - V, static_cast<size_t>(V)};
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

Sampler::Sampler(const SamplingOptions& o) : o_(o), rng_(o.seed) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    throw Error("--temperature must be a finite number >= 0, got " + std::to_string(o.temperature));
  }
  if (o.top_k < 0) throw Error("--top-k must be >= 0 (0: no limit), got " + std::to_string(o.top_k));
  if (!(o.top_p > 0 && o.top_p <= 1)) throw Error("--top-p must be in (0, 1], got " + std::to_string(o.top_p));
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (o_.temperature == 0) return argmax(logits);
  const int64_t V = static_cast<int64_t>(logits.size());
  work_.resize(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) work_[i] = {logits[i], static_cast<int32_t>(i)};
  const auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  const int64_t k = o_.top_k > 0 ? std::min(o_.top_k, V) : V;
  std::partial_sort(work_.begin(), work_.begin() + k, work_.end(), by_logit);
  work_.resize(static_cast<size_t>(k));
  std::vector<double> prob(static_cast<size_t>(k));
  const double mx = work_[0].first;
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += (prob[i] = std::exp((work_[i].first - mx) / o_.temperature));
  int64_t keep = k;
  if (o_.top_p < 1) {
    double cum = 0;
    for (int64_t i = 0; i < k; ++i) {
      cum += prob[i] / sum;
      if (cum >= o_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  const double total = std::accumulate(prob.begin(), prob.begin() + keep, 0.0);
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double cum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += prob[i];
    if (u < cum) return work_[i].second;
  }
  return work_[keep - 1].second;
}

}  // namespace s3r::infer
