// The layer's inputs of the quantized linear tests and the bit-defined steps of SPEC 1-3,
// recomputed with the layer's f32 operations (contracts in linear_problem.hpp).
#include "nn/linear_problem.hpp"

#include <algorithm>
#include <cmath>

#include "check_util.hpp"
#include "s3r/core/aligned_vector.hpp"

namespace s3r::nn::testing {

std::string Problem::shape() const {
  return s3r::testing::str("T=", T, " K=", K, " N=", N, " S=", S);
}

float sym_uniform(Key key, uint64_t i) {
  return static_cast<float>(random_bits32(key, i) >> 9) * 0x1p-23f * 2.0f - 1.0f;
}

Problem make_problem(int64_t T, int64_t K, int64_t N, int64_t S, uint32_t seed, bool zero_g) {
  Problem p{T, K, N, S, {}, {}, {}};
  const Key kx = fold_in(key_from_seed(seed), 1), kw = fold_in(key_from_seed(seed), 2),
            kg = fold_in(key_from_seed(seed), 3);
  p.x.resize(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      // sx = absmax/127 of order 1, like the zero row's scale 1: no token dominates D.
      const float mag = std::ldexp(1.0f, -static_cast<int>(t % 4)) * 100.0f;
      p.x[t * K + k] = t == 5 ? 0.0f : sym_uniform(kx, t * K + k) * mag;
    }
  }
  p.w.resize(static_cast<size_t>(K * N));
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) {
      const float mag = 0.05f * static_cast<float>(1 + n % 3);
      p.w[k * N + n] = n == 3 ? 0.0f : sym_uniform(kw, k * N + n) * mag;
    }
  }
  p.g.resize(static_cast<size_t>(T * N));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      const float mag = std::ldexp(1.0f, -2 * static_cast<int>(n % 5));
      p.g[t * N + n] = zero_g ? 0.0f : sym_uniform(kg, t * N + n) * mag;
    }
  }
  return p;
}

Problem shared_component_problem() {
  Problem p{32, 48, 128, 8, {}, {}, {}};
  const Key key = key_from_seed(4242);
  // Activations with a per-feature component common to all tokens (as outlier features of LLMs
  // have): nu_k + noise, so that sum_s Xq[s,k] E[s,n] adds the errors of an example coherently.
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t k = 0; k < p.K; ++k) {
      const float nu = sym_uniform(fold_in(key, 7), k);
      p.x.push_back(nu + sym_uniform(fold_in(key, 1), t * p.K + k));
    }
  }
  for (int64_t k = 0; k < p.K; ++k) {
    const float u = sym_uniform(fold_in(key, 2), k);
    const float mu = (u < 0.0f ? -0.5f : 0.5f) + 0.5f * u;  // |mu| in [0.5, 1), both signs
    for (int64_t n = 0; n < p.N; ++n) {
      p.w.push_back(mu + 0.1f * sym_uniform(fold_in(key, 3), k * p.N + n));
    }
  }
  // Near-Gaussian gradients (sum of three uniforms) with token scales 1/3, 2/3, 1: x = G'/D
  // covers many residuals.
  for (int64_t t = 0; t < p.T; ++t) {
    for (int64_t n = 0; n < p.N; ++n) {
      float v = 0.0f;
      for (uint32_t j = 4; j < 7; ++j) v += sym_uniform(fold_in(key, j), t * p.N + n);
      p.g.push_back(v * static_cast<float>(1 + t % 3) / 3.0f);
    }
  }
  return p;
}

Key make_layer_key(uint32_t seed, uint32_t step, uint32_t layer) {
  return fold_in(fold_in(key_from_seed(seed), step), layer);
}

float absmax_scale(float absmax) {
  const float s = absmax / 127.0f;
  return s > 0.0f ? s : 1.0f;
}

int8_t rne_code(float v) {
  return static_cast<int8_t>(std::clamp(std::nearbyint(v), -127.0f, 127.0f));
}

namespace {

// Scale and codes of each of `groups` groups of `count` elements: element i of group j is
// v[j * group_stride + i * stride] (X: a token's row; W: a column).
void quantize_groups(const AlignedVector<float>& v, int64_t groups, int64_t count,
                     int64_t group_stride, int64_t stride, std::vector<int8_t>& codes,
                     AlignedVector<float>& scales) {
  codes.resize(v.size());
  scales.resize(static_cast<size_t>(groups));
  for (int64_t j = 0; j < groups; ++j) {
    float absmax = 0.0f;
    for (int64_t i = 0; i < count; ++i) {
      absmax = std::max(absmax, std::fabs(v[j * group_stride + i * stride]));
    }
    scales[j] = absmax_scale(absmax);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t e = j * group_stride + i * stride;
      codes[e] = rne_code(v[e] / scales[j]);
    }
  }
}

}  // namespace

Operands forward_operands(const Problem& p) {
  const int64_t T = p.T, K = p.K, N = p.N;
  Operands o;
  quantize_groups(p.x, T, K, K, 1, o.xq, o.sx);
  quantize_groups(p.w, N, K, 1, N, o.wq, o.sw);
  o.rowsum.assign(static_cast<size_t>(K), 0);
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) o.rowsum[k] += o.wq[k * N + n];
  }
  return o;
}

float threshold_sr(Key key, uint64_t i) {
  return static_cast<float>(random_bits32(key, i) >> 9) * 0x1p-23f;
}
float threshold_7bit_of_index(uint32_t k) { return (static_cast<float>(k) + 0.5f) / 128.0f; }
float threshold_7bit(Key key, uint64_t i) {
  const uint32_t byte = (random_bits32(key, i / 4) >> (8 * (i % 4))) & 0xFFu;
  return threshold_7bit_of_index(byte >> 1);
}

int8_t floor_code(float x, float r) {
  const float sum = x + r;
  return static_cast<int8_t>(std::clamp(std::floor(sum), -127.0f, 127.0f));
}

GradCodes grad_codes(const Problem& p, const Operands& o, LinearMode mode, Key layer_key) {
  const int64_t T = p.T, N = p.N;
  GradCodes c;
  AlignedVector<float> gp(static_cast<size_t>(T * N));
  float absmax = 0.0f;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      gp[t * N + n] = (o.sx[t] * p.g[t * N + n]) * o.sw[n];
      absmax = std::max(absmax, std::fabs(gp[t * N + n]));
    }
  }
  c.D = absmax / 127.0f;
  c.count = mode == LinearMode::kSr ? 2 : 1;
  c.xs.assign(gp.size(), 0.0f);
  for (int q = 0; q < c.count; ++q) c.q[q].assign(gp.size(), 0);
  if (c.D == 0.0f) return c;  // SPEC 1: every gradient is exactly 0, no division
  const Key keys[2] = {fold_in(layer_key, 0), fold_in(layer_key, 1)};
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t i = t * N + n;
      const float x = gp[i] / c.D;
      c.xs[i] = x;
      for (int q = 0; q < c.count; ++q) {
        switch (mode) {
          case LinearMode::kRtne:
            c.q[q][i] = rne_code(x);
            break;
          case LinearMode::kSr:
            c.q[q][i] = floor_code(x, threshold_sr(keys[q], i));
            break;
          case LinearMode::kS3r:
            c.q[q][i] = floor_code(x, threshold_7bit(keys[0], t));
            break;
          case LinearMode::kS3rBcast:
            c.q[q][i] = floor_code(x, threshold_7bit(keys[0], t / p.S));
            break;
          default:
            break;
        }
      }
    }
  }
  return c;
}

}  // namespace s3r::nn::testing
