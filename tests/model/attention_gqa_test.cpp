// Grouped-query attention in the fused kernels (s3r/model/attention.hpp): against the two-pass
// attention of layers.hpp on repeated k, v (with the tolerance method of attention_test.cpp and
// a mutated kv-head map it must reject), bit for bit against multi-head attention on the
// repeated k, v, across tiers and thread counts, and its argument errors.
#include <gtest/gtest.h>

#include "attention_test_support.hpp"

namespace s3r::model {
namespace {

using namespace attention_testing;

// ---- grouped-query attention -------------------------------------------------------------------
// Query shape s (NH heads) with NKV kv heads: k, v, dk, dv are (T, NKV HD), and query head h
// reads kv head h / G, G = NH / NKV (Hugging Face's repeat_kv). The mutant maps h to h % NKV.

struct GqaCase {
  Shape s;  // the query side: NH heads of HD
  int64_t NKV;
  size_t kv_acts() const { return static_cast<size_t>(s.T() * NKV * s.HD); }
  int64_t kv_of(int64_t h, bool mutant = false) const {
    return mutant ? h % NKV : h / (s.NH / NKV);
  }
  std::string str() const { return s.str() + " NKV=" + std::to_string(NKV); }
};

// NH = 4 with NKV = 2 and 1, HD 8 and 16 (and 24, not a multiple of the vector), S not a multiple
// of 32; NH = 6 in groups of 2; NKV = NH (no groups) for the plumbing.
const std::vector<GqaCase>& gqa_sweep() {
  static const std::vector<GqaCase> cases = {
      {{2, 37, 4, 8}, 2},  {{2, 37, 4, 8}, 1},   {{1, 70, 4, 16}, 2}, {{1, 70, 4, 16}, 1},
      {{2, 33, 6, 24}, 3}, {{1, 100, 4, 64}, 2}, {{2, 37, 4, 8}, 4},
      {{1, 40, 8, 64}, 2}};  // q's rows 2 KB apart (copied), k's and v's 512 bytes
  return cases;
}

Inputs make_gqa_inputs(const GqaCase& g, uint32_t seed) {
  return {random_vec(g.s.acts(), seed), random_vec(g.kv_acts(), seed + 1),
          random_vec(g.kv_acts(), seed + 2), random_vec(g.s.acts(), seed + 3)};
}

// (T, NKV HD) -> (T, NH HD): query head h's columns get kv head kv_of(h)'s.
FVec repeat_kv(const GqaCase& g, const FVec& x, bool mutant = false) {
  const Shape& s = g.s;
  FVec out(s.acts());
  for (int64_t t = 0; t < s.T(); ++t) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const float* src = x.data() + (t * g.NKV + g.kv_of(h, mutant)) * s.HD;
      std::copy(src, src + s.HD, out.data() + (t * s.NH + h) * s.HD);
    }
  }
  return out;
}

// (T, NH HD) -> (T, NKV HD): kv head kv gets the sum of its query heads' columns, in head order
// from the first head's value: ((x_h0 + x_h1) + x_h2) + ... in V's arithmetic.
template <class V>
V sum_groups(const GqaCase& g, const V& x, bool mutant = false) {
  const Shape& s = g.s;
  V out(g.kv_acts());
  std::vector<bool> seen(static_cast<size_t>(s.T() * g.NKV), false);
  for (int64_t t = 0; t < s.T(); ++t) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const size_t kv = static_cast<size_t>(t * g.NKV + g.kv_of(h, mutant));
      for (int64_t d = 0; d < s.HD; ++d) {
        auto& o = out[kv * s.HD + d];
        const auto xi = x[static_cast<size_t>((t * s.NH + h) * s.HD + d)];
        o = seen[kv] ? o + xi : xi;
      }
      seen[kv] = true;
    }
  }
  return out;
}

// The bound of a group sum: the heads' bounds plus the rounding of the G - 1 f32 adds.
DVec group_bound(const GqaCase& g, const DVec& bound, const DVec& exact) {
  DVec b = sum_groups(g, bound), a(exact.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::fabs(exact[i]);
  const DVec sum_abs = sum_groups(g, a);
  const double adds = static_cast<double>(g.s.NH / g.NKV - 1);
  for (size_t i = 0; i < b.size(); ++i) b[i] += adds * kU * sum_abs[i];
  return b;
}

Result run_flash_gqa(const GqaCase& g, const Inputs& in, Isa isa) {
  ScopedIsa scoped(isa);
  const Shape& s = g.s;
  Result r{FVec(s.acts()), FVec(s.rows()), FVec(s.acts()), FVec(g.kv_acts()), FVec(g.kv_acts())};
  flash_attention_forward(r.out, r.lse, in.q, in.k, in.v, s.S, s.NH, g.NKV, s.HD);
  flash_attention_backward(r.dq, r.dk, r.dv, in.dout, r.out, in.q, in.k, in.v, r.lse, s.S, s.NH,
                           g.NKV, s.HD);
  return r;
}

// The two-pass attention of layers.hpp on k, v repeated over the groups (kv heads mapped by the
// mutant or not), its dk, dv summed over the groups in double.
struct TwoPass {
  DVec out, dq, dk, dv;
};
TwoPass two_pass_gqa(const GqaCase& g, const Inputs& in, bool mutant) {
  const Shape& s = g.s;
  const FVec k = repeat_kv(g, in.k, mutant), v = repeat_kv(g, in.v, mutant);
  FVec out(s.acts()), probs(s.rows() * s.S), dq(s.acts()), dk(s.acts()), dv(s.acts());
  attention_forward(out, probs, in.q, k, v, s.S, s.NH, s.HD);
  attention_backward(dq, dk, dv, in.dout, in.q, k, v, probs, s.S, s.NH, s.HD);
  return {to_double(out), to_double(dq), sum_groups(g, to_double(dk), mutant),
          sum_groups(g, to_double(dv), mutant)};
}

// The first-order bounds of out, dq, dk, dv for GQA inputs: error_bounds on the repeated k, v,
// and for dk, dv the heads' bounds summed over each group plus the group sum's own rounding.
struct GqaBounds {
  DVec out, dq, dk, dv;
};
GqaBounds gqa_bounds(const GqaCase& g, const Inputs& in) {
  const Shape& s = g.s;
  const DVec q = to_double(in.q), k = to_double(repeat_kv(g, in.k)), v = to_double(repeat_kv(g, in.v)),
             dout = to_double(in.dout);
  const RefForward ref = reference_forward(s, q, k, v);
  const RefGrads exact = reference_backward(s, q, k, v, dout, ref);
  const Bounds eb = error_bounds(s, q, k, v, dout, ref);
  return {eb.out, eb.dq, group_bound(g, eb.dk, exact.dk), group_bound(g, eb.dv, exact.dv)};
}

// The GQA kernels against the two-pass attention run on repeated k, v, with MatchesTwoPass-
// Attention's tolerance (twice the bound of error_bounds, on the repeated inputs) and, for dk, dv,
// the heads' bounds summed over each group plus the group sum's own rounding.
TEST(FlashAttention, GqaMatchesTwoPassAttention) {
  for (const GqaCase& g : gqa_sweep()) {
    const Shape& s = g.s;
    const Inputs in = make_gqa_inputs(g, 91);
    const GqaBounds eb = gqa_bounds(g, in);
    const TwoPass want = two_pass_gqa(g, in, false);
    const std::string where = "two-pass NKV=" + std::to_string(g.NKV);
    for (Isa isa : testing::runnable_isas()) {
      const Result r = run_flash_gqa(g, in, isa);
      const std::string at = where + " " + std::string(isa_name(isa));
      expect_within("out", s, r.out, want.out, eb.out, at, 2.0);
      expect_within("dq", s, r.dq, want.dq, eb.dq, at, 2.0);
      expect_within("dk", s, r.dk, want.dk, eb.dk, at, 2.0);
      expect_within("dv", s, r.dv, want.dv, eb.dv, at, 2.0);
    }
  }
}

// That tolerance rejects a kv head chosen as h % NKV instead of h / G (the mutant two-pass
// attention against the right one) by 10x or more.
TEST(FlashAttention, GqaBoundsCatchWrongKvHead) {
  for (const GqaCase& g : gqa_sweep()) {
    if (g.NKV == 1 || g.NKV == g.s.NH) continue;  // (the mutant maps like h / G)
    const Inputs in = make_gqa_inputs(g, 91);
    const GqaBounds eb = gqa_bounds(g, in);
    const TwoPass want = two_pass_gqa(g, in, false), bad = two_pass_gqa(g, in, true);
    EXPECT_GT(worst_ratio(bad.out, want.out, eb.out), 2.0 * 10.0) << "out " << g.str();
    EXPECT_GT(worst_ratio(bad.dq, want.dq, eb.dq), 2.0 * 10.0) << "dq " << g.str();
    EXPECT_GT(worst_ratio(bad.dk, want.dk, eb.dk), 2.0 * 10.0)
        << "dk " << g.str();
    EXPECT_GT(worst_ratio(bad.dv, want.dv, eb.dv), 2.0 * 10.0)
        << "dv " << g.str();
  }
}

// Exactly the documented arithmetic: out, lse and dq are the bits of multi-head attention on the
// repeated k, v, and dk, dv the f32 sums ((dk_h0 + dk_h1) + ...) of its heads' dk, dv.
TEST(FlashAttention, GqaIsMultiHeadOnRepeatedKvBitForBit) {
  for (Isa isa : testing::runnable_isas()) {
    for (const GqaCase& g : gqa_sweep()) {
      const Inputs in = make_gqa_inputs(g, 101);
      const Result got = run_flash_gqa(g, in, isa);
      const Inputs repeated{in.q, repeat_kv(g, in.k), repeat_kv(g, in.v), in.dout};
      const Result mha = run_flash(g.s, repeated, isa);
      const std::string ctx = std::string(isa_name(isa)) + " " + g.str();
      expect_same_bits("out", mha.out, got.out, ctx);
      expect_same_bits("lse", mha.lse, got.lse, ctx);
      expect_same_bits("dq", mha.dq, got.dq, ctx);
      expect_same_bits("dk", sum_groups(g, mha.dk), got.dk, ctx);
      expect_same_bits("dv", sum_groups(g, mha.dv), got.dv, ctx);
    }
  }
}

TEST(FlashAttention, GqaTiersAgreeBitForBit) {
  const auto tiers = testing::vector_isas();
  S3R_SKIP_WITHOUT_VECTOR_TIERS(tiers);
  for (const GqaCase& g : gqa_sweep()) {
    const Inputs in = make_gqa_inputs(g, 111);
    const Result want = run_flash_gqa(g, in, Isa::kReference);
    for (Isa isa : tiers) {
      const Result got = run_flash_gqa(g, in, isa);
      const std::string ctx = std::string(isa_name(isa)) + " vs reference, " + g.str();
      expect_same_result(want, got, ctx);
    }
  }
}

TEST(FlashAttention, GqaSameBitsForAnyThreadCount) {
  const GqaCase cases[] = {{{3, 70, 4, 16}, 2}, {{2, 37, 4, 8}, 1}, {{1, 100, 6, 24}, 3}};
  for (Isa isa : testing::runnable_isas()) {
    for (const GqaCase& g : cases) {
      const Inputs in = make_gqa_inputs(g, 121);
      Result one;
      {
        testing::ScopedThreads threads(1);
        one = run_flash_gqa(g, in, isa);
      }
      for (int n : {2, 3}) {
        testing::ScopedThreads threads(n);
        const Result r = run_flash_gqa(g, in, isa);
        const std::string ctx =
            std::string(isa_name(isa)) + " " + g.str() + " threads=" + std::to_string(n);
        expect_same_result(one, r, ctx);
      }
    }
  }
}

// The message of the s3r::Error that call() throws, or "(no error)".
template <class F>
std::string error_message(F&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A wrong size is an s3r::Error naming the function, the tensor, its size and the expected one.
TEST(FlashAttention, WrongSizesAreClearErrors) {
  const Shape s{2, 5, 2, 4};  // T = 10, C = 8
  const Inputs in = make_inputs(s, 81);
  FVec out(s.acts()), lse(s.rows()), dq(s.acts()), dk(s.acts()), dv(s.acts());
  auto forward = [&](std::span<float> l, const FVec& q, const FVec& k, int64_t heads) {
    return error_message([&] { flash_attention_forward(out, l, q, k, in.v, 5, heads, 2, 4); });
  };
  FVec short_lse(s.rows() - 1), short_k(s.acts() - 8), odd_q(s.acts() - 8);
  EXPECT_EQ(forward(short_lse, in.q, in.k, 2),
            "flash_attention_forward: lse has 19 elements, expected 20");
  EXPECT_EQ(forward(lse, in.q, short_k, 2),
            "flash_attention_forward: k has 72 elements, expected 80");
  EXPECT_EQ(forward(lse, odd_q, in.k, 2),
            "flash_attention_forward: q has 72 elements, not a multiple of S * C = 5 * 8 (whole "
            "examples of S tokens, C = heads * head_dim)");
  EXPECT_EQ(forward(lse, in.q, in.k, 0), "flash_attention_forward: heads must be >= 1, got 0");
  EXPECT_EQ(forward(lse, in.q, in.k, 2), "(no error)");
  auto backward = [&](std::span<float> dv_, std::span<const float> l, int64_t seq_len) {
    return error_message([&] {
      flash_attention_backward(dq, dk, dv_, in.dout, out, in.q, in.k, in.v, l, seq_len, 2, 2, 4);
    });
  };
  FVec short_dv(s.acts() - 1);
  EXPECT_EQ(backward(short_dv, lse, 5),
            "flash_attention_backward: dv has 79 elements, expected 80");
  EXPECT_EQ(backward(dv, short_lse, 5),
            "flash_attention_backward: lse has 19 elements, expected 20");
  EXPECT_EQ(backward(dv, lse, 0), "flash_attention_backward: seq_len must be >= 1, got 0");
  EXPECT_EQ(backward(dv, lse, 5), "(no error)");
}

// kv_heads < 1 or not dividing heads, and k, v, dk, dv of the multi-head size, are errors.
TEST(FlashAttention, GqaWrongKvHeadsAndSizesAreClearErrors) {
  const GqaCase g{{2, 5, 4, 4}, 2};  // T = 10, C = 16, Ckv = 8
  const Inputs in = make_gqa_inputs(g, 131);
  FVec out(g.s.acts()), lse(g.s.rows()), dq(g.s.acts()), dk(g.kv_acts()), dv(g.kv_acts());
  const FVec mha_k(g.s.acts());
  auto forward = [&](const FVec& k, int64_t kv_heads) {
    return error_message(
        [&] { flash_attention_forward(out, lse, in.q, k, in.v, 5, 4, kv_heads, 4); });
  };
  EXPECT_EQ(forward(in.k, 0), "flash_attention_forward: kv_heads must be >= 1, got 0");
  EXPECT_EQ(forward(in.k, 3),
            "flash_attention_forward: kv_heads = 3 does not divide heads = 4 (each kv head serves "
            "heads / kv_heads query heads)");
  EXPECT_EQ(forward(mha_k, 2), "flash_attention_forward: k has 160 elements, expected 80");
  EXPECT_EQ(forward(in.k, 2), "(no error)");
  auto backward = [&](std::span<float> dk_, int64_t kv_heads) {
    return error_message([&] {
      flash_attention_backward(dq, dk_, dv, in.dout, out, in.q, in.k, in.v, lse, 5, 4, kv_heads,
                               4);
    });
  };
  FVec mha_dk_out(g.s.acts());
  EXPECT_EQ(backward(dk, -1), "flash_attention_backward: kv_heads must be >= 1, got -1");
  EXPECT_EQ(backward(dk, 8),
            "flash_attention_backward: kv_heads = 8 does not divide heads = 4 (each kv head serves "
            "heads / kv_heads query heads)");
  EXPECT_EQ(backward(mha_dk_out, 2),
            "flash_attention_backward: dk has 160 elements, expected 80");
  EXPECT_EQ(backward(dk, 2), "(no error)");
}

}  // namespace
}  // namespace s3r::model
