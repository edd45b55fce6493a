// Fused causal attention: size checks, the split into (example, head[, query block]) tasks and
// per-thread scratch; the arithmetic is in kernels/<tier>/attention_<tier>.cpp.
#include "s3r/model/attention.hpp"

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/attention_kernels.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/isa.hpp"

namespace s3r::model {

namespace {

// Checks the dimensions and q's size; returns T.
int64_t check_shape(const char* fn, size_t q_size, int64_t seq_len, int64_t heads,
                    int64_t head_dim) {
  for (auto [name, value] :
       {std::pair{"seq_len", seq_len}, {"heads", heads}, {"head_dim", head_dim}}) {
    if (value < 1) {
      throw Error(std::string(fn) + ": " + name + " must be >= 1, got " + std::to_string(value));
    }
  }
  const int64_t C = heads * head_dim;
  if (q_size % static_cast<size_t>(C * seq_len) != 0) {
    std::ostringstream msg;
    msg << fn << ": q has " << q_size << " elements, not a multiple of S * C = " << seq_len << " * "
        << C << " (whole examples of S tokens, C = heads * head_dim)";
    throw Error(msg.str());
  }
  return static_cast<int64_t>(q_size) / C;
}

float* thread_scratch(int64_t floats) {
  thread_local std::vector<float> scratch;  // grown once per thread, reused by every call
  if (scratch.size() < static_cast<size_t>(floats)) scratch.resize(static_cast<size_t>(floats));
  return scratch.data();
}

kernels::AttnHead head_of(const float* q, const float* k, const float* v, int64_t offset, int64_t S,
                          int64_t HD, int64_t C) {
  return {q + offset,
          k + offset,
          v + offset,
          S,
          HD,
          C,
          static_cast<float>(1.0 / std::sqrt(static_cast<double>(HD)))};
}

}  // namespace

void flash_attention_forward(std::span<float> out, std::span<float> lse, std::span<const float> q,
                             std::span<const float> k, std::span<const float> v, int64_t seq_len,
                             int64_t heads, int64_t head_dim) {
  const char* fn = "flash_attention_forward";
  const int64_t T = check_shape(fn, q.size(), seq_len, heads, head_dim);
  const int64_t S = seq_len, NH = heads, HD = head_dim, C = NH * HD, B = T / S;
  expect_size(fn, "k", k.size(), T * C);
  expect_size(fn, "v", v.size(), T * C);
  expect_size(fn, "out", out.size(), T * C);
  expect_size(fn, "lse", lse.size(), B * NH * S);
  const kernels::AttentionKernels& kern = kernels::attention_kernels_for(active_isa());
  const int64_t blocks = (S + kernels::kAttnBlock - 1) / kernels::kAttnBlock;
  const int64_t tasks = B * NH * blocks;
  // Query block `blk` of head (b, h) is one task; its arithmetic does not depend on which
  // thread runs it. Later blocks cost more (more keys): dynamic scheduling balances them.
#pragma omp parallel for schedule(dynamic)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t blk = task % blocks, bh = task / blocks, b = bh / NH, h = bh % NH;
    const int64_t offset = b * S * C + h * HD;
    float* scratch = thread_scratch(kernels::attention_forward_scratch(HD));
    kern.forward_block(out.data() + offset, lse.data() + bh * S,
                       head_of(q.data(), k.data(), v.data(), offset, S, HD, C), blk, scratch);
  }
}

void flash_attention_backward(std::span<float> dq, std::span<float> dk, std::span<float> dv,
                              std::span<const float> dout, std::span<const float> out,
                              std::span<const float> q, std::span<const float> k,
                              std::span<const float> v, std::span<const float> lse, int64_t seq_len,
                              int64_t heads, int64_t head_dim) {
  const char* fn = "flash_attention_backward";
  const int64_t T = check_shape(fn, q.size(), seq_len, heads, head_dim);
  const int64_t S = seq_len, NH = heads, HD = head_dim, C = NH * HD, B = T / S;
  expect_size(fn, "k", k.size(), T * C);
  expect_size(fn, "v", v.size(), T * C);
  expect_size(fn, "out", out.size(), T * C);
  expect_size(fn, "dout", dout.size(), T * C);
  expect_size(fn, "dq", dq.size(), T * C);
  expect_size(fn, "dk", dk.size(), T * C);
  expect_size(fn, "dv", dv.size(), T * C);
  expect_size(fn, "lse", lse.size(), B * NH * S);
  const kernels::AttentionKernels& kern = kernels::attention_kernels_for(active_isa());
  // One (example, head) per task: it owns its slices of dq, dk, dv and accumulates them in a
  // fixed order.
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const int64_t offset = b * S * C + h * HD;
    float* scratch = thread_scratch(kernels::attention_backward_scratch(S, HD));
    kern.backward_head(dq.data() + offset, dk.data() + offset, dv.data() + offset,
                       dout.data() + offset, out.data() + offset, lse.data() + bh * S,
                       head_of(q.data(), k.data(), v.data(), offset, S, HD, C), scratch);
  }
}

}  // namespace s3r::model
