// The whole tiny model's loss gradient (f32 path) against central finite differences of a
// double-precision forward written here from the architecture's definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/model/model.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r::model {
namespace {

using Vec = std::vector<double>;

// Y (T, N) = X (T, K) W (K, N)
Vec matmul(const Vec& x, const double* w, int64_t T, int64_t K, int64_t N) {
  Vec y(T * N, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) y[t * N + n] += x[t * K + k] * w[k * N + n];
  return y;
}

// gain = offset + g (Gemma: 1 + g).
Vec rmsnorm(const Vec& x, const double* g, int64_t T, int64_t C, double eps, double offset = 0.0) {
  Vec y(x.size());
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += x[t * C + c] * x[t * C + c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    for (int64_t c = 0; c < C; ++c) y[t * C + c] = x[t * C + c] * r * (offset + g[c]);
  }
  return y;
}

// x (T, heads HD), RoPE base theta.
void rope(Vec& x, const ModelConfig& m, int64_t heads, double theta) {
  const int64_t HD = m.head_dim(), C = heads * HD;
  for (int64_t t = 0; t < m.tokens(); ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < HD / 2; ++i) {
        const double ang = static_cast<double>(t % m.seq_len) * std::pow(theta, -2.0 * i / HD);
        double* p = &x[t * C + h * HD + 2 * i];
        const double a = p[0], b = p[1];
        p[0] = a * std::cos(ang) - b * std::sin(ang);
        p[1] = a * std::sin(ang) + b * std::cos(ang);
      }
}

// q (T, NH HD); k, v (T, NKV HD): query head h reads key/value head h / (NH / NKV); with a window
// W > 0, query i attends to keys i - W < j <= i only.
Vec attention(const Vec& q, const Vec& k, const Vec& v, const ModelConfig& m, int64_t window) {
  const int64_t C = m.heads * m.head_dim(), HD = m.head_dim(), S = m.seq_len, Ckv = m.kv_heads * HD;
  Vec out(q.size(), 0.0);
  for (int64_t b = 0; b < m.batch; ++b)
    for (int64_t h = 0; h < m.heads; ++h)
      for (int64_t i = 0; i < S; ++i) {
        const int64_t g = h / (m.heads / m.kv_heads);
        Vec s(i + 1, 0.0);
        const int64_t j0 = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
        double mx = -1e300, sum = 0.0;
        for (int64_t j = j0; j <= i; ++j) {
          double d = 0.0;
          for (int64_t e = 0; e < HD; ++e) d += q[(b * S + i) * C + h * HD + e] * k[(b * S + j) * Ckv + g * HD + e];
          s[j] = d / std::sqrt(double(HD));
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = j0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int64_t j = j0; j <= i; ++j)
          for (int64_t e = 0; e < HD; ++e) out[(b * S + i) * C + h * HD + e] += s[j] / sum * v[(b * S + j) * Ckv + g * HD + e];
      }
  return out;
}

double gelu_tanh(double z) {
  return 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / std::acos(-1.0)) * (z + 0.044715 * z * z * z)));
}

// Qwen3-MoE's FFN (SPEC A.10) in double: softmax over xn Wr, the k most probable experts (ties:
// the lower index), weights renormalized over them, SwiGLU experts of (E, C, F), (E, F, C).
Vec moe_ffn(const Vec& xn, const ModelConfig& m, const double* router, const double* gate, const double* up,
            const double* down) {
  const int64_t T = m.tokens(), C = m.width, F = m.ffn_width, E = m.experts;
  const Vec z = matmul(xn, router, T, C, E);
  Vec y(T * C, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    Vec p(E);
    const double mx = *std::max_element(z.begin() + t * E, z.begin() + (t + 1) * E);
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(z[t * E + e] - mx);
    std::vector<int64_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double chosen = 0.0;
    for (int64_t j = 0; j < m.experts_used; ++j) chosen += p[order[j]];
    const Vec xt(xn.begin() + t * C, xn.begin() + (t + 1) * C);
    for (int64_t j = 0; j < m.experts_used; ++j) {
      const int64_t e = order[j];
      const Vec h1 = matmul(xt, gate + e * C * F, 1, C, F), h3 = matmul(xt, up + e * C * F, 1, C, F);
      Vec hidden(F);
      for (int64_t f = 0; f < F; ++f) hidden[f] = h1[f] / (1.0 + std::exp(-h1[f])) * h3[f];
      const Vec out = matmul(hidden, down + e * F * C, 1, F, C);
      for (int64_t c = 0; c < C; ++c) y[t * C + c] += p[e] / chosen * out[c];
    }
  }
  return y;
}

// The model's loss in double from a double copy of the parameter arena, written from each
// family's definition (Gemma 3: gains 1 + w, post-norms, GeGLU, embeddings times sqrt(C), the
// head tied to the embedding, local layers with their window and RoPE base 1e4).
double reference_loss(const ModelConfig& m, const std::map<std::string, ParamInfo>& info,
                      const Vec& params, const std::vector<int32_t>& in,
                      const std::vector<int32_t>& tg) {
  const int64_t T = m.tokens(), C = m.width, F = m.ffn_width, V = m.vocab;
  auto P = [&](const std::string& name) { return params.data() + info.at(name).offset; };
  const bool gemma = m.family == Family::kGemma3;
  const double off = gemma ? 1.0 : 0.0, scale = gemma ? std::sqrt(double(C)) : 1.0;
  Vec x(T * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) x[t * C + c] = P("tok_emb")[in[t] * C + c] * scale;
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    const bool local = gemma && m.window > 0 && (l + 1) % 6 != 0;
    const double theta = local ? 10000.0 : double(m.rope_theta);
    const Vec xn = rmsnorm(x, P(p + "attn_norm"), T, C, m.norm_eps, off);
    const int64_t Ckv = m.kv_width(), Cq = m.q_width();
    Vec q = matmul(xn, P(p + "attn.q"), T, C, Cq), k = matmul(xn, P(p + "attn.k"), T, C, Ckv);
    const Vec v = matmul(xn, P(p + "attn.v"), T, C, Ckv);
    if (m.traits().qk_norm) {  // each head's HD elements are one RMSNorm row
      q = rmsnorm(q, P(p + "attn.q_norm"), T * m.heads, m.head_dim(), m.norm_eps, off);
      k = rmsnorm(k, P(p + "attn.k_norm"), T * m.kv_heads, m.head_dim(), m.norm_eps, off);
    }
    rope(q, m, m.heads, theta);
    rope(k, m, m.kv_heads, theta);
    Vec o = matmul(attention(q, k, v, m, local ? m.window : 0), P(p + "attn.o"), T, Cq, C);
    if (gemma) o = rmsnorm(o, P(p + "attn_post_norm"), T, C, m.norm_eps, off);
    for (int64_t i = 0; i < T * C; ++i) x[i] += o[i];
    const Vec xn2 = rmsnorm(x, P(p + "ffn_norm"), T, C, m.norm_eps, off);
    Vec y;
    if (m.traits().moe) {
      y = moe_ffn(xn2, m, P(p + "ffn.router"), P(p + "ffn.experts.gate"), P(p + "ffn.experts.up"),
                  P(p + "ffn.experts.down"));
    } else {
      const Vec h1 = matmul(xn2, P(p + "ffn.gate"), T, C, F), h3 = matmul(xn2, P(p + "ffn.up"), T, C, F);
      Vec hidden(T * F);
      for (int64_t i = 0; i < T * F; ++i) hidden[i] = (gemma ? gelu_tanh(h1[i]) : h1[i] / (1.0 + std::exp(-h1[i]))) * h3[i];
      y = matmul(hidden, P(p + "ffn.down"), T, F, C);
    }
    if (gemma) y = rmsnorm(y, P(p + "ffn_post_norm"), T, C, m.norm_eps, off);
    for (int64_t i = 0; i < T * C; ++i) x[i] += y[i];
  }
  Vec head(C * V);  // (C, V): the untied head, or the embedding (V, C) transposed
  for (int64_t c = 0; c < C; ++c)
    for (int64_t v = 0; v < V; ++v) head[c * V + v] = gemma ? P("tok_emb")[v * C + c] : P("lm_head")[c * V + v];
  const Vec logits = matmul(rmsnorm(x, P("final_norm"), T, C, m.norm_eps, off), head.data(), T, C, V);
  double loss = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    double mx = -1e300, sum = 0.0;
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, logits[t * V + i]);
    for (int64_t i = 0; i < V; ++i) sum += std::exp(logits[t * V + i] - mx);
    loss += std::log(sum) + mx - logits[t * V + tg[t]];
  }
  return loss / T;
}

// For a few entries of every parameter tensor: central differences (h = 1e-4 (|w| + 0.1)) of the
// double loss against the f32 model's analytic gradient; allowed error 2e-3 of the tensor's
// gradient RMS plus 1e-3 relative (f32 rounding through two blocks is ~1e-5 relative; a wrong
// term or factor shows at O(RMS)). With 4 heads and 4, 2 or 1 key/value heads (multi-head,
// grouped-query and multi-query attention), explicit head sizes other than C / heads = 4 (6: Q
// wider than C; 2: narrower), Qwen3's QK-norm, Gemma 3's block, and Qwen3-MoE's experts.
class ModelGradientKv : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, Family>> {};

TEST_P(ModelGradientKv, F32GradientMatchesFiniteDifferencesOfADoubleForward) {
  ModelConfig m{{2, 16, 4, std::get<0>(GetParam()), 24, 19}, {6, 2}};
  m.head_size = std::get<1>(GetParam());
  m.family = std::get<2>(GetParam());
  if (m.family == Family::kGemma3) {  // six layers: five local (window 3 of S = 6), one global
    m.layers = 6;
    m.window = 3;
    m.rope_theta = m.traits().rope_theta;
  }
  if (m.traits().moe) {  // 4 experts, 2 per token; the routing losses off (their gradients: tests/nn/moe_test)
    m.experts = 4;
    m.experts_used = 2;
  }
  Model model(m, nn::Recipe::make(nn::LinearMode::kF32, nn::Correction::kNone));
  model.set_moe_losses({0.0f, 0.0f});
  model.init_weights(5);
  // Larger weights than the 0.02 init so that every path carries a visible gradient.
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (const ParamInfo& p : model.param_table()) {
    // Gains too, around their identity (1, or 0 with Gemma's 1 + w), so that a wrong offset shows.
    const float base = p.role == ParamRole::kNorm ? 1.0f - m.traits().norm_offset : 0.0f;
    for (int64_t i = 0; i < p.size; ++i) model.params()[p.offset + i] = base + normal(gen);
  }
  std::vector<int32_t> in(m.tokens()), tg(m.tokens());
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(m.vocab - 1));
  for (auto& t : in) t = tok(gen);
  for (auto& t : tg) t = tok(gen);
  const double loss = model.forward(in, tg);
  model.backward(key_from_seed(0));
  std::map<std::string, ParamInfo> info;
  for (const ParamInfo& p : model.param_table()) info[p.name] = p;
  Vec params(model.params().begin(), model.params().end());
  EXPECT_NEAR(loss, reference_loss(m, info, params, in, tg), 1e-5 * loss);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (const ParamInfo& p : model.param_table()) {
    if (p.tied) {  // its gradient went into the embedding's (checked there through the head's path)
      for (int64_t i = 0; i < p.size; ++i) ASSERT_EQ(model.grads()[p.offset + i], 0.0f) << p.name;
      continue;
    }
    double rms = 0.0;
    for (int64_t i = 0; i < p.size; ++i) rms += double(model.grads()[p.offset + i]) * model.grads()[p.offset + i];
    rms = std::sqrt(rms / p.size);
    ASSERT_GT(rms, 0.0) << p.name << " has an all-zero gradient";
    for (int trial = 0; trial < 4; ++trial) {
      const int64_t i = p.offset + static_cast<int64_t>(u(gen) * p.size);
      const double w = params[i], h = 1e-4 * (std::fabs(w) + 0.1);
      params[i] = w + h;
      const double lp = reference_loss(m, info, params, in, tg);
      params[i] = w - h;
      const double lm = reference_loss(m, info, params, in, tg);
      params[i] = w;
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(model.grads()[i], fd, 2e-3 * rms + 1e-3 * std::fabs(fd))
          << p.name << "[" << i - p.offset << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KvHeads, ModelGradientKv,
                         ::testing::Values(std::tuple{4, 0, Family::kLlama}, std::tuple{2, 0, Family::kLlama},
                                           std::tuple{1, 0, Family::kLlama}, std::tuple{2, 6, Family::kLlama},
                                           std::tuple{4, 2, Family::kLlama}, std::tuple{2, 6, Family::kQwen3},
                                           std::tuple{4, 0, Family::kQwen3}, std::tuple{2, 0, Family::kGemma3},
                                           std::tuple{2, 6, Family::kQwen3Moe}));

// /head-int8: the LM head becomes a quantized projection of an int8 model. The same weights and
// batch give a loss within 1% of the bf16 head's (int8 codes carry ~2^-8 relative error) but not
// equal to it (a choice that is ignored fails), a head gradient that points the same way (cosine
// > 0.99) without being the same. f32 and bf16 recipes cannot ask for it (nn::Recipe::make).
TEST(ModelGradient, Int8HeadQuantizesOnlyTheHeadOfInt8Models) {
  ModelConfig m{{2, 32, 2, 2, 48, 64}, {16, 2}};
  std::vector<int32_t> in(m.tokens()), tg(m.tokens());
  std::mt19937 gen(8);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(m.vocab - 1));
  for (auto& t : in) t = tok(gen);
  for (auto& t : tg) t = tok(gen);
  auto run = [&](nn::HeadChoice choice, AlignedVector<float>* grads) {
    Model model(m, nn::Recipe::make(nn::LinearMode::kS3r, nn::Correction::kDx, choice));
    model.init_weights(5);
    for (const ParamInfo& p : model.param_table()) {  // a head large enough to matter
      if (p.name == "lm_head") for (int64_t i = 0; i < p.size; ++i) model.params()[p.offset + i] *= 20.0f;
    }
    const double loss = model.forward(in, tg);
    model.backward(key_from_seed(1));
    const ParamInfo& head = model.param_table().back();
    EXPECT_EQ(head.name, "lm_head");
    grads->assign(model.grads().begin() + head.offset, model.grads().begin() + head.offset + head.size);
    return loss;
  };
  AlignedVector<float> g_default, g_int8;
  const double l_default = run(nn::HeadChoice::kDefault, &g_default);
  const double l_int8 = run(nn::HeadChoice::kInt8, &g_int8);
  EXPECT_NE(l_default, l_int8);
  EXPECT_NEAR(l_int8, l_default, 0.01 * l_default);
  double dot = 0.0, n1 = 0.0, n2 = 0.0;
  for (size_t i = 0; i < g_default.size(); ++i) {
    dot += double(g_default[i]) * g_int8[i];
    n1 += double(g_default[i]) * g_default[i];
    n2 += double(g_int8[i]) * g_int8[i];
  }
  EXPECT_GT(dot / std::sqrt(n1 * n2), 0.99);
  EXPECT_NE(g_default, g_int8);
  for (nn::LinearMode mode : {nn::LinearMode::kF32, nn::LinearMode::kBf16}) {
    EXPECT_THROW(nn::Recipe::make(mode, nn::Correction::kNone, nn::HeadChoice::kInt8), Error) << nn::to_string(mode);
  }
}

// The backward clears only the gradients that its layers add into (the embedding, the RMSNorm
// gains) and relies on every other layer overwriting its own. A model whose gradient buffer holds
// garbage before the backward must therefore end with the bits of a fresh model's gradient:
// a gradient that is added into without being cleared, or an element no layer writes, keeps
// some of the garbage. Batch 8: eight reduction leaves, tokens repeated, some rows never named.
TEST(ModelGradient, BackwardWritesEveryGradientWhateverTheBufferHeld) {
  ModelConfig m{{2, 32, 2, 2, 48, 64}, {16, 8}};
  std::vector<int32_t> in(m.tokens()), tg(m.tokens());
  std::mt19937 gen(9);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(m.vocab - 9));
  for (auto& t : in) t = tok(gen);
  for (auto& t : tg) t = tok(gen);
  for (nn::LinearMode mode : {nn::LinearMode::kF32, nn::LinearMode::kBf16, nn::LinearMode::kS3r}) {
    auto gradient = [&](float garbage) {
      Model model(m, nn::Recipe::make(mode, nn::is_int8(mode) ? nn::Correction::kTwoWay : nn::Correction::kNone));
      model.init_weights(5);
      std::fill(model.grads().begin(), model.grads().end(), garbage);
      model.forward(in, tg);
      model.backward(key_from_seed(1));
      return AlignedVector<float>(model.grads().begin(), model.grads().end());
    };
    const AlignedVector<float> fresh = gradient(0.0f), dirty = gradient(1234.5f);
    ASSERT_EQ(fresh.size(), dirty.size());
    Model names(m, nn::Recipe::make(mode, nn::Correction::kNone));
    for (const ParamInfo& p : names.param_table()) {
      for (int64_t i = p.offset; i < p.offset + p.size; ++i) {
        ASSERT_EQ(fresh[i], dirty[i]) << nn::to_string(mode) << ": " << p.name << "[" << i - p.offset << "]";
      }
    }
  }
}

}  // namespace
}  // namespace s3r::model
