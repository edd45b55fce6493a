// Scalar reference of the fused causal attention kernels: the executable spec of
// kernels/attention_kernels.hpp, the same blocks and the same f32 operations in the same order
// as the vectorized tiers (which must match it bit for bit).
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/attention_kernels.hpp"
#include "kernels/ref/numerics.hpp"

namespace s3r::kernels::ref {

namespace {

constexpr int64_t kB = kAttnBlock;

// s = (fma chain over d of a[d] * b[d], from 0) * scale.
float dot_scaled(const float* a, const float* b, int64_t n, float scale) {
  float s = 0.0f;
  for (int64_t d = 0; d < n; ++d) s = std::fma(a[d], b[d], s);
  return s * scale;
}

// Whether key j is masked for query row i: causally, or outside the sliding window.
bool masked(int64_t i, int64_t j, int64_t window) { return j > i || (window > 0 && i - j >= window); }

// The keys row r of a block pair accumulates over: all nj, or in the diagonal pair those up to
// the end of r's group of kAttnGroup rows.
int64_t key_limit(bool diagonal, int64_t r, int64_t nj) {
  return diagonal ? std::min(nj, (r / kAttnGroup + 1) * kAttnGroup) : nj;
}

// The first row key j of a block pair accumulates over: 0, or in the diagonal pair the first row
// of j's group.
int64_t row_start(bool diagonal, int64_t j) { return diagonal ? j / kAttnGroup * kAttnGroup : 0; }

// D_i = dout_i . out_i of rows i < rows (stride ld): eight double partial sums, one per d mod 8,
// then a fixed tree (the vector tiers' lanes and reduction).
void row_dots(float* d, const float* a, const float* b, int64_t rows, int64_t ld, int64_t hd) {
  for (int64_t i = 0; i < rows; ++i) {
    double p[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    for (int64_t c = 0; c < hd; ++c) p[c % 8] += static_cast<double>(a[i * ld + c]) * b[i * ld + c];
    const double t0 = p[0] + p[4], t1 = p[1] + p[5], t2 = p[2] + p[6], t3 = p[3] + p[7];
    d[i] = static_cast<float>((t0 + t2) + (t1 + t3));
  }
}

}  // namespace

float attention_lse(float m, float l) {
  return static_cast<float>(static_cast<double>(m) + std::log(static_cast<double>(l)));
}

void attention_forward_block(float* out, float* lse, const AttnHead& h, int64_t block,
                             float* scratch, const AttnNextRows* /*next: no prefetching here*/) {
  const int64_t S = h.seq_len, HD = h.head_dim, ld = h.ld, ldkv = h.ld_kv;
  const int64_t i0 = block * kB, ni = std::min(kB, S - i0);
  float* acc = scratch;      // (32, HD)
  float* p = acc + kB * HD;  // (32, 32): p[j * 32 + r]
  float* m = p + kB * kB;    // (32)
  float* l = m + kB;         // (32)
  float* alpha = l + kB;     // (32)
  std::fill(acc, acc + ni * HD, 0.0f);
  std::fill(m, m + ni, std::numeric_limits<float>::lowest());
  std::fill(l, l + ni, 0.0f);
  for (int64_t j0 = first_key_block(i0, h.window); j0 <= i0; j0 += kB) {
    const int64_t nj = std::min(kB, S - j0);
    for (int64_t r = 0; r < ni; ++r) {
      const float* qi = h.q + (i0 + r) * ld;
      float mb = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < nj; ++j) {
        if (masked(i0 + r, j0 + j, h.window)) continue;  // no score needed
        const float s = dot_scaled(h.k + (j0 + j) * ldkv, qi, HD, h.scale);
        p[j * kB + r] = s;
        mb = s > mb ? s : mb;
      }
      const float mnew = mb > m[r] ? mb : m[r];
      alpha[r] = exp_poly(m[r] - mnew);
      float lsum = 0.0f;
      for (int64_t j = 0; j < nj; ++j) {
        const float e = masked(i0 + r, j0 + j, h.window) ? 0.0f : exp_poly(p[j * kB + r] - mnew);
        p[j * kB + r] = e;
        lsum = lsum + e;
      }
      l[r] = l[r] * alpha[r] + lsum;
      m[r] = mnew;
    }
    for (int64_t r = 0; r < ni; ++r) {
      const int64_t jn = key_limit(j0 == i0, r, nj);
      float* a = acc + r * HD;
      for (int64_t d = 0; d < HD; ++d) {
        float x = a[d] * alpha[r];
        for (int64_t j = 0; j < jn; ++j) x = std::fma(p[j * kB + r], h.v[(j0 + j) * ldkv + d], x);
        a[d] = x;
      }
    }
  }
  for (int64_t r = 0; r < ni; ++r) {
    for (int64_t d = 0; d < HD; ++d) out[(i0 + r) * ld + d] = acc[r * HD + d] / l[r];
    lse[i0 + r] = attention_lse(m[r], l[r]);
  }
}

void attention_backward_head(float* dq, float* dk, float* dv, const float* dout, const float* out,
                             const float* lse, const AttnHead& h, float* scratch,
                             const AttnNextRows* /*next: no prefetching here*/) {
  const int64_t S = h.seq_len, HD = h.head_dim, ld = h.ld, ldkv = h.ld_kv, lddkv = h.ld_dkv;
  float* D = scratch;       // (S)
  float* p = D + S;         // (32, 32): p[j * 32 + r]
  float* ds = p + kB * kB;  // (32, 32)
  for (int64_t i = 0; i < S; ++i) {
    std::fill(dq + i * ld, dq + i * ld + HD, 0.0f);
    std::fill(dk + i * lddkv, dk + i * lddkv + HD, 0.0f);
    std::fill(dv + i * lddkv, dv + i * lddkv + HD, 0.0f);
  }
  row_dots(D, dout, out, S, ld, HD);
  for (int64_t j0 = 0; j0 < S; j0 += kB) {
    const int64_t nj = std::min(kB, S - j0);
    for (int64_t i0 = j0; i0 < S && first_key_block(i0, h.window) <= j0; i0 += kB) {
      const int64_t ni = std::min(kB, S - i0);
      const bool diagonal = i0 == j0;
      for (int64_t j = 0; j < nj; ++j) {
        for (int64_t r = 0; r < ni; ++r) {
          const int64_t i = i0 + r;
          if (masked(i, j0 + j, h.window)) {
            p[j * kB + r] = ds[j * kB + r] = 0.0f;
            continue;
          }
          const float s = dot_scaled(h.k + (j0 + j) * ldkv, h.q + i * ld, HD, h.scale);
          const float dp = dot_scaled(h.v + (j0 + j) * ldkv, dout + i * ld, HD, 1.0f);
          const float e = exp_poly(s - lse[i]);
          p[j * kB + r] = e;
          ds[j * kB + r] = (e * (dp - D[i])) * h.scale;
        }
      }
      for (int64_t j = 0; j < nj; ++j) {  // dv_j += p_ij dout_i, dk_j += ds_ij q_i (i in order)
        float* dvj = dv + (j0 + j) * lddkv;
        float* dkj = dk + (j0 + j) * lddkv;
        const int64_t r0 = row_start(diagonal, j);
        for (int64_t d = 0; d < HD; ++d) {
          float xv = dvj[d], xk = dkj[d];
          for (int64_t r = r0; r < ni; ++r) {
            xv = std::fma(p[j * kB + r], dout[(i0 + r) * ld + d], xv);
            xk = std::fma(ds[j * kB + r], h.q[(i0 + r) * ld + d], xk);
          }
          dvj[d] = xv;
          dkj[d] = xk;
        }
      }
      for (int64_t r = 0; r < ni; ++r) {  // dq_i += ds_ij k_j (j in order)
        const int64_t jn = key_limit(diagonal, r, nj);
        float* dqi = dq + (i0 + r) * ld;
        for (int64_t d = 0; d < HD; ++d) {
          float x = dqi[d];
          for (int64_t j = 0; j < jn; ++j) {
            x = std::fma(ds[j * kB + r], h.k[(j0 + j) * ldkv + d], x);
          }
          dqi[d] = x;
        }
      }
    }
  }
}

}  // namespace s3r::kernels::ref
