// Fused causal attention: size checks, the split into (example, head[, query block]) tasks,
// grouped-query attention's sum of dk, dv over a group, and per-thread scratch; the arithmetic is
// in kernels/<tier>/attention_<tier>.cpp.
#include "s3r/model/attention.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "core/parallel_blocks.hpp"
#include "kernels/attention_kernels.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/isa.hpp"
#include "s3r/core/work.hpp"

namespace s3r::model {

namespace {

// The dimensions of one call: T = B*S tokens, NH query heads, NKV kv heads, G = NH / NKV.
struct Dims {
  int64_t T, B, S, NH, NKV, HD;
  int64_t W = 0;  // sliding window; 0: none
  int64_t C() const { return NH * HD; }    // q, out, dout, dq: (T, C)
  int64_t Ckv() const { return NKV * HD; }  // k, v, dk, dv: (T, Ckv)
  int64_t G() const { return NH / NKV; }
};

// Checks the dimensions and q's size.
Dims check_shape(const char* fn, size_t q_size, int64_t seq_len, int64_t heads, int64_t kv_heads,
                 int64_t head_dim, int64_t window) {
  if (window < 0) throw Error(std::string(fn) + ": window must be >= 0 (0: none), got " + std::to_string(window));
  for (auto [name, value] : {std::pair{"seq_len", seq_len},
                             {"heads", heads},
                             {"kv_heads", kv_heads},
                             {"head_dim", head_dim}}) {
    if (value < 1) {
      throw Error(std::string(fn) + ": " + name + " must be >= 1, got " + std::to_string(value));
    }
  }
  if (heads % kv_heads != 0) {
    std::ostringstream msg;
    msg << fn << ": kv_heads = " << kv_heads << " does not divide heads = " << heads
        << " (each kv head serves heads / kv_heads query heads)";
    throw Error(msg.str());
  }
  const int64_t C = heads * head_dim;
  if (q_size % static_cast<size_t>(C * seq_len) != 0) {
    std::ostringstream msg;
    msg << fn << ": q has " << q_size << " elements, not a multiple of S * C = " << seq_len << " * "
        << C << " (whole examples of S tokens, C = heads * head_dim)";
    throw Error(msg.str());
  }
  const int64_t T = static_cast<int64_t>(q_size) / C;
  return {T, T / seq_len, seq_len, heads, kv_heads, head_dim, window};
}

float* thread_scratch(int64_t floats) {
  thread_local AlignedVector<float> scratch;  // grown once per thread, reused by every call
  if (scratch.size() < static_cast<size_t>(floats)) scratch.resize(static_cast<size_t>(floats));
  return scratch.data();
}

// Query head h of example b and its kv head h / G; dk, dv written in place (ld_dkv = Ckv).
kernels::AttnHead head_of(const Dims& d, const float* q, const float* k, const float* v, int64_t b,
                          int64_t h) {
  const int64_t q_offset = b * d.S * d.C() + h * d.HD;
  const int64_t kv_offset = b * d.S * d.Ckv() + h / d.G() * d.HD;
  return {q + q_offset,
          k + kv_offset,
          v + kv_offset,
          d.S,
          d.HD,
          d.C(),
          d.Ckv(),
          d.Ckv(),
          static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.HD))),
          d.W};
}

// dst (rows, stride ld) += src (rows, HD contiguous), element by element in f32.
void add_rows(float* dst, int64_t ld, const float* src, int64_t rows, int64_t HD) {
  for (int64_t s = 0; s < rows; ++s) {
    for (int64_t c = 0; c < HD; ++c) dst[s * ld + c] += src[s * HD + c];
  }
}

// Unmasked (query, key) pairs of one head: sum over rows i of min(i + 1, W) (W = S without a
// window), the pairs s3r/core/work.hpp counts attention's multiply-adds by.
uint64_t unmasked_pairs(int64_t S, int64_t window) {
  const int64_t W = window > 0 ? std::min(window, S) : S;
  // rows 0 .. W-1 see i + 1 keys, rows W .. S-1 see W
  return static_cast<uint64_t>(W * (W + 1) / 2 + (S - W) * W);
}

// How many sets of the next call's rows (AttnNextRows: q, dout, out, k, v, dq, dk, dv, S x HD
// floats each, in that order) a backward call prefetches into its core's L2: as many as fit
// there beside the call's scratch, all of them where the L2 size is unknown. On an AMD Zen 3
// (512 KB per core) five at `small` (the AVX2 scratch 170 KB) and one at `wide`: one thread, 64
// heads from memory, alternating in one process, 1-3% less time per AVX2 backward head than
// with all eight at `small`, 0-2% at `wide`. An AMD Zen 4's 1 MB holds all eight at `small` in
// both vector tiers; at `wide` five (AVX2) or one (AVX-512, whose copies of k and v make 786 KB
// of scratch), not measured there. Intel's 2 MB server L2s hold all eight.
int next_call_sets(int64_t scratch_floats, int64_t S, int64_t HD) {
  const uint64_t l2 = work::cache_sizes().l2_core;
  const uint64_t scratch = 4 * static_cast<uint64_t>(scratch_floats);
  const uint64_t set = 4 * static_cast<uint64_t>(S * HD);
  if (l2 == 0) return kernels::AttnNextRows::kMaxSets;
  if (l2 <= scratch) return 0;
  const uint64_t fit = (l2 - scratch) / set;
  return static_cast<int>(std::min<uint64_t>(kernels::AttnNextRows::kMaxSets, fit));
}

}  // namespace

void flash_attention_forward(std::span<float> out, std::span<float> lse, std::span<const float> q,
                             std::span<const float> k, std::span<const float> v, int64_t seq_len,
                             int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t window) {
  const char* fn = "flash_attention_forward";
  const Dims d = check_shape(fn, q.size(), seq_len, heads, kv_heads, head_dim, window);
  expect_size(fn, "k", k.size(), d.T * d.Ckv());
  expect_size(fn, "v", v.size(), d.T * d.Ckv());
  expect_size(fn, "out", out.size(), d.T * d.C());
  expect_size(fn, "lse", lse.size(), d.B * d.NH * d.S);
  const kernels::AttentionKernels& kern = kernels::attention_kernels_for(active_isa());
  const uint64_t heads_total = static_cast<uint64_t>(d.B * d.NH);
  work::add_mac_f32(2 * heads_total * unmasked_pairs(d.S, window) * static_cast<uint64_t>(d.HD));
  work::add_floats(static_cast<uint64_t>(2 * d.T * d.C() + 2 * d.T * d.Ckv() + d.B * d.NH * d.S));  // q, out; k, v; lse
  const int64_t blocks = (d.S + kernels::kAttnBlock - 1) / kernels::kAttnBlock;
  const int64_t tasks = d.B * d.NH * blocks;
  // Query block `blk` of head (b, h) is one task; its arithmetic does not depend on which
  // thread runs it. With at least four heads per thread, a thread takes a head's blocks together
  // and in order, the heads handed out by parallel_items_claimed_ahead (a contiguous share per
  // thread, then the others' last heads to whichever thread is free; each thread knows its next
  // head), so that each block's kernel prefetches the rows its thread reads next: the next
  // block's, and a share of the next head's first block (kernels/attention_rows.hpp). With fewer, the blocks
  // are handed out one by one, dynamically (later blocks cost more: more keys).
  const int64_t threads = parallel_threads();
  const auto head = [&](int64_t bh) { return head_of(d, q.data(), k.data(), v.data(), bh / d.NH, bh % d.NH); };
  const auto run_block = [&](int64_t task, const kernels::AttnNextRows* next) {
    float* scratch = thread_scratch(kernels::attention_forward_scratch(d.S, d.HD));
    const int64_t blk = task % blocks, bh = task / blocks;
    kern.forward_block(out.data() + (bh / d.NH) * d.S * d.C() + (bh % d.NH) * d.HD,
                       lse.data() + bh * d.S, head(bh), blk, scratch, next);
  };
  if (static_cast<int64_t>(heads_total) < 4 * threads) {
    parallel_blocks_dynamic(tasks, 1, [&](int64_t t0, int64_t) { run_block(t0, nullptr); });
    return;
  }
  const auto heads_n = static_cast<int64_t>(heads_total);
  parallel_items_claimed_ahead(heads_n, [&](int64_t bh, int64_t bh_next) {
    kernels::AttnNextRows next;
    if (bh_next < heads_n) {
      const kernels::AttnHead n = head(bh_next);
      // Its first block only: each later block is prefetched by the block before it.
      next = {{n.q, n.k, n.v}, {n.ld, n.ld_kv, n.ld_kv}, 3, std::min(d.S, kernels::kAttnBlock), d.HD};
    }
    for (int64_t blk = 0; blk < blocks; ++blk) run_block(bh * blocks + blk, &next);
  });
}

void flash_attention_backward(std::span<float> dq, std::span<float> dk, std::span<float> dv,
                              std::span<const float> dout, std::span<const float> out,
                              std::span<const float> q, std::span<const float> k,
                              std::span<const float> v, std::span<const float> lse, int64_t seq_len,
                              int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t window) {
  const char* fn = "flash_attention_backward";
  const Dims d = check_shape(fn, q.size(), seq_len, heads, kv_heads, head_dim, window);
  expect_size(fn, "k", k.size(), d.T * d.Ckv());
  expect_size(fn, "v", v.size(), d.T * d.Ckv());
  expect_size(fn, "out", out.size(), d.T * d.C());
  expect_size(fn, "dout", dout.size(), d.T * d.C());
  expect_size(fn, "dq", dq.size(), d.T * d.C());
  expect_size(fn, "dk", dk.size(), d.T * d.Ckv());
  expect_size(fn, "dv", dv.size(), d.T * d.Ckv());
  expect_size(fn, "lse", lse.size(), d.B * d.NH * d.S);
  const kernels::AttentionKernels& kern = kernels::attention_kernels_for(active_isa());
  const int64_t S = d.S, HD = d.HD, G = d.G();
  work::add_mac_f32(5 * static_cast<uint64_t>(d.B * d.NH) * unmasked_pairs(S, window) * static_cast<uint64_t>(HD));
  // q, out, dout, dq; k, v, dk, dv; lse
  work::add_floats(static_cast<uint64_t>(4 * d.T * d.C() + 4 * d.T * d.Ckv() + d.B * d.NH * S));
  const int64_t kernel_scratch = kern.backward_scratch(S, HD);
  // One (example, kv head) per task: it owns its slices of dk, dv and those of dq of its G query
  // heads, and runs the heads in order: the first writes dk, dv in place, each later one into
  // (S, HD) scratch that is then added to them (dk = ((dk_h0 + dk_h1) + dk_h2) + ..., f32).
  // The tasks are handed out by parallel_items_claimed_ahead (a contiguous share per thread, then
  // the others' last tasks to whichever thread is free), which tells each task its thread's next,
  // so that every call can name the rows of its thread's next one for the kernel to prefetch
  // (kernels/attention_kernels.hpp: AttnNextRows).
  struct Call {
    kernels::AttnHead head;
    float *dq, *dk, *dv;   // dk, dv: in place for the group's first head, else dk_h, dv_h
    float *dk_kv, *dv_kv;  // the task's dk, dv
    const float *dout, *out, *lse;
  };
  // Call g of `task`: query head h = kv G + g of example b.
  const auto call = [&](int64_t task, int64_t g, float* dk_h, float* dv_h) {
    const int64_t b = task / d.NKV, kv = task % d.NKV, h = kv * G + g;
    const int64_t offset = b * S * d.C() + h * HD, kv_offset = b * S * d.Ckv() + kv * HD;
    Call r{head_of(d, q.data(), k.data(), v.data(), b, h), dq.data() + offset,
           g == 0 ? dk.data() + kv_offset : dk_h, g == 0 ? dv.data() + kv_offset : dv_h,
           dk.data() + kv_offset, dv.data() + kv_offset, dout.data() + offset,
           out.data() + offset, lse.data() + (b * d.NH + h) * S};
    if (g > 0) r.head.ld_dkv = HD;
    return r;
  };
  const int64_t tasks = d.B * d.NKV;
  const int64_t task_scratch = kernel_scratch + (G > 1 ? 2 * S * HD : 0);
  const int next_sets = next_call_sets(task_scratch, S, HD);
  parallel_items_claimed_ahead(tasks, [&](int64_t task, int64_t task_next) {
    float* scratch = thread_scratch(task_scratch);
    float* dk_h = scratch + kernel_scratch;  // (S, HD)
    float* dv_h = dk_h + S * HD;             // (S, HD)
    for (int64_t g = 0; g < G; ++g) {
      const Call now = call(task, g, dk_h, dv_h);
      kernels::AttnNextRows next;
      if (g + 1 < G || task_next < tasks) {
        const Call n = g + 1 < G ? call(task, g + 1, dk_h, dv_h) : call(task_next, 0, dk_h, dv_h);
        const kernels::AttnHead& nh = n.head;
        next = {{nh.q, n.dout, n.out, nh.k, nh.v, n.dq, n.dk, n.dv},
                {nh.ld, nh.ld, nh.ld, nh.ld_kv, nh.ld_kv, nh.ld, nh.ld_dkv, nh.ld_dkv},
                next_sets, S, HD};
      }
      kern.backward_head(now.dq, now.dk, now.dv, now.dout, now.out, now.lse, now.head, scratch,
                         &next);
      if (g == 0) continue;
      add_rows(now.dk_kv, d.Ckv(), dk_h, S, HD);
      add_rows(now.dv_kv, d.Ckv(), dv_h, S, HD);
    }
  });
}

}  // namespace s3r::model
